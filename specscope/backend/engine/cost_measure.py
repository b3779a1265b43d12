"""Measuring the machine's cost curve (cost_curve.py) through a runtime: forwards of k new causal rows after a
prompt's prefix, timed, with the provenance of the measurement, and the curve kept per machine in the cache folder.

Measuring is a step of its own that a command takes (`machine_curve`, logged), never a side effect of building an
engine. A curve measured while the machine was busy (its load average above BUSY_LOAD of its CPUs, before or after)
or whose timings were unstable (SPREAD) serves the process that measured it and is not kept as the machine's: a
curve measured under other work would price rows for good by a spell of load. It works on the runtime and the
prompt's ids, not on the engine, so the engine need not import it."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import torch

from specscope.backend.engine.cost_curve import ROWS, CostCurve, Provenance
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.model.source import cache_dir
from specscope.backend.tracing import new_run_id

log = logging.getLogger(__name__)

COST_PROMPT = "Write a short note about the weather today."
"""The prompt after whose prefix the engine's curve is measured (through its chat template: Engine.encode_prompt)."""
METHOD = 3
"""The way curves are measured (`timed_forwards`, the fastest of each count, and which are kept); part of the cache
key, so a change of way measures anew. 3: only quiet measurements are kept, with their provenance."""
BUSY_LOAD = 0.5
"""A machine whose 1-minute load average is above this fraction of its CPUs, before or after the measurement, is
busy: other work there competes with the forwards measured."""
SPREAD = 0.25
"""Timings are unstable when a row count's median forward is more than this much slower than its fastest."""
Load = Callable[[], float]


def load_average() -> float:
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]


def timed_forwards(rt: Runtime, prompt_ids: list[int], rows: tuple[int, ...], repeats: int) -> dict[int, list[float]]:
    """The ms of `repeats` forwards of k new causal rows after the prompt's prefill, for each k in `rows`: the
    counts take turns (a pass over them all, `repeats` times, after a warm-up pass), so a spell of other work on the
    machine falls on every count alike."""
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
    return {k: ms[1:] for k, ms in times.items()}


def busy_reason(load_before: float, load_after: float, cpus: int, spread: float) -> str | None:
    """Why a measurement does not count as the machine's own (None: it does)."""
    load = max(load_before, load_after)
    if load > BUSY_LOAD * cpus:
        return f"load average {load:.2f} is above {BUSY_LOAD:g} of {cpus} CPUs"
    if spread > SPREAD:
        return f"timings unstable: a median forward {spread:.0%} slower than the fastest (over {SPREAD:.0%})"
    return None


def measure(rt: Runtime, prompt_ids: list[int], repeats: int = 5, rows: tuple[int, ...] = ROWS,
            load: Load = load_average) -> CostCurve:
    """This runtime's curve, measured now after `prompt_ids`, its ms to 0.1 µs as its JSON has them (so an engine
    given the JSON prices rows exactly as this one does), with its provenance (not yet `cached`); the runtime's
    forward log is left as it was."""
    forwards = list(rt.log)
    before, began, at = load(), time.perf_counter(), datetime.now(UTC)
    times = timed_forwards(rt, prompt_ids, rows, repeats)
    seconds, after = time.perf_counter() - began, load()
    rt.log.clear()
    rt.log.extend(forwards)
    spread = max(statistics.median(ms) / min(ms) - 1 for ms in times.values())
    cpus = os.cpu_count() or 1
    provenance = Provenance(at.isoformat(timespec="seconds"), before, after, seconds, cpus, torch.get_num_threads(),
                            spread, busy_reason(before, after, cpus, spread), cached=False)
    return CostCurve({k: round(min(ms), 4) for k, ms in times.items()}, provenance)


def machine_key(rt: Runtime) -> str:
    """What the curve depends on: the CPU (model name and flags), the threads, the device, the weights, the
    matmul precision, the forward backend, this code's version and the way it is measured."""
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
             f"method {METHOD}", rt.backend_name]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def curve_folder() -> Path:
    """Where the machine's curves are kept: one file per machine key."""
    return cache_dir() / "cost_curves"


def machine_curve(rt: Runtime, prompt_ids: list[int], folder: Path | None = None,
                  load: Load = load_average) -> CostCurve:
    """The curve this machine measured quietly before for this model and precision (in `folder`, the cache's by
    default), else one measured now after `prompt_ids` (COST_PROMPT's, as `Engine.encode_prompt` gives them),
    kept there when the machine was quiet: runs on one machine then price rows alike, engine after engine. Logged
    either way, with the provenance; a busy measurement serves this process alone."""
    path = (folder or curve_folder()) / f"{machine_key(rt)}.json"
    try:
        curve = CostCurve.from_json(json.loads(path.read_text()))
        if curve.provenance is not None:
            kept = curve.with_provenance(replace(curve.provenance, source="cache"))
            log.info("cost curve: %s, measured %s (load %.2f, %.1f s) and kept in %s", shown(kept),
                     curve.provenance.measured_at, curve.provenance.load_before, curve.provenance.seconds, path)
            return kept
    except (OSError, ValueError):
        pass
    curve = measure(rt, prompt_ids, load=load)
    p = curve.provenance
    assert p is not None
    facts = (f"measured in {p.seconds:.1f} s on {p.cpus} CPUs, {p.threads} threads, load average "
             f"{p.load_before:.2f} before and {p.load_after:.2f} after")
    if p.busy is not None:
        log.warning("cost curve: %s, %s; the machine was busy (%s): this process uses it, it is not kept as the "
                    "machine's", shown(curve), facts, p.busy)
        return curve
    kept = curve.with_provenance(replace(p, cached=True))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(kept.to_json()))
        partial.replace(path)
    except OSError as e:
        log.warning("cost curve: %s, %s; not kept (%s): this process uses it", shown(curve), facts, e)
        return curve
    log.info("cost curve: %s, %s; kept as the machine's in %s", shown(kept), facts, path)
    return kept


def shown(curve: CostCurve) -> str:
    """The curve in a log line: each row count's ms."""
    return " ".join(f"{k}:{ms:.2f}" for k, ms in sorted(curve.ms.items())) + " ms"
