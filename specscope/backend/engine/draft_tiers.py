"""Draft tiers: how many rows each request may draft in a round, by how many requests are running (SGLang's
`select_block_size(running_bs)`, widened to every drafting mode's length: the parameter a mode names as its
`draft_param`, fitted to the budget through the rows the mode says a round of each length runs, `Mode.draft_rows`).
Shrinking a lossless mode's draft never changes its tokens, only how many forwards they take. With no tier in force
a request drafts at its own parameters; a budget of 0 makes its rounds plain decode steps."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from specscope.backend.engine.cost_curve import CostCurve
from specscope.backend.engine.params import ParamError
from specscope.backend.engine.verify_length import best_draft_count

DraftTiers = list[tuple[int, int | None]]
"""(max_running, extra rows per request: those a round may run beyond a decode step's one, None: its own
parameters), ascending; the first tier covering the running count is in force."""
ACCEPTANCE = 0.5
"""The chance a draft is accepted, given the one before it was, that `auto_tiers` plans with (the shipped adapter
accepts about this on held-out chat prompts)."""
RUNNING = (2, 4, 8, 16, 32, 64)


def parse_draft_tiers(text: str) -> DraftTiers:
    """'2:4,4:2,64:0' -> [(2, 4), (4, 2), (64, 0)] (max_running:extra rows; 'own' for a request's own parameters)."""
    try:
        pairs = [item.split(":") for item in text.split(",") if item.strip()]
        return sorted((int(n), None if r == "own" else int(r)) for n, r in pairs)
    except ValueError:
        raise ParamError(f"draft tiers look like 2:4,4:2,64:0, got {text!r}") from None


def budget(tiers: DraftTiers, running: int) -> int | None:
    """The draft rows a request may use with `running` requests in the batch (None: its own parameters)."""
    return next((rows for max_running, rows in tiers if running <= max_running), None)


def fitted_length(length: int, rows: int | None, draft_rows: Callable[[int], int], shortest: int = 1) -> int | None:
    """A mode's draft length within a tier's `rows` extra rows, for any mode: the longest value of its `draft_param`,
    at most its own `length`, whose round runs no more extra rows than that (`draft_rows`: the mode's rows at a
    length, Mode.draft_rows); None where not even its `shortest` fits, so the round is a plain decode step; `length`
    itself where no tier is in force (rows None)."""
    if rows is None:
        return length
    fits = [n for n in range(shortest, length + 1) if draft_rows(n) <= rows]
    return fits[-1] if fits else None


def auto_tiers(curve: CostCurve, max_running: int = 64) -> DraftTiers:
    """Tiers that follow the machine's verify cost (`curve`: ms of a causal forward by rows): with r requests
    running, the draft rows per request that give the most expected tokens per unit of forward cost, against a
    decode step of r rows. A lone request keeps its own parameters; where rows are nearly free (AMX tiles, a
    GPU) drafts stay long under load, where each row costs its share (float32 on AVX2) they shrink to none."""
    tiers: DraftTiers = [(1, None)]
    for running in (r for r in RUNNING if r <= max_running):
        def round_ms(drafts: int, running: int = running) -> float:
            return curve.at(running * (1 + 2 * drafts))
        tiers.append((running, 2 * best_draft_count(ACCEPTANCE, 7, round_ms)))
    tiers[-1] = (max(max_running, tiers[-1][0]), tiers[-1][1])
    return tiers


def draft_tiers_of(spec: str, curve: CostCurve) -> DraftTiers:
    """The --draft-tiers option's table: none, auto (from the engine's cost curve), or N:R pairs."""
    if spec == "none":
        return []
    return auto_tiers(curve) if spec == "auto" else parse_draft_tiers(spec)


def cut_reason(tier: Mapping[str, Any] | None, params: Mapping[str, Any]) -> str | None:
    """Why a round's tier (as recorded in its event) drafted less than the run's own parameters, or None when it
    did not: no rows or fewer rows to draft, or another block size."""
    if not tier:
        return None
    running, rows, own = tier.get("running"), tier.get("extra_rows"), tier.get("own_rows") or 0
    active = f"with {running} run{'' if running == 1 else 's'} active"
    if rows is not None and rows < own:
        cut = "drafting off" if rows == 0 else f"draft rows cut to {rows} of {own}"
        return f"{cut} {active}"
    size = tier.get("block_size")
    if size is not None and "block_size" in params and size != params["block_size"]:
        return f"block size {size} instead of {params['block_size']} {active}"
    return None


def tier_cut(tiers: Iterable[Mapping[str, Any] | None], params: Mapping[str, Any]) -> dict[str, Any] | None:
    """A run's rounds whose drafting a tier cut, from each round's recorded tier: {"rounds": how many, "why":
    {reason: rounds}}, or None when no tier cut any."""
    reasons = Counter(why for why in (cut_reason(t, params) for t in tiers) if why)
    return {"rounds": sum(reasons.values()), "why": dict(reasons.most_common())} if reasons else None


def tier_note(cut: Mapping[str, Any] | None) -> str:
    """`tier_cut`'s answer in words: 'load tier reduced drafting in 9 rounds: drafting off with 2 runs active (9)';
    '' for none."""
    if not cut:
        return ""
    why = "; ".join(f"{reason} ({n})" for reason, n in cut["why"].items())
    return f"load tier reduced drafting in {cut['rounds']} rounds: {why}"
