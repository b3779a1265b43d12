"""Spec-decode metrics a serving engineer knows (vLLM / llama.cpp names), per-round fold ratios and the step map,
derived from a run's round events. Pure functions, no I/O.

A run's acceptance figures come from the counts the engine kept of its drafts (run_end's vLLM counts,
engine/spec_counts.py: each mode says what its drafts are, `RoundResult.draft`). A run without them (still
recording, or stored before they were kept) has them read off its rounds, by what each verify round recorded:
- drafted block states (`branches`, verified in one batched forward): position i is accepted when the i-th following
  round was a cache hit (the drafted state matched), so `1 + accepted` = denoising steps per verify forward;
- a p/q table (`pq`, one entry per speculated token): accepted in order until the first rejection;
- otherwise the round's cells after the anchor: accepted cells, then the bonus/correction cell, which replaced a draft
  (`replaced_draft`) when the rest were rejected.
`mean_acceptance_length` = 1 + accepted / steps (counting the bonus, as vLLM does).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specscope.app.trace import Event, RunTrace
from specscope.backend.engine.spec_counts import stored_counts


def is_verify(r: Event) -> bool:
    return any(p.get("kind") == "verify" for p in r.get("phases") or [])


def cache_hit(r: Event) -> Event | None:
    """The branch of round `r` that was a cache hit (its drafted state matched the new main state), if any."""
    return next((b for b in r.get("branches") or [] if b.get("cache_hit")), None)


def round_verdicts(r: Event) -> list[bool]:
    """The drafted cells of one round, in order: True accepted, False rejected (empty: no drafts verified)."""
    if not is_verify(r) or r.get("branches"):
        return []
    states = list(r.get("states") or [])[1:]
    corrected = "rejected" in states or (r.get("extra") or {}).get("replaced_draft") is not None
    return [s == "accepted" for s in states if s in ("accepted", "rejected") or s == "bonus" and corrected]


def branch_steps(rounds: Sequence[Event]) -> list[tuple[int, list[bool]]]:
    """Drafted block states: (drafted, verdicts) per verify forward; verdict i = the i-th following round was a
    cache hit."""
    steps = []
    for k, r in enumerate(rounds):
        if not is_verify(r) or not r.get("branches"):
            continue
        drafted = max(len(r.get("branches") or []) - 1, 0)
        verdicts = []
        for nxt in rounds[k + 1:]:
            hit = cache_hit(nxt)
            if hit is None or is_verify(nxt):
                break
            verdicts.append(True)
        steps.append((drafted, verdicts + ([False] if len(verdicts) < drafted else [])))
    return steps


def round_steps(rounds: Sequence[Event]) -> list[tuple[int, list[bool]]]:
    """(drafted, verdicts) per verify step, as the rounds recorded them (the module's docstring)."""
    if any(is_verify(r) and r.get("branches") for r in rounds):
        return branch_steps(rounds)
    if any(r.get("pq") for r in rounds):
        verdicts = [[bool(e.get("accepted")) for e in r["pq"]] for r in rounds if r.get("pq")]
    else:
        verdicts = [v for v in (round_verdicts(r) for r in rounds) if v]
    return [(len(v), v) for v in verdicts]


def spec_metrics(trace: RunTrace) -> dict[str, Any] | None:
    """vLLM-style acceptance metrics of a drafting run, None for a run that drafted nothing: from the engine's counts
    where the run has them, else from its rounds (`per_step_*` then too)."""
    counts = stored_counts(trace.metrics)
    if counts is not None:
        return counted_metrics(counts)
    steps = round_steps(trace.rounds)
    drafted = [d for d, _ in steps]
    verdicts = [v for _, v in steps]
    if not verdicts:
        return None
    accepted = [next((i for i, ok in enumerate(v) if not ok), len(v)) for v in verdicts]
    depth = max(len(v) for v in verdicts)
    per_position = [sum(1 for a in accepted if a > i) / len(verdicts) for i in range(depth)]
    total_drafted = sum(drafted)
    return {"num_spec_steps": len(verdicts), "num_draft_tokens": total_drafted,
            "num_accepted_draft_tokens": sum(accepted),
            "mean_acceptance_length": 1 + sum(accepted) / len(verdicts),
            "draft_acceptance_rate": sum(accepted) / total_drafted if total_drafted else None,
            "acceptance_rate_per_position": per_position, "per_step_accepted": accepted,
            "per_step_drafted": drafted}


def counted_metrics(counts: dict[str, Any]) -> dict[str, Any] | None:
    """spec_metrics' figures from the engine's counts of a run's drafts (SPEC_KEYS)."""
    drafts, drafted, accepted = counts["num_drafts"], counts["num_draft_tokens"], counts["num_accepted_tokens"]
    if not drafts:
        return None
    return {"num_spec_steps": drafts, "num_draft_tokens": drafted, "num_accepted_draft_tokens": accepted,
            "mean_acceptance_length": 1 + accepted / drafts,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "acceptance_rate_per_position": [n / drafts for n in counts["num_accepted_tokens_per_pos"]]}


def fold_ratios(r: Event) -> tuple[float | None, float | None]:
    """SpecFold: the share of draft (layer, position) rows folded this round, for QKV and for the FFN."""
    width = max((len(b.get("tokens") or []) for b in r.get("branches") or []), default=0)

    def ratio(counts: Sequence[Sequence[int]] | None) -> float | None:
        rows = [list(layer)[1:] for layer in counts or []]
        total = sum(len(layer) for layer in rows) * width
        return 1 - sum(map(sum, rows)) / total if total else None

    return ratio(r.get("fold")), ratio((r.get("extra") or {}).get("fold_ffn"))


def step_map(trace: RunTrace) -> list[int]:
    """The round that revealed each output token (lmdeploy DLLM's step_map): the first round showing it accepted
    (or as the bonus) at its position, else the round that committed it."""
    revealed: dict[int, int] = {}
    for r in trace.rounds:
        start = int(r.get("block_start") or 0)
        for i, state in enumerate(r.get("states") or []):
            if state in ("accepted", "bonus"):
                revealed.setdefault(start + i, r["round"])
    committed = [r["round"] for r in trace.rounds for _ in r.get("committed") or []]
    n_prompt = len(trace.prompt_ids)
    return [revealed.get(n_prompt + k, committed[k] if k < len(committed) else -1)
            for k in range(len(trace.output_ids))]
