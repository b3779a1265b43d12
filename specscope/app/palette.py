"""Colours of the state vocabulary, KV end reasons and ISD cases; one source for the CSS, the charts and the legend."""
from __future__ import annotations

# state -> (background, text colour, meaning); the order is the legend's
STATES: dict[str, tuple[str, str, str]] = {
    "prompt": ("#eef0f3", "#6b7280", "prompt token (dimmed)"),
    "committed": ("#e2e8f0", "#475569", "committed in an earlier round (dimmed)"),
    "mask": ("#4b5563", "#f9fafb", "still masked"),
    "draft": ("#fde68a", "#78350f", "draft: tentative guess, not yet verified"),
    "accepted": ("#86efac", "#14532d", "accepted / committed this round"),
    "rejected": ("#fca5a5", "#7f1d1d", "rejected draft (its KV is freed)"),
    "bonus": ("#93c5fd", "#1e3a8a", "bonus: AR bonus token or ISD correction"),
    "pending": ("#d8b4fe", "#581c87", "pending (ISD): verified next round"),
    "padding": ("#f8fafc", "#94a3b8", "padding (ISD unused masks)"),
}

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
    """CSS rules colouring token cells by state (`.ss-s-<state>`) and the same colours as `--ss-<state>` variables
    (read by app/static/viz.js for its charts)."""
    variables = ";".join(f"--ss-{state}:{bg}" for state, (bg, _, _) in STATES.items())
    rules = "\n".join(f".ss-s-{state}{{background:{bg};color:{fg};}}" for state, (bg, fg, _) in STATES.items())
    return f":root{{{variables}}}\n{rules}"
