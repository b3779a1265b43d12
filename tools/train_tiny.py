"""Train the tiny tri-mode model on offline text (resumable, reproducible), and export the shipped checkpoint.

    python -m tools.train_tiny --workdir train_runs/tiny --steps 1600      # resumes if state.pt exists
    python -m tools.train_tiny --workdir train_runs/tiny --export backend/model/checkpoints/tiny

Each step's batch is a pure function of (seed, step), so a resumed run sees exactly the batches an
uninterrupted run would. Per-objective losses go to <workdir>/curves.jsonl.
"""
from __future__ import annotations

import argparse

from specscope.backend.model.train import export, train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="train_runs/tiny")
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--task-fraction", type=float, default=0.8, help="share of batch rows that are chat tasks")
    p.add_argument("--no-pad-tasks", action="store_true", help="pack tasks back to back (the first phase's recipe)")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast forward (fp32 master weights)")
    p.add_argument("--init-from", help="warm-start a new workdir from a checkpoint folder (weights only)")
    p.add_argument("--export", help="write the shipped checkpoint to this folder and exit")
    args = p.parse_args()
    export(args) if args.export else train(args)


if __name__ == "__main__":
    main()
