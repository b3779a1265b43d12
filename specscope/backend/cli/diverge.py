"""`specscope diverge RUN_A RUN_B`: why two stored runs of one prompt differ (backend/engine/diverge.py), their rows
re-scored on an engine of the runs' model (run a's, with its shipped adapter, unless --model / --adapter say)."""
from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Any

from specscope.backend.cli.common import CLIError, fmt, table
from specscope.backend.cli.options import store_options

PARENTS = (store_options,)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--model", help="the model that re-scores (default: run a's, named as it records it)")
    p.add_argument("--adapter", help="PEFT adapter folder (default: the model's shipped one); 'none' runs without")
    p.add_argument("--top", type=int, default=5, help="logits shown per side (default 5)")
    p.add_argument("--slots", type=int, default=4096, help="KV pool size in slots (default 4096)")
    p.add_argument("--json", action="store_true", help="print the report as /api/diverge answers it")


def run(args: argparse.Namespace) -> int:
    from specscope.backend.engine.diverge import Served, diverge, rescore
    from specscope.backend.server.diverge import RunNotReady, stored_run
    from specscope.backend.store import Store
    with Store(args.db) as store:
        try:
            a, b = stored_run(store, args.run_a), stored_run(store, args.run_b)
        except RunNotReady as e:
            raise CLIError(str(e)) from None
    engine = build(args, a.model, a.matmul)
    loaded = engine.rt.loaded
    report = diverge(a, b, Served(loaded.name, loaded.weights_hash), partial(rescore, engine), max(args.top, 2))
    print(json.dumps(report, indent=2) if args.json else render(report, loaded.tokenizer))
    return 0


def build(args: argparse.Namespace, model: str, matmul: str) -> Any:
    """An engine of `args.model`, else of the run's model (its name before '+adapter'), computing in the run's
    precision where it can (the other precisions are built when a probe asks for them)."""
    from specscope.backend.cli.options import load_from_args
    from specscope.backend.engine.cost_curve import FLAT
    from specscope.backend.engine.engine import Engine
    from specscope.backend.forward.fused_step import MatmulUnavailable
    from specscope.backend.model.config import CheckpointError
    options = argparse.Namespace(model=args.model or model.partition("+")[0], adapter=args.adapter,
                                 adapter_scope=None, device="cpu", dtype=None, slots=args.slots)
    try:
        loaded, slots = load_from_args(options)
        try:
            return Engine(loaded, num_slots=slots, matmul=matmul, cost_curve=FLAT)
        except MatmulUnavailable:
            return Engine(loaded, num_slots=slots, cost_curve=FLAT)
    except CheckpointError as e:
        raise CLIError(str(e)) from None


def render(report: dict[str, Any], tokenizer: Any) -> str:
    """The report as text: the position, both sides' top logits, the attribution and the cause."""
    if report["position"] is None:
        return report["cause"]
    def piece(i: int | None) -> str:
        return "-" if i is None else f"{i} {tokenizer.decode([i])!r}"

    lines = [f"first difference at output token {report['position']}"]
    for name in ("a", "b"):
        side = report[name]
        lines.append(f"\n{name}: {side['run_id']} · {side['mode']} · {side['matmul']} · token {piece(side['token'])}"
                     f" · {side['path'] or 'not re-scored'} · margin {fmt(side['margin'], '.4g')}"
                     f" · resolution {fmt(side['resolution'], '.3g')}")
        lines.append(table(["token", "logit"], [[piece(t["id"]), f"{t['logit']:.4f}"] for t in side["top"]]))
    if report["attribution"]:
        rows = [[w["factor"], w["a"], w["b"], w["probe"], piece(w["argmax"]), "yes" if w["to_other"] else "no"]
                for w in report["attribution"]]
        lines.append("\n" + table(["factor", "a", "b", "re-scored", "argmax", "picks the other's"], rows))
    return "\n".join([*lines, "", f"cause: {report['cause']}"])
