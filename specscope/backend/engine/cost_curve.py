"""The machine's cost curve: what a causal forward of k new rows that write their K/V after a prompt's prefix costs
(a decode step at k = 1, a k-row verify above), measured through the engine's own runtime. Self-speculation lives
on it: a drafter that is right n tokens ahead pays only where an (n + 1)-row verify costs little more than a
decode step, which holds on AMX tiles and GPUs and not for float32 on AVX2."""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specscope.backend.model.source import cache_dir

if TYPE_CHECKING:
    from specscope.backend.engine.engine import Engine

ROWS = (1, 2, 3, 4, 6, 8, 16)
"""The row counts measured: every count up to 4, where the kernels change pass (AVX2's fused step shares one weight
pass among up to 3 rows, then turns compute-bound), and beyond by steps."""
COST_PROMPT = "Write a short note about the weather today."
"""The prompt after whose prefix the engine measures its curve."""
METHOD = 2
"""The way curves are measured (`fastest_forwards`); part of the cache key, so a change of way measures anew."""


@dataclass(frozen=True)
class CostCurve:
    """The ms of a forward by its rows, at the measured row counts (the fastest of several: `fastest_forwards`)."""
    ms: Mapping[int, float]

    def at(self, rows: int) -> float:
        """A forward's ms at `rows`: linear between the measured points, and beyond the last two."""
        xs, ys = zip(*sorted(self.ms.items()), strict=True)
        if rows <= xs[-1] or len(xs) == 1:
            return float(np.interp(rows, xs, ys))
        return ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (rows - xs[-1])

    def vs_one_row(self) -> dict[int, float]:
        one = self.at(1)
        return {k: v / one for k, v in sorted(self.ms.items())}

    def to_json(self) -> dict[str, Any]:
        """The ms (to 0.1 µs) and the ratios those ms give: `from_json` of it gives a curve with the same JSON."""
        shown = CostCurve({k: round(v, 4) for k, v in self.ms.items()})
        return {"ms": {str(k): v for k, v in sorted(shown.ms.items())},
                "vs_one_row": {str(k): round(v, 3) for k, v in shown.vs_one_row().items()}}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> CostCurve:
        """The curve of `to_json` (or a bare {rows: ms} map)."""
        ms = doc.get("ms", doc)
        try:
            curve = {int(k): float(v) for k, v in ms.items()}
        except (TypeError, ValueError, AttributeError):
            raise ValueError(f"a cost curve maps rows to ms, got {doc!r}") from None
        if not curve or min(curve) < 1 or min(curve.values()) <= 0:
            raise ValueError(f"a cost curve needs positive ms at one row or more, got {doc!r}")
        return CostCurve(curve)


FLAT = CostCurve({1: 1.0, 16: 1.0})
"""Rows for free: the curve of a machine where a verify costs what a decode step does."""


def fastest_forwards(engine: Engine, prompt: str, rows: tuple[int, ...], repeats: int) -> dict[int, float]:
    """The fastest of `repeats` forwards of k new causal rows after the prompt's prefill, for each k in `rows`: the
    counts take turns (a pass over them all, `repeats` times, after a warm-up pass), so a spell of other work on the
    machine falls on every count alike, and the fastest forward is the cost (other work only adds to it)."""
    rt = engine.rt
    req = engine.new_request(prompt, "ar", {"max_new_tokens": 1})
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


def measure(engine: Engine, prompt: str = COST_PROMPT, repeats: int = 5,
            rows: tuple[int, ...] = ROWS) -> CostCurve:
    """This engine's curve, measured now, its ms to 0.1 µs as its JSON has them, so an engine given the JSON prices
    rows exactly as this one does (its forward log is left as it was)."""
    log = list(engine.rt.log)
    curve = CostCurve({k: round(ms, 4) for k, ms in fastest_forwards(engine, prompt, rows, repeats).items()})
    engine.rt.log.clear()
    engine.rt.log.extend(log)
    return curve


def machine_key(engine: Engine) -> str:
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
    rt = engine.rt
    parts = [*lines, str(torch.get_num_threads()), str(rt.device), rt.loaded.weights_hash, rt.matmul, ours,
             f"method {METHOD}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def cached(engine: Engine) -> CostCurve:
    """The curve this machine measured for this model and precision before (in the cache folder), else one
    measured now and kept there: runs on one machine then price rows alike, engine after engine."""
    path = cache_dir() / "cost_curves" / f"{machine_key(engine)}.json"
    try:
        return CostCurve.from_json(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass
    curve = measure(engine)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{id(curve)}.tmp")
        partial.write_text(json.dumps(curve.to_json()))
        partial.replace(path)
    except OSError:
        pass        # a read-only cache: the curve serves this engine alone
    return curve
