"""Two sets of `specscope bench` reports side by side, per mode: whether every run of both sets decoded the same
tokens, and the median tokens/s of each set with their ratio (a change's before and after, e.g.
`specscope bench-diff --before b1 b2 b3 --after a1 a2 a3`, each a bench --out folder)."""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def load(folders: list[Path]) -> list[dict[str, Any]]:
    return [json.loads((folder / "bench.json").read_text()) for folder in folders]


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per mode both sets ran: same tokens across every run, median tok/s before and after, their ratio."""
    modes = [m for m in before[0]["modes"] if all(m in r["modes"] for r in before + after)]
    rows = []
    for mode in modes:
        outputs = [r["modes"][mode]["outputs"] for r in before + after]
        speed = [statistics.median(r["modes"][mode]["tok_per_s"] for r in runs) for runs in (before, after)]
        rows.append({"mode": mode, "same_tokens": all(o == outputs[0] for o in outputs),
                     "before_tok_per_s": speed[0], "after_tok_per_s": speed[1], "ratio": speed[1] / speed[0]})
    return rows


def markdown(rows: list[dict[str, Any]], before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    commits = [r["meta"]["commit"] for r in (before[0], after[0])]
    lines = [f"| mode | same tokens | tok/s at {commits[0]} | tok/s at {commits[1]} | after / before |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {'yes' if r['same_tokens'] else 'NO'} | {r['before_tok_per_s']:.0f} | "
              f"{r['after_tok_per_s']:.0f} | {r['ratio']:.2f}× |" for r in rows]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", type=Path, nargs="+", required=True, help="bench --out folders")
    parser.add_argument("--after", type=Path, nargs="+", required=True, help="bench --out folders")


def run(args: argparse.Namespace) -> int:
    before, after = load(args.before), load(args.after)
    print(markdown(compare(before, after), before, after))
    return 0
