"""How far SpecFold's folding drifts from spiffy as δ grows, under either FFN gate.

    python -m tools.delta_sweep [--per-kind 4] [--deltas 0,0.05,0.1,0.2,0.4] [--out docs/bench/delta_sweep.json]

On held-out tasks (greedy), for each gate (`paper`: the paper's one gate per layer input; `strict`: a second
gate on the FFN input) and δ: the share of prompts whose tokens equal spiffy's, the mean index of the first
differing token, exact-match accuracy on the tasks' answers (spiffy's beside it), and the mean fold ratio.
Only `strict` at δ = 0 is lossless by construction.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from specscope.backend.engine.engine import Engine
from specscope.backend.train.tasks import Task, task_set

GEN = {"max_new_tokens": 48}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def sweep(engine: Engine, tasks: list[Task], deltas: list[float]) -> dict[str, Any]:
    spiffy = [engine.generate(t.prompt, "spiffy", GEN) for t in tasks]
    rows = []
    for gate in ("paper", "strict"):
        for delta in deltas:
            runs = [engine.generate(t.prompt, "specfold", {**GEN, "delta": delta, "ffn_gate": gate}) for t in tasks]
            diffs = [first_difference(r.output_ids, s.output_ids) for r, s in zip(runs, spiffy, strict=True)]
            folds = [r.metrics["fold_ratio"] for r in runs if r.metrics["fold_ratio"] is not None]
            differing = [d for d in diffs if d is not None]
            rows.append({"ffn_gate": gate, "delta": delta,
                         "same_as_spiffy": sum(d is None for d in diffs) / len(tasks),
                         "first_difference_mean": sum(differing) / len(differing) if differing else None,
                         "exact_match": sum(r.text.strip() == t.answer for r, t in zip(runs, tasks, strict=True))
                         / len(tasks),
                         "fold_ratio": sum(folds) / len(folds) if folds else None})
    spiffy_em = sum(s.text.strip() == t.answer for s, t in zip(spiffy, tasks, strict=True)) / len(tasks)
    return {"prompts": len(tasks), "max_new_tokens": GEN["max_new_tokens"], "spiffy_exact_match": spiffy_em,
            "rows": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-kind", type=int, default=4)
    ap.add_argument("--deltas", default="0,0.05,0.1,0.2,0.4")
    ap.add_argument("--out", type=Path, default=Path("docs/bench/delta_sweep.json"))
    args = ap.parse_args(argv)
    result = sweep(Engine(), task_set("heldout", args.per_kind), [float(d) for d in args.deltas.split(",")])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for row in result["rows"]:
        print(row)


if __name__ == "__main__":
    main()
