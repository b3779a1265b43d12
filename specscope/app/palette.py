"""Colours of the state vocabulary, KV end reasons and ISD cases, and the visualizer's limits: one source for the
CSS, the charts, the legend and app/static/viz.js (which reads them from its documents' `vocab`, `vocabulary()`)."""
from __future__ import annotations

from typing import Any

from specscope.backend.tracing import ROUND_COUNTS
from specscope.backend.tracing import STATES as MEANINGS

# state -> (background, text colour); the states and their meanings are the trace schema's (backend/tracing.py)
COLOURS: dict[str, tuple[str, str]] = {
    "prompt": ("#eef0f3", "#6b7280"),
    "committed": ("#e2e8f0", "#475569"),
    "mask": ("#4b5563", "#f9fafb"),
    "draft": ("#fde68a", "#78350f"),
    "accepted": ("#86efac", "#14532d"),
    "rejected": ("#fca5a5", "#7f1d1d"),
    "bonus": ("#93c5fd", "#1e3a8a"),
    "pending": ("#d8b4fe", "#581c87"),
    "padding": ("#f8fafc", "#94a3b8"),
    "cut": ("#fed7aa", "#9a3412"),
}
STATES: dict[str, tuple[str, str, str]] = {state: (*COLOURS[state], meaning) for state, meaning in MEANINGS.items()}
"""state -> (background, text colour, meaning), in the legend's order (a state without colours fails here)."""
MASKED = ("mask", "padding")
"""States whose cells show [M] instead of their token."""
CONTEXT_CELLS = 48
"""Context cells (prompt and committed) a round's grid shows before its block."""


# KV interval end reason -> (colour, meaning); None = still held at the end of the run (a leak)
KV_REASONS: dict[str | None, tuple[str, str]] = {
    "finished": ("#3b82f6", "freed when the run finished"),
    "mask": ("#9ca3af", "mask KV freed after the round"),
    "rejected": ("#ef4444", "rejected suffix freed"),
    "trim": ("#f59e0b", "trimmed"),
    "cancelled": ("#a855f7", "freed on cancel"),
    "realloc": ("#14b8a6", "reallocated"),
    None: ("#111827", "never freed (leak)"),
}

# forward phase kind -> (colour, meaning), for the timeline
PHASES: dict[str, tuple[str, str]] = {
    "prefill": ("#64748b", "the prompt's forward"),
    "draft": ("#f59e0b", "a drafting forward (masks guessed)"),
    "verify": ("#22c55e", "a verifying forward (drafts checked)"),
    "denoise": ("#8b5cf6", "a denoising pass over a block"),
    "decode": ("#3b82f6", "a one-token decode step"),
    "refresh": ("#ec4899", "a KV refresh of committed positions"),
}

CASES: dict[str, tuple[str, str]] = {
    "V": ("#22c55e", "V: every spec verified"),
    "R": ("#ef4444", "R: a spec rejected, correction emitted"),
    "C": ("#3b82f6", "C: cold start"),
}


def kv_color(reason: str | None) -> str:
    return KV_REASONS.get(reason, ("#64748b", ""))[0]


def phase_color(kind: str) -> str:
    return PHASES.get(kind, ("#0f172a", ""))[0]


def palette_css() -> str:
    """CSS rules colouring token cells by state (`.ss-s-<state>`)."""
    return "\n".join(f".ss-s-{state}{{background:{bg};color:{fg};}}" for state, (bg, fg, _) in STATES.items())


def vocabulary() -> dict[str, Any]:
    """What app/static/viz.js draws with, sent inside every document it renders: the states (colours, meanings),
    the masked ones, the round counts' definitions and the context cells shown before a block."""
    return {"states": {s: {"bg": bg, "fg": fg, "meaning": m} for s, (bg, fg, m) in STATES.items()},
            "masked": list(MASKED), "counts": ROUND_COUNTS, "context_cells": CONTEXT_CELLS}
