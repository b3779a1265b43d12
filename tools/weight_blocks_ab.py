"""The fused step's GGUF block layout against float32 weights on the real default model, in one process: the
verify-rows table (median ms of a causal forward of k rows, backend/verify_rows.py) and greedy `ar` / `isd`
tokens with the blocks and then with weight_blocks.PACKERS emptied (float32 copies only).

    python -m tools.weight_blocks_ab --threads 2
"""
from __future__ import annotations

import argparse
import time

import torch

from specscope.backend.engine.engine import Engine
from specscope.backend.forward import weight_blocks
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.model.source import resolve
from specscope.backend.verify_rows import verify_rows

PROMPT = "What is the capital of France? Answer in one sentence, please, and explain why."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    source = resolve(None)
    loaded = load_checkpoint(source.folder, adapter=source.adapter)
    tokens = {}
    for label in ("blocks", "float32"):
        if label == "float32":
            weight_blocks.PACKERS.clear()
        t0 = time.perf_counter()
        engine = Engine(loaded, num_slots=4096)
        step = engine.rt.backend
        print(f"{label}: built in {time.perf_counter() - t0:.1f} s, projections {getattr(step, 'format', '-')}, "
              f"head {getattr(step, 'head_format', '-')}", flush=True)
        ms = verify_rows(engine, PROMPT, repeats=args.repeats)["ms"]
        print("  ms by rows: " + ", ".join(f"{k}: {v:.1f}" for k, v in ms.items()), flush=True)
        tokens[label] = [engine.generate(PROMPT, mode, {"max_new_tokens": 48}).output_ids for mode in ("ar", "isd")]
    print("same tokens in both layouts:", tokens["blocks"] == tokens["float32"])


if __name__ == "__main__":
    main()
