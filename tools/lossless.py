"""The lossless claims on the real model, on held-out prompts: every mode that declares one (`lossless_vs`, at its
`lossless_params`, greedy) against its reference, token for token, with the drafter's tokens per round beside it,
so an equality is never the trivial one of a drafter that is always rejected. Each mode runs its prompts as one
batch.

    python -m tools.lossless --prompts 36 --max-new-tokens 32 --modes isd,quadratic,linear_spec \
        --out docs/bench/lossless.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from specscope.backend.bench import provenance
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import get_mode, mode_names
from specscope.backend.model.chat_prompts import prompt_set
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.model.source import resolve


def outputs(engine: Engine, prompts: list[list[dict[str, str]]], mode: str, params: dict[str, Any]) -> list[Any]:
    reqs = [engine.new_request(p, mode, params) for p in prompts]
    return engine.run(reqs)


def check(engine: Engine, prompts: list[list[dict[str, str]]], max_new: int, modes: list[str]) -> list[dict[str, Any]]:
    """One row per mode with a lossless claim: identical outputs, and its TPF (tokens per forward: above 1 only
    when drafts are accepted)."""
    rows, cache = [], {}
    for name in modes:
        mode = get_mode(name)
        if not mode.lossless_vs:
            continue
        params = {"max_new_tokens": max_new, **(mode.lossless_params or {})}
        t0 = time.perf_counter()
        got = outputs(engine, prompts, name, params)
        seconds = time.perf_counter() - t0
        ref = mode.lossless_vs
        if ref not in cache:
            cache[ref] = [r.output_ids for r in outputs(engine, prompts, ref, {"max_new_tokens": max_new})]
        same = sum(a.output_ids == b for a, b in zip(got, cache[ref], strict=True))
        tokens, nfe = sum(r.metrics["tokens"] for r in got), sum(r.metrics["nfe"] for r in got)
        rows.append({"mode": name, "reference": ref, "params": params, "prompts": len(prompts), "identical": same,
                     "tpf": round(tokens / max(nfe, 1), 3), "seconds": round(seconds, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=36)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=7, help="which held-out prompts (prompt_set's seed)")
    p.add_argument("--modes", default=None, help="comma-separated (default: every mode with a lossless claim)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    source = resolve(args.model)   # with its shipped adapter, as `specscope bench` and the server load it
    loaded = load_checkpoint(source.folder, adapter=source.adapter, name=source.name)
    engine = Engine(loaded, num_slots=args.prompts * 4 * (args.max_new_tokens + 256))
    prompts = [r["messages"] for r in prompt_set(args.prompts, args.seed, held_out=True)]
    rows = check(engine, prompts, args.max_new_tokens, args.modes.split(",") if args.modes else mode_names())
    report = {"model": loaded.name, "adapter_scope": loaded.adapter_scope, **provenance(),
              "threads": torch.get_num_threads(), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    failed = [r["mode"] for r in rows if r["identical"] != r["prompts"]]
    raise SystemExit(f"not identical: {failed}" if failed else 0)


if __name__ == "__main__":
    main()
