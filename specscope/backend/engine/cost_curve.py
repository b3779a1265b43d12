"""The machine's cost curve: what a causal forward of k new rows that write their K/V after a prompt's prefix costs
(a decode step at k = 1, a k-row verify above), measured through the engine's own runtime (cost_measure.py).
Self-speculation lives on it: a drafter that is right n tokens ahead pays only where an (n + 1)-row verify costs
little more than a decode step, which holds on AMX tiles and GPUs and not for float32 on AVX2. Here the curve is a
value alone (no torch), which the UI reads too."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

ROWS = (1, 2, 3, 4, 6, 8, 16)
"""The row counts measured: every count up to 4, where the kernels change pass (AVX2's fused step shares one weight
pass among up to 3 rows, then turns compute-bound), and beyond by steps."""


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
