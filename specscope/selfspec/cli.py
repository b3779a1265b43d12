"""The options every self-speculation training command takes (tools/train_selfspec.py, tools/train_sampler.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch


def run_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the run's workdir, its training and held-out answers, the model, the sequence cap, the seed,
    the export folder and the device."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--heldout", type=Path, required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--export", type=Path, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p
