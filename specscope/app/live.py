"""A streaming run's running figures (tokens, NFE, TPF, tok/s) and the label of the chat's live round panel."""
from __future__ import annotations

from typing import Any

from specscope.app.figures import esc, fmt, plural
from specscope.app.trace import RunTrace


def running_figures(trace: RunTrace, seconds: float) -> dict[str, Any]:
    """tokens, nfe, tpf and tok_per_s of a run: its own metrics once it ended, else counted from the rounds streamed
    so far over `seconds` of wall clock (a round's nfe leaves the prefill out)."""
    if trace.metrics:
        return trace.metrics
    tokens = len(trace.output_ids)
    nfe = sum(int(r.get("nfe") or 0) for r in trace.rounds)
    return {"tokens": tokens, "nfe": nfe, "tpf": tokens / nfe if nfe else None,
            "tok_per_s": tokens / seconds if seconds > 0 and tokens else None}


def figures_html(figures: dict[str, Any]) -> str:
    tokens = figures.get("tokens")
    return (f'{plural(tokens, "token") if tokens is not None else "— tokens"} · NFE {fmt(figures.get("nfe"))} · '
            f'<span title="tokens committed per forward (TPF = tokens / NFE)">TPF {fmt(figures.get("tpf"), 2)}</span>'
            f' · {fmt(figures.get("tok_per_s"), 1)} tok/s')


def live_head_html(trace: RunTrace, mode: str, seconds: float, waiting: str = "") -> str:
    """What the live round panel shows: the run (id, mode, model), its round and running figures; before its first
    round, that it starts (and `waiting`, why it has no round yet)."""
    run = f'run <code>{esc(trace.run_id)}</code> · ' if trace.run_id else "new run · "
    model = f" on {esc(trace.model)}" if trace.model else ""
    if not trace.rounds:
        note = "failed before its first round" if trace.error else waiting or "starting: its first round shows here"
        return f'<div class="ss-round-head" id="chat-live-label">{run}<b>{esc(mode)}</b>{model} · {esc(note)}</div>'

    state = "live" if trace.status == "running" else esc(trace.status)
    return (f'<div class="ss-round-head" id="chat-live-label">{run}<b>{esc(mode)}</b>{model} · {state} · round '
            f'{len(trace.rounds) - 1} · <span class="ss-live-figures">'
            f'{figures_html(running_figures(trace, seconds))}</span></div>')
