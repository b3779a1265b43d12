"""Benchmark every decoding mode on one fixed held-out prompt set; every ratio comes from this one run.

    specscope bench [--modes ar,block_diffusion,linear_spec] [--per-kind 6] [--repeats 3] [--out bench_results]

Per mode: NFE, TPF, tokens/s, accepted-length histogram, exact-match accuracy on the synthetic tasks,
token equality with the mode's lossless reference (`ar` by default), the speed-up over `ar` and the
tracing-on / tracing-off wall-time ratio. Wall times are medians over repeats, tracing on and off
interleaved. Writes bench.json and bench.md to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tqdm import tqdm

from backend.engine.engine import Engine, RunResult
from backend.engine.modes import get_mode, mode_names
from backend.model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from backend.model.tasks import Task, task_set
from backend.tracing import NULL_TRACER, RecordingTracer

STANDARD = {"nfe", "tokens", "tpf", "wall_ms", "tok_per_s", "accept_len_mean", "accept_hist", "fold_ratio",
            "kv_peak", "kv_leaked", "rounds"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default="", help="comma-separated modes (default: all registered)")
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    p.add_argument("--per-kind", type=int, default=6, help="held-out prompts per task kind")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--out", default="bench_results")


def timed_pass(engine: Engine, mode: str, tasks: list[Task], params: dict,
               tracing: bool) -> tuple[float, list[RunResult], list[RecordingTracer]]:
    tracers = [RecordingTracer() for _ in tasks] if tracing else []
    t0 = time.perf_counter()
    results = [engine.generate(t.prompt, mode, params, tracer=tracers[i] if tracing else NULL_TRACER)
               for i, t in enumerate(tasks)]
    return time.perf_counter() - t0, results, tracers


def verify_ms(tracers: list[RecordingTracer]) -> float | None:
    """Mean wall time of one batched `verify` forward (multi-branch modes), from the traced pass."""
    ms = [p["ms"] for t in tracers for e in t.events if e["type"] == "round"
          for p in e["phases"] if p["kind"] == "verify"]
    return sum(ms) / len(ms) if ms else None


def bench_mode(engine: Engine, mode: str, tasks: list[Task], params: dict, repeats: int) -> dict[str, Any]:
    walls: dict[bool, list[float]] = {False: [], True: []}
    outputs: dict[bool, list[RunResult]] = {}
    tracers: list[RecordingTracer] = []
    for rep in range(repeats):
        for tracing in ((False, True) if rep % 2 == 0 else (True, False)):
            wall, outputs[tracing], traced = timed_pass(engine, mode, tasks, params, tracing)
            walls[tracing].append(wall)
            tracers = traced or tracers
    runs = outputs[False]
    nfe = sum(r.metrics["nfe"] for r in runs)
    tokens = sum(r.metrics["tokens"] for r in runs)
    hist: Counter[str] = Counter()
    for r in runs:
        hist.update(r.metrics["accept_hist"])
    rounds = sum(hist.values())
    correct: Counter[str] = Counter()
    for t, r in zip(tasks, runs, strict=True):
        correct[t.kind] += r.text.strip() == t.answer
    kinds = sorted({t.kind for t in tasks})
    per_kind = {k: correct[k] / sum(t.kind == k for t in tasks) for k in kinds}
    wall_off, wall_on = statistics.median(walls[False]), statistics.median(walls[True])
    folds = [r.metrics["fold_ratio"] for r in runs if r.metrics.get("fold_ratio") is not None]
    return {
        "mode": mode, "nfe": nfe, "tokens": tokens, "tpf": tokens / nfe if nfe else None,
        "wall_s": wall_off, "tok_per_s": tokens / wall_off,
        "accept_len_mean": sum(int(k) * v for k, v in hist.items()) / rounds if rounds else None,
        "accept_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "accuracy": {**per_kind, "average": sum(per_kind.values()) / len(per_kind)},
        "tracing_ratio": wall_on / wall_off,
        "tracing_identical": [r.output_ids for r in outputs[True]] == [r.output_ids for r in runs],
        "kv_leaked": sum(r.metrics["kv_leaked"] for r in runs),
        "kv_peak": max(r.metrics["kv_peak"] for r in runs),
        "mode_metrics": mode_metrics(runs),
        "fold_ratio": sum(folds) / len(folds) if folds else None,
        "verify_forward_ms": verify_ms(tracers),
        "outputs": [r.output_ids for r in runs],
    }


def mode_metrics(runs: list[RunResult]) -> dict[str, float]:
    """Mode-specific metrics over the prompt set: counts are summed, ratios averaged over runs."""
    values: dict[str, list] = {}
    for r in runs:
        for k, v in r.metrics.items():
            if k not in STANDARD and isinstance(v, (int, float)) and not isinstance(v, bool):
                values.setdefault(k, []).append(v)
    return {k: sum(vs) if all(isinstance(v, int) for v in vs) else sum(vs) / len(vs) for k, vs in values.items()}


def compare_to_references(rows: dict[str, dict[str, Any]]) -> None:
    """Fill same_as_reference (fraction of prompts with identical tokens) and speedup_vs_ar."""
    for mode, row in rows.items():
        ref = get_mode(mode).lossless_vs or "ar"
        row["reference"] = ref
        if ref in rows:
            pairs = zip(row["outputs"], rows[ref]["outputs"], strict=True)
            row["same_as_reference"] = sum(a == b for a, b in pairs) / len(row["outputs"])
        if "ar" in rows:
            row["speedup_vs_ar"] = rows["ar"]["wall_s"] / row["wall_s"]


def markdown(rows: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    head = ("| mode | NFE | TPF | tok/s | speed-up vs ar | mean accepted | accuracy | same as ref | "
            "tracing on/off | KV peak |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows.values():
        same = r.get("same_as_reference")
        same_txt = "—" if same is None else f"{100 * same:.0f} % vs {r['reference']}"
        lines.append(
            f"| {r['mode']} | {r['nfe']} | {r['tpf']:.2f} | {r['tok_per_s']:.0f} | "
            f"{r.get('speedup_vs_ar', float('nan')):.2f}× | {r['accept_len_mean'] or 0:.2f} | "
            f"{100 * r['accuracy']['average']:.0f} % | "
            f"{same_txt} | "
            f"{r['tracing_ratio']:.2f} | {r['kv_peak']} |")
    return (f"Prompts: {meta['prompts']} held-out tasks, max_new_tokens {meta['max_new_tokens']}, "
            f"greedy, {meta['repeats']} repeats (median wall), model {meta['model']}.\n\n" + head
            + "\n".join(lines) + "\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    modes = [m for m in args.modes.split(",") if m] or mode_names()
    engine = Engine(load_checkpoint(args.checkpoint), num_slots=8192)
    tasks = task_set("heldout", args.per_kind)
    params = {"max_new_tokens": args.max_new_tokens}
    rows = {m: bench_mode(engine, m, tasks, params, args.repeats) for m in tqdm(modes, desc="modes")}
    compare_to_references(rows)
    meta = {"prompts": len(tasks), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "model": engine.model_name}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"meta": meta, "modes": rows}, indent=1))
    (out / "bench.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    run(p.parse_args())


if __name__ == "__main__":
    main()
