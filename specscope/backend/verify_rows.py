"""What a verify of k rows costs against one row, through the engine's runtime: causal forwards of k new rows that
write their K/V over a prompt's committed prefix (a decode step at k = 1, a k-row verify above), median ms each.
This is the figure self-speculation lives on: a drafter that is right n tokens ahead pays off only where a
(n + 1)-row verify costs little more than a decode step."""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from specscope.backend.engine.draft_tiers import DraftTiers, auto_tiers
from specscope.backend.engine.engine import Engine

ROWS = (1, 2, 4, 8, 16)
COST_PROMPT = "Write a short note about the weather today."
"""The prompt after whose prefix `measured_tiers` measures the verify cost."""


def verify_ms(engine: Engine, prompt: str, rows: int, repeats: int) -> float:
    """Median ms of a forward of `rows` new causal rows after the prompt's prefill (slots freed after each)."""
    rt = engine.rt
    req = engine.new_request(prompt, "ar", {"max_new_tokens": 1})
    times = []
    try:
        rt.prefill(req)
        start = req.cached
        ids = torch.full((1, rows), int(req.prompt_ids[-1]))
        positions = list(range(start, start + rows))
        for _ in range(repeats + 1):    # the first call warms up (RoPE table, allocator)
            slots = rt.alloc(req, positions)
            t0 = time.perf_counter()
            rt.forward([req], ids, [start], "causal", kind="verify", write=[slots])
            times.append((time.perf_counter() - t0) * 1000)
            rt.release(req, slots, positions, "bench")
    finally:
        rt.release_all(req, "bench")
    return statistics.median(times[1:])


def verify_rows(engine: Engine, prompt: str, repeats: int = 7, rows: tuple[int, ...] = ROWS) -> dict[str, Any]:
    """{"prefix": prompt tokens, "ms": {k: median ms}, "vs_one_row": {k: ms / ms at 1 row}}."""
    ms = {k: verify_ms(engine, prompt, k, repeats) for k in rows}
    return {"prefix": len(engine.encode_prompt(prompt, raw=False)), "ms": ms,
            "vs_one_row": {k: ms[k] / ms[rows[0]] for k in rows}}


def measured_tiers(engine: Engine) -> DraftTiers:
    """Draft tiers from this engine's own verify cost (`--draft-tiers auto`), measured now."""
    return auto_tiers(verify_rows(engine, COST_PROMPT, repeats=3)["ms"])


def markdown(figures: dict[str, Any]) -> str:
    ks = list(figures["ms"])
    return (f"\nVerify forward of k rows against 1 row (causal, writing K/V, after a {figures['prefix']}-token "
            "prompt; median ms through the runtime):\n\n"
            "| rows | " + " | ".join(map(str, ks)) + " |\n|---|" + "---|" * len(ks) + "\n"
            "| ms | " + " | ".join(f"{figures['ms'][k]:.1f}" for k in ks) + " |\n"
            "| vs 1 row | " + " | ".join(f"{figures['vs_one_row'][k]:.2f}×" for k in ks) + " |\n")
