"""The speedup explained: a run's tok/s against `ar`'s is the product of three measured factors,

    speedup = TPF ratio × row cost (ar's mean forward ms ÷ the run's) × forward share ratio (the run's ÷ ar's),

an identity once each factor is measured on the runs it compares (tok/s = TPF × forward share ÷ mean forward ms).
Against the machine's 1-row decode step instead of a stored `ar` run, the same product says what the run would
give over an `ar` whose forwards took all its time; on another machine's cost curve, what its forwards would cost
there."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from specscope.backend.engine.cost_curve import CostCurve

Metrics = Mapping[str, Any]
FACTORS = ("tpf", "row_cost", "forward_share")
DIGITS = 3
"""Decimals every view shows a factor and a product with."""


def usable(m: Metrics) -> bool:
    """Whether a run's metrics hold what the decomposition needs (runs from before it was recorded do not)."""
    return bool(m.get("nfe")) and bool(m.get("mean_forward_ms")) and bool(m.get("forward_share")) and \
        m.get("tpf") is not None


def against_baseline(m: Metrics, ar: Metrics) -> dict[str, float] | None:
    """The three factors of a run's speedup over a run of the baseline (`ar`, the registry's exact mode), their
    product, and the measured tok/s ratio."""
    if not (usable(m) and usable(ar)):
        return None
    factors = {"tpf": m["tpf"] / ar["tpf"], "row_cost": ar["mean_forward_ms"] / m["mean_forward_ms"],
               "forward_share": m["forward_share"] / ar["forward_share"]}
    return {**factors, "product": product(factors), "measured": m["tok_per_s"] / ar["tok_per_s"]}


def against_one_row(m: Metrics, curve: CostCurve) -> dict[str, float] | None:
    """The factors against this machine's 1-row decode step: TPF, the curve's 1-row ms ÷ the run's mean forward
    ms, and the run's forward share; their product is the run's speedup over an `ar` whose forwards are the curve's
    1-row step and take all its time."""
    if not usable(m):
        return None
    factors = {"tpf": m["tpf"], "row_cost": curve.at(1) / m["mean_forward_ms"], "forward_share": m["forward_share"]}
    return {**factors, "product": product(factors), "one_row_ms": curve.at(1)}


def projected(m: Metrics, curve: CostCurve) -> float | None:
    """What the run's forwards would give on another machine's curve, over that machine's decode steps: TPF × 1-row
    ms ÷ the mean ms of the run's forwards (by their rows) there; time outside the forwards left out."""
    rows = {int(k): v for k, v in (m.get("forward_rows") or {}).items()}
    if not rows or m.get("tpf") is None:
        return None
    mean_ms = sum(curve.at(r) * n for r, n in rows.items()) / sum(rows.values())
    return m["tpf"] * curve.at(1) / mean_ms


def product(factors: Mapping[str, float]) -> float:
    return math.prod(factors[name] for name in FACTORS)


def shown(found: Mapping[str, float], digits: int = DIGITS) -> dict[str, float]:
    """The figures as displayed: each rounded to `digits` decimals, and the product taken of the rounded factors
    (then rounded alike), so the displayed factors multiply to the displayed product."""
    out = {k: round(v, digits) for k, v in found.items()}
    return {**out, "product": round(product(out), digits)}
