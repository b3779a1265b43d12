"""Measuring the machine's cost curve (cost_curve.py) through a runtime: forwards of k new causal rows after a
prompt's prefix, timed, and the curve kept per machine in the cache folder. It works on the runtime and the prompt's
ids, not on the engine, so the engine can ask for its curve at start without the two importing each other."""
from __future__ import annotations

import hashlib
import json
import time

import torch

from specscope.backend.engine.cost_curve import ROWS, CostCurve
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.model.source import cache_dir
from specscope.backend.tracing import new_run_id

COST_PROMPT = "Write a short note about the weather today."
"""The prompt after whose prefix the engine measures its curve (through its chat template: Engine.encode_prompt)."""
METHOD = 2
"""The way curves are measured (`fastest_forwards`); part of the cache key, so a change of way measures anew."""


def fastest_forwards(rt: Runtime, prompt_ids: list[int], rows: tuple[int, ...], repeats: int) -> dict[int, float]:
    """The fastest of `repeats` forwards of k new causal rows after the prompt's prefill, for each k in `rows`: the
    counts take turns (a pass over them all, `repeats` times, after a warm-up pass), so a spell of other work on the
    machine falls on every count alike, and the fastest forward is the cost (other work only adds to it)."""
    req = Request(rid=new_run_id(), prompt_ids=list(prompt_ids), mode="ar", params={"max_new_tokens": 1},
                  eos_id=rt.eos_id)
    times: dict[int, list[float]] = {k: [] for k in rows}
    try:
        rt.prefill(req)
        start = req.cached
        for _ in range(repeats + 1):    # the first pass warms up (RoPE table, allocator)
            for k in rows:
                positions = list(range(start, start + k))
                slots = rt.alloc(req, positions)
                t0 = time.perf_counter()
                rt.forward([req], torch.full((1, k), int(req.prompt_ids[-1])), [start], "causal", kind="verify",
                           write=[slots])
                times[k].append((time.perf_counter() - t0) * 1000)
                rt.release(req, slots, positions, "bench")
    finally:
        rt.release_all(req, "bench")
    return {k: min(ms[1:]) for k, ms in times.items()}


def measure(rt: Runtime, prompt_ids: list[int], repeats: int = 5, rows: tuple[int, ...] = ROWS) -> CostCurve:
    """This runtime's curve, measured now after `prompt_ids`, its ms to 0.1 µs as its JSON has them, so an engine
    given the JSON prices rows exactly as this one does (its forward log is left as it was)."""
    log = list(rt.log)
    curve = CostCurve({k: round(ms, 4) for k, ms in fastest_forwards(rt, prompt_ids, rows, repeats).items()})
    rt.log.clear()
    rt.log.extend(log)
    return curve


def machine_key(rt: Runtime) -> str:
    """What the curve depends on: the CPU (model name and flags), the threads, the device, the weights, the
    matmul precision, this code's version and the way it is measured."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        lines = [line for line in open("/proc/cpuinfo").read().splitlines()
                 if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    try:
        ours = version("specscope")
    except PackageNotFoundError:
        ours = "source"
    parts = [*lines, str(torch.get_num_threads()), str(rt.device), rt.loaded.weights_hash, rt.matmul, ours,
             f"method {METHOD}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def cached(rt: Runtime, prompt_ids: list[int]) -> CostCurve:
    """The curve this machine measured for this model and precision before (in the cache folder), else one
    measured now after `prompt_ids` (COST_PROMPT's, as the engine passes them) and kept there: runs on one machine
    then price rows alike, engine after engine."""
    path = cache_dir() / "cost_curves" / f"{machine_key(rt)}.json"
    try:
        return CostCurve.from_json(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass
    curve = measure(rt, prompt_ids)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{id(curve)}.tmp")
        partial.write_text(json.dumps(curve.to_json()))
        partial.replace(path)
    except OSError:
        pass        # a read-only cache: the curve serves this engine alone
    return curve
