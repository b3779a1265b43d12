"""Figure builders: stored rounds / events -> HTML strings or Plotly figures. Pure functions, no I/O.

Every token text that reaches HTML goes through `html.escape`; Plotly figures carry text as data.
"""
from __future__ import annotations

import difflib
import html
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.palette import CASES, KV_REASONS, STATES, kv_color, state_colors
from app.trace import Cell, Event, Piece, RunTrace, id_piece

MASKED = ("mask", "padding")
MASK_LABEL = "[M]"
VISIBLE = str.maketrans({" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"})
# No Plotly template: naming one deep-copies it on every figure (~100 ms); Plotly.js defaults are plain white.
LAYOUT: dict[str, Any] = {"template": None, "plot_bgcolor": "white", "margin": {"l": 50, "r": 20, "t": 40, "b": 40},
                          "font": {"size": 11}}


def show_piece(text: str, limit: int = 14) -> str:
    """Whitespace made visible, long pieces cut; not escaped."""
    text = text.translate(VISIBLE) or "∅"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


# -- token grid -----------------------------------------------------------------------------------------------------


def pq_by_index(round_ev: Event) -> dict[int, Mapping[str, Any]]:
    """ISD p/q entries by block index: spec i (the entry's `i`) sits at block index i + 1, after the pending token."""
    return {int(e.get("i", i)) + 1: e for i, e in enumerate(round_ev.get("pq") or [])}


def cell_html(pos: int, token: int, state: str, piece: Piece, details: Sequence[str] = ()) -> str:
    """One token cell; a masked position shows [M] (its token and any guess are in the hover title)."""
    text = piece(token)
    title = "\n".join([f"pos {pos} · {state}", f"token {text!r} (id {token})", *details])
    shown = MASK_LABEL if state in MASKED else show_piece(text)
    return (f'<span class="ss-tok ss-s-{esc(state)}" title="{esc(title)}" data-pos="{pos}">'
            f'<span class="ss-txt">{esc(shown)}</span><span class="ss-pos">{pos}</span></span>')


def round_cells(round_ev: Event, piece: Piece, branch: str = "main") -> list[str]:
    r, start = round_ev.get("round"), int(round_ev.get("block_start") or 0)
    conf = round_ev.get("conf") or []
    guess = (round_ev.get("extra") or {}).get("guess") or []  # block_diffusion: the guess for block[1:]
    pq = pq_by_index(round_ev)
    cells = []
    for i, (token, state) in enumerate(zip(round_ev.get("tokens") or [], round_ev.get("states") or [], strict=False)):
        details = [f"round {r} · branch {branch}", f"confidence {fmt(conf[i] if i < len(conf) else None)}"]
        if state in MASKED and 0 < i <= len(guess):
            details.append(f"guess {piece(guess[i - 1])!r}")
        if i in pq:
            e = pq[i]
            verdict = "?" if e.get("accepted") is None else "accepted" if e["accepted"] else "rejected"
            details.append(f"p {fmt(e.get('p'))} · q {fmt(e.get('q'))} · {verdict}")
        cells.append(cell_html(start + i, token, state, piece, details))
    return cells


def round_header_html(round_ev: Event) -> str:
    phases = " → ".join(
        f"{p.get('kind')} ({p.get('attn')}{', LoRA' if p.get('lora') else ''}, {p.get('n_query')} q, "
        f"{fmt(p.get('ms'), 1)} ms)" for p in round_ev.get("phases") or [])
    case = f" · case <b>{esc(round_ev['case'])}</b>" if round_ev.get("case") else ""
    return (f'<div class="ss-round-head"><b>round {esc(round_ev.get("round"))}</b> · block at '
            f'{esc(round_ev.get("block_start"))} · accepted {esc(round_ev.get("accepted_len"))} · '
            f'committed {len(round_ev.get("committed") or [])} · NFE +{esc(round_ev.get("nfe"))}{case}'
            f'<div class="ss-phases">{esc(phases)}</div></div>')


def token_grid_html(round_ev: Event, piece: Piece = id_piece, context: Sequence[Cell] = (),
                    max_context: int = 48) -> str:
    """One round: the context (prompt and committed, dimmed; the last `max_context` cells), then the round's block
    with each cell coloured by its state and a hover title (round, position, token, confidence, p/q, branch)."""
    hidden = max(0, len(context) - max_context)
    shown = context[hidden:]
    parts = [f'<span class="ss-more">… {hidden} earlier</span>'] if hidden else []
    parts += [cell_html(pos, tok, state, piece) for pos, tok, state in shown]
    block = "".join(round_cells(round_ev, piece))
    return (f'<div class="ss-round">{round_header_html(round_ev)}<div class="ss-grid">{"".join(parts)}'
            f'<span class="ss-block">{block}</span></div></div>')


def branches_html(round_ev: Event, piece: Piece = id_piece) -> str:
    """Multi-branch view: one row per draft branch; cells that differ from the main block are drafts."""
    branches = round_ev.get("branches") or []
    if not branches:
        return ""
    start = int(round_ev.get("block_start") or 0)
    main = list(round_ev.get("tokens") or [])
    main_states = list(round_ev.get("states") or [])
    rows = []
    for b in branches:
        cells = []
        for i, token in enumerate(b.get("tokens") or []):
            same = i < len(main) and main[i] == token
            state = main_states[i] if same and i < len(main_states) else "draft"
            cells.append(cell_html(start + i, token, state, piece, [f"branch {b.get('id')}"]))
        hit = '<span class="ss-badge ss-ok">cache hit</span>' if b.get("cache_hit") else ""
        rows.append(f'<div class="ss-branch"><span class="ss-branch-id">b{esc(b.get("id"))} ← '
                    f'{esc(b.get("parent"))}</span>{hit}<div class="ss-grid">{"".join(cells)}</div></div>')
    head = (f'<div class="ss-round-head"><b>draft branches</b> · round {esc(round_ev.get("round"))} · '
            f'{len(branches)} branches (cells that differ from the main block are drafts)</div>')
    return f'<div class="ss-branches">{head}{"".join(rows)}</div>'


# -- charts ---------------------------------------------------------------------------------------------------------


def add_cursor(fig: go.Figure, current: int | None, **where: Any) -> None:
    if current is not None:
        fig.add_vline(x=current, line={"color": "#111827", "width": 2, "dash": "dot"}, name="cursor", **where)


def accepted_length_figure(rounds: Sequence[Event], current: int | None = None) -> go.Figure:
    """Accepted length per round (bars) with the committed count, and a cursor on the current round."""
    x = [r["round"] for r in rounds]
    fig = go.Figure([
        go.Bar(x=x, y=[r.get("accepted_len") for r in rounds], name="accepted length", marker_color="#22c55e",
               customdata=[[len(r.get("committed") or []), r.get("nfe")] for r in rounds],
               hovertemplate="round %{x}<br>accepted %{y}<br>committed %{customdata[0]}<br>"
                             "NFE +%{customdata[1]}<extra></extra>"),
        go.Scatter(x=x, y=[len(r.get("committed") or []) for r in rounds], name="committed", mode="lines+markers",
                   line={"color": "#3b82f6", "shape": "hv"}, hoverinfo="skip"),
    ])
    add_cursor(fig, current)
    fig.update_layout(**LAYOUT, title="accepted length per round", height=240, bargap=0.15,
                      xaxis_title="round", yaxis_title="tokens", legend={"orientation": "h", "y": 1.12, "x": 1,
                                                                         "xanchor": "right"})
    return fig


def kv_figure(intervals: Sequence[Event], n_rounds: int, current: int | None = None) -> go.Figure:
    """KV slot lifecycle: one horizontal bar per occupancy (alloc round -> free round), coloured by end reason."""
    fig = go.Figure()
    slots = sorted({int(iv["slot"]) for iv in intervals})
    present = {iv.get("end_reason") for iv in intervals}
    for reason in [r for r in KV_REASONS if r in present] + sorted(r for r in present - set(KV_REASONS) if r):
        chosen = [iv for iv in intervals if iv.get("end_reason") == reason]
        meaning = KV_REASONS.get(reason, ("", str(reason)))[1]
        starts = [iv["alloc_round"] for iv in chosen]
        ends = [iv["free_round"] if iv.get("free_round") is not None else n_rounds for iv in chosen]
        fig.add_trace(go.Bar(
            base=starts, x=[max(e - s, 0.4) for s, e in zip(starts, ends, strict=True)],
            y=[f"slot {iv['slot']}" for iv in chosen], orientation="h", name=reason or "held",
            marker_color=kv_color(reason), width=0.8,
            customdata=[[iv.get("position"), s, iv.get("free_round"), meaning] for iv, s in zip(chosen, starts,
                                                                                               strict=True)],
            hovertemplate="%{y} · position %{customdata[0]}<br>alloc round %{customdata[1]} → free round "
                          "%{customdata[2]}<br>%{customdata[3]}<extra></extra>"))
    add_cursor(fig, current)
    fig.update_layout(**LAYOUT, title="KV slot lifecycle (alloc → free, by slot)", barmode="overlay",
                      xaxis={"title": "round", "range": [-0.5, n_rounds + 0.5]},
                      height=min(200 + 6 * len(slots), 640), legend={"orientation": "h", "y": -0.15})
    fig.update_yaxes(categoryorder="array", categoryarray=[f"slot {s}" for s in reversed(slots)],
                     showticklabels=len(slots) <= 40, title="slot")
    return fig


def confidence_figure(round_ev: Event, piece: Piece = id_piece, threshold: float | None = None) -> go.Figure:
    """Confidence per block position coloured by state, with the threshold τ as a dashed line."""
    start = int(round_ev.get("block_start") or 0)
    conf = list(round_ev.get("conf") or [])
    states = list(round_ev.get("states") or [])
    tokens = list(round_ev.get("tokens") or [])
    idx = [i for i, c in enumerate(conf) if c is not None]
    fig = go.Figure(go.Bar(
        x=[start + i for i in idx], y=[conf[i] for i in idx],
        marker_color=[state_colors(states[i] if i < len(states) else "")[0] for i in idx],
        marker_line={"color": "#334155", "width": 0.5},
        customdata=[[piece(tokens[i]) if i < len(tokens) else "", states[i] if i < len(states) else ""]
                    for i in idx],
        hovertemplate="pos %{x} · %{customdata[1]}<br>token %{customdata[0]}<br>conf %{y:.3f}<extra></extra>"))
    tau = threshold if threshold is not None else (round_ev.get("extra") or {}).get("threshold")
    if tau:  # τ = 0 (fill everything in one pass) draws no line
        fig.add_hline(y=tau, line={"color": "#dc2626", "dash": "dash"}, annotation_text=f"τ = {tau:g}",
                      annotation_position="top left")
    fig.update_layout(**LAYOUT, title=f"confidence per position · round {round_ev.get('round')}", height=240,
                      xaxis={"title": "position", "dtick": 1 if len(idx) <= 32 else None},
                      yaxis={"range": [0, 1.05], "title": "confidence"}, showlegend=False)
    return fig


def isd_figure(rounds: Sequence[Event], current: int | None = None) -> go.Figure:
    """ISD: the V/R/C case of every round (bar height = accepted length) and p/q per spec of the current round."""
    fig = make_subplots(rows=2, cols=1, row_heights=[0.45, 0.55], vertical_spacing=0.18,
                        subplot_titles=("round case (V / R / C)", f"p / q per spec · round {current}"))
    for case, (color, meaning) in CASES.items():
        chosen = [r for r in rounds if r.get("case") == case]
        fig.add_trace(go.Bar(x=[r["round"] for r in chosen], y=[r.get("accepted_len") for r in chosen], name=case,
                             marker_color=color, hovertemplate=f"round %{{x}}<br>{meaning}<br>accepted %{{y}}"
                                                               "<extra></extra>"), row=1, col=1)
    add_cursor(fig, current, row=1, col=1)
    now = next((r for r in rounds if r.get("round") == current), None)
    pq = list((now or {}).get("pq") or [])
    specs = [f"spec {i}" for i in range(len(pq))]
    verdict = ["✓" if e.get("accepted") else "✗" for e in pq]
    fig.add_trace(go.Bar(x=specs, y=[e.get("p") for e in pq], name="p (verifier)", marker_color="#0ea5e9",
                         text=verdict, textposition="outside"), row=2, col=1)
    fig.add_trace(go.Bar(x=specs, y=[e.get("q") for e in pq], name="q (draft)", marker_color="#f97316"),
                  row=2, col=1)
    fig.update_layout(**LAYOUT, height=420, barmode="group", bargap=0.4, legend={"orientation": "h", "y": -0.12})
    fig.update_yaxes(range=[0, 1.15], row=2, col=1)
    return fig


def fold_figure(round_ev: Event) -> go.Figure:
    """SpecFold: recomputed positions per layer × branch for one round's verification."""
    fold = [list(row) for row in round_ev.get("fold") or []]
    fig = go.Figure(go.Heatmap(
        z=fold, x=[f"b{j}" for j in range(len(fold[0]) if fold else 0)], y=list(range(len(fold))),
        colorscale="Blues", colorbar={"title": "recomputed"},
        hovertemplate="layer %{y} · branch %{x}<br>recomputed %{z}<extra></extra>"))
    fig.update_layout(**LAYOUT, title=f"fold: recomputed positions, layer × branch · round {round_ev.get('round')}",
                      height=300, xaxis_title="branch", yaxis_title="layer")
    return fig


def comparison_figure(runs: Sequence[RunTrace]) -> go.Figure:
    """Cumulative committed tokens vs cumulative NFE, one step line per run, on one shared axis."""
    fig = go.Figure()
    for run in runs:
        nfe, tokens = run.progress()
        fig.add_trace(go.Scatter(x=nfe, y=tokens, mode="lines+markers", line={"shape": "hv"},
                                 name=f"{run.mode} · {run.run_id[-6:]}",
                                 hovertemplate="NFE %{x}<br>tokens %{y}<extra>" + esc(run.mode) + "</extra>"))
    fig.update_layout(**LAYOUT, title="committed tokens vs forward passes (NFE)", height=320,
                      xaxis_title="cumulative NFE", yaxis_title="committed tokens",
                      legend={"orientation": "h", "y": -0.2})
    return fig


# -- tables, diffs, sparklines --------------------------------------------------------------------------------------

METRIC_COLUMNS = (("tokens", "tokens", 0), ("nfe", "NFE", 0), ("tpf", "TPF", 2), ("tok_per_s", "tok/s", 1),
                  ("wall_ms", "wall ms", 0), ("accept_len_mean", "mean accepted", 2), ("kv_peak", "KV peak", 0),
                  ("kv_leaked", "KV leaked", 0))


def badge(css: str, text: str) -> str:
    return f'<span class="ss-badge {css}">{esc(text)}</span>'


def lossless_badge(run: RunTrace, runs: Sequence[RunTrace], lossless: Mapping[str, str | None]) -> str:
    """A mode's own lossless claim (e.g. linear_spec == ar) checked against that mode's run in the same set."""
    target = lossless.get(run.mode)
    if not target:
        return ""
    base = next((r for r in runs if r.mode == target), None)
    if base is None:
        return badge("ss-ref", f"add {target} to check")
    return badge("ss-ok", f"== {target}") if base.output_ids == run.output_ids else badge("ss-bad", f"≠ {target}")


def metrics_table_html(runs: Sequence[RunTrace], reference: RunTrace | None = None,
                       lossless: Mapping[str, str | None] | None = None) -> str:
    """One row per run with its metrics, a badge saying whether its output equals the reference's, and the check
    of the mode's own lossless claim (`lossless`: mode -> the mode whose output it must equal)."""
    head = "".join(f"<th>{esc(label)}</th>" for _, label, _ in METRIC_COLUMNS)
    rows = []
    for run in runs:
        m = run.metrics
        cells = "".join(f"<td>{esc(fmt(m.get(key), digits))}</td>" for key, _, digits in METRIC_COLUMNS)
        if reference is None:
            same = ""
        elif run is reference:
            same = badge("ss-ref", "reference")
        elif run.output_ids == reference.output_ids:
            same = badge("ss-ok", "same output as reference")
        else:
            same = badge("ss-bad", "differs from reference")
        rows.append(f'<tr><td><b>{esc(run.mode)}</b><br><code>{esc(run.run_id)}</code></td>'
                    f'<td>{esc(run.status)}</td>{cells}<td>{same}</td>'
                    f'<td>{lossless_badge(run, runs, lossless or {})}</td></tr>')
    return (f'<table class="ss-table"><thead><tr><th>mode / run</th><th>status</th>{head}<th>output</th>'
            f'<th>lossless claim</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def token_diff_html(reference: Sequence[int], output: Sequence[int], piece: Piece = id_piece) -> str:
    """Token-level diff of an output against the reference output: equal, inserted and deleted tokens."""
    def span(tokens: Sequence[int], css: str) -> str:
        return "".join(f'<span class="ss-d {css}" title="{esc(f"id {t}")}">{esc(show_piece(piece(t), 40))}</span>'
                       for t in tokens)

    parts = []
    matcher = difflib.SequenceMatcher(a=list(reference), b=list(output), autojunk=False)
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            parts.append(span(reference[a0:a1], "ss-eq"))
            continue
        parts.append(span(reference[a0:a1], "ss-del"))
        parts.append(span(output[b0:b1], "ss-ins"))
    return f'<div class="ss-diff">{"".join(parts) or "<i>empty</i>"}</div>'


def warning_html(problem: Exception | str) -> str:
    return badge("ss-bad", f"⚠ {problem}")


def sparkline(values: Sequence[float]) -> str:
    """A one-line unicode bar chart."""
    bars = "▁▂▃▄▅▆▇█"
    if not values:
        return ""
    if min(values) == max(values):
        return bars[3] * len(values)
    top = max(values)
    return "".join(bars[min(int(v / top * (len(bars) - 1) + 0.5), len(bars) - 1)] for v in values)


def run_stats_markdown(run: RunTrace) -> str:
    """The stats line shown under a chat answer."""
    m = run.metrics
    if run.error:
        return f"⚠ {run.error}"
    accepted = run.accepted_lens[1:]  # round 0 is the prefill
    return (f"**{esc(run.mode)}** · TPF {fmt(m.get('tpf'), 2)} · NFE {fmt(m.get('nfe'))} · "
            f"{fmt(m.get('tok_per_s'), 1)} tok/s · accepted/round {sparkline(accepted) or '—'} "
            f"(max {max(accepted, default=0)}) · run `{run.run_id}` ({esc(run.status)})")


def legend_html() -> str:
    """Every colour used by the grid and the charts, with its meaning."""
    def swatch(color: str, label: str, meaning: str, css_class: str = "") -> str:
        return (f'<span class="ss-legend-item"><span class="ss-swatch {css_class}" style="background:{color}">'
                f'</span><b>{html.escape(label)}</b> {html.escape(meaning)}</span>')

    states = "".join(swatch(bg, s, m, f"ss-s-{s}") for s, (bg, _, m) in STATES.items())
    kv = "".join(swatch(c, r or "held", m) for r, (c, m) in KV_REASONS.items())
    cases = "".join(swatch(c, k, m) for k, (c, m) in CASES.items())
    return (f'<div class="ss-legend"><div><b>token states</b> {states}</div>'
            f'<div><b>KV slot end</b> {kv}</div><div><b>ISD round case</b> {cases}</div></div>')
