"""The bench's figure of what a verify of k rows costs against one row (the engine's cost curve, measured afresh
after the bench's own prompt with more repeats than the engine's start takes)."""
from __future__ import annotations

from typing import Any

from specscope.backend.engine.cost_curve import ROWS
from specscope.backend.engine.cost_measure import measure
from specscope.backend.engine.engine import Engine


def verify_rows(engine: Engine, prompt: str, repeats: int = 7, rows: tuple[int, ...] = ROWS) -> dict[str, Any]:
    """{"prefix": prompt tokens, "ms": {k: the fastest forward's ms}, "vs_one_row": {k: ms / ms at 1 row}}."""
    ids = engine.encode_prompt(prompt, raw=False)
    curve = measure(engine.rt, ids, repeats, rows)
    return {"prefix": len(ids), "ms": dict(curve.ms),
            "vs_one_row": curve.vs_one_row()}


def markdown(figures: dict[str, Any]) -> str:
    ks = list(figures["ms"])
    return (f"\nVerify forward of k rows against 1 row (causal, writing K/V, after a {figures['prefix']}-token "
            "prompt; the fastest of several forwards through the runtime, the row counts in turns):\n\n"
            "| rows | " + " | ".join(map(str, ks)) + " |\n|---|" + "---|" * len(ks) + "\n"
            "| ms | " + " | ".join(f"{figures['ms'][k]:.1f}" for k in ks) + " |\n"
            "| vs 1 row | " + " | ".join(f"{figures['vs_one_row'][k]:.2f}×" for k in ks) + " |\n")
