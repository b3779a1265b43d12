"""The machine's cost curve: what a causal forward of k new rows that write their K/V after a prompt's prefix costs
(a decode step at k = 1, a k-row verify above), measured through the engine's own runtime (cost_measure.py).
Self-speculation lives on it: a drafter that is right n tokens ahead pays only where an (n + 1)-row verify costs
little more than a decode step, which holds on AMX tiles and GPUs and not for float32 on AVX2. Here the curve is a
value alone (no torch), which the UI reads too, with the provenance of its measurement: when, how loaded the machine
was, how long it took, on how many CPUs and threads."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

ROWS = (1, 2, 3, 4, 6, 8, 16)
"""The row counts measured: every count up to 4, where the kernels change pass (AVX2's fused step shares one weight
pass among up to 3 rows, then turns compute-bound), and beyond by steps."""


@dataclass(frozen=True)
class Provenance:
    """How a curve was measured (cost_measure.py). `busy` says why the machine counted as busy, or None where it was
    quiet; only a quiet measurement is kept as the machine's curve (`cached`). `source` is where this process got
    it: `measured` now, or read from the machine's `cache` (the fields then are the measurement's that wrote it)."""
    measured_at: str
    """When, as ISO 8601 UTC."""
    load_before: float
    load_after: float
    """The machine's 1-minute load average before and after."""
    seconds: float
    """How long the measurement took."""
    cpus: int
    """The CPUs the machine has (what the load average is against)."""
    threads: int
    """Torch's intra-op threads, the forwards' own."""
    spread: float
    """How unstable the timings were: the largest ratio of a row count's median forward to its fastest, less 1."""
    busy: str | None
    cached: bool
    source: str = "measured"

    def to_json(self) -> dict[str, Any]:
        return {"measured_at": self.measured_at, "load_before": round(self.load_before, 2),
                "load_after": round(self.load_after, 2), "seconds": round(self.seconds, 3), "cpus": self.cpus,
                "threads": self.threads, "spread": round(self.spread, 3), "busy": self.busy, "cached": self.cached,
                "source": self.source}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Provenance:
        try:
            return Provenance(str(doc["measured_at"]), float(doc["load_before"]), float(doc["load_after"]),
                              float(doc["seconds"]), int(doc["cpus"]), int(doc["threads"]), float(doc["spread"]),
                              None if doc.get("busy") is None else str(doc["busy"]), bool(doc["cached"]),
                              str(doc.get("source", "measured")))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"a cost curve's provenance needs the fields of Provenance, got {doc!r}") from None


@dataclass(frozen=True)
class CostCurve:
    """The ms of a forward by its rows, at the measured row counts (the fastest of several: `timed_forwards`),
    and how they were measured (None for a curve given as it is, such as FLAT)."""
    ms: Mapping[int, float]
    provenance: Provenance | None = field(default=None, compare=False)

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
        """The ms (to 0.1 µs), the ratios those ms give and the provenance, if any: `from_json` of it gives a curve
        with the same JSON."""
        shown = CostCurve({k: round(v, 4) for k, v in self.ms.items()})
        doc = {"ms": {str(k): v for k, v in sorted(shown.ms.items())},
               "vs_one_row": {str(k): round(v, 3) for k, v in shown.vs_one_row().items()}}
        if self.provenance is not None:
            doc["provenance"] = self.provenance.to_json()
        return doc

    def with_provenance(self, provenance: Provenance | None) -> CostCurve:
        return replace(self, provenance=provenance)

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
        found = doc.get("provenance") if "ms" in doc else None
        return CostCurve(curve, None if found is None else Provenance.from_json(found))


FLAT = CostCurve({1: 1.0, 16: 1.0})
"""Rows for free: the curve of a machine where a verify costs what a decode step does. An engine built without a
curve prices rows with it: measuring is a step of its own (cost_measure.machine_curve), never a constructor's."""
