"""Figure builders: stored rounds / events -> HTML strings or Plotly figures. Pure functions, no I/O.

Every token text that reaches HTML goes through `html.escape`; Plotly figures carry text as data. Token grids are
drawn in the browser by app/static/viz.js alone (`live_round` sends the chat's latest round there as data).
"""
from __future__ import annotations

import difflib
import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from markdown_it import MarkdownIt

from specscope.app.modebook import ModeBook
from specscope.app.palette import CASES, CONTEXT_CELLS, KV_REASONS, STATES, kv_color, phase_color, vocabulary
from specscope.app.specmetrics import spec_metrics
from specscope.app.trace import Cell, Event, Piece, RunTrace, id_piece
from specscope.backend.bench_cells import pick_count
from specscope.backend.engine.cost_curve import CostCurve
from specscope.backend.engine.lossless import Claim, Outcome, model_difference, unmet, verdict
from specscope.backend.engine.speedup import DIGITS, FACTORS, against_baseline, shown
from specscope.backend.tracing import ROUND_COUNTS

VISIBLE = str.maketrans({" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"})
# No Plotly template: naming one deep-copies it on every figure (~100 ms); Plotly.js defaults are plain white.
# The modebar (SVG export, zoom) stands on the right edge, never over a title on a narrow screen.
LAYOUT: dict[str, Any] = {"template": None, "plot_bgcolor": "white", "margin": {"l": 50, "r": 30, "t": 40, "b": 40},
                          "font": {"size": 11}, "modebar": {"orientation": "v"}}


def visible(text: str) -> str:
    """Whitespace made visible, the empty piece as ∅; not escaped. The one whitespace display: app/static/viz.js
    gets each piece's (`shown` in its documents) and only shortens it."""
    return text.translate(VISIBLE) or "∅"


def show_piece(text: str, limit: int = 14) -> str:
    """visible(text), long pieces cut; not escaped."""
    text = visible(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


PERCENT = "%"
"""A metric column's format for a share: shown as 82.5%, as the visualizer shows it."""


def fmt(value: Any, digits: int | str = 3) -> str:
    if value is None:
        return "—"
    if digits == PERCENT and isinstance(value, (int, float)):
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def plural(n: int | float, word: str, words: str | None = None) -> str:
    """'1 token', '2 tokens', '0 tokens'; `words` where the plural is not `word` + 's'."""
    return f"{n} {word if n == 1 else words or word + 's'}"


# -- token grid -----------------------------------------------------------------------------------------------------


def live_round(round_ev: Event, piece: Piece, context: Sequence[Cell] = (), max_context: int = CONTEXT_CELLS) -> str:
    """The chat's latest round as JSON for app/static/viz.js (`specscopeViz.live`), the one token-grid renderer:
    the round, its last `max_context` context cells (prompt and committed), how many it left out, how many
    positions before the block the stream skipped (counted, never passed over in silence), and the pieces of
    every token it names (as written and as shown), with the visualizer's vocabulary."""
    hidden = max(0, len(context) - max_context)
    shown = [list(cell) for cell in context[hidden:]]
    missing = int(round_ev.get("block_start") or 0) - (context[-1][0] + 1 if context else 0)
    extra = round_ev.get("extra") or {}
    replaced = [] if extra.get("replaced_draft") is None else [extra["replaced_draft"]]
    named: list[int] = [cell[1] for cell in context[hidden:]] + list(round_ev.get("tokens") or []) \
        + list(round_ev.get("committed") or []) + list(extra.get("guess") or []) + replaced
    pieces = {str(t): piece(int(t)) for t in dict.fromkeys(named)}
    lanes = tree_lanes(round_ev)
    shaped = {**round_ev, "accepted": accepted_count(round_ev), **({"lanes": lanes} if lanes is not None else {})}
    return json.dumps({"round": shaped, "context": shown,
                       "hidden": hidden, "missing": max(0, missing), "pieces": pieces, "shown": shown_pieces(pieces),
                       "vocab": vocabulary()})


def shown_pieces(pieces: Mapping[str, str]) -> dict[str, str]:
    """Each piece as a grid shows it (visible)."""
    return {k: visible(v) for k, v in pieces.items()}


def accepted_count(round_ev: Event) -> int:
    """A round's accepted count: its `accepted`, or its accepted cells where a stored run has no such field."""
    accepted = round_ev.get("accepted")
    return int(accepted) if accepted is not None else list(round_ev.get("states") or []).count("accepted")


def tree_lanes(round_ev: Event) -> list[int] | None:
    """The row of each cell of a tree round (`extra.layout` "tree": the seed, the tree's nodes in verify-row order,
    the bonus), as the token grid and the confidence chart both draw it (app/static/viz.js), every cell at its true
    position, block_start + extra.offsets[i]: row 0 the line the round committed (the seed, the accepted path, the
    bonus), then each branch's nodes off that path on a row of their own (a branch with two nodes at one depth
    takes a further row), so that no row holds two cells at one position. None for a round that is no tree. (A
    round cut after an end token keeps its first cells, and the offsets of all.)"""
    extra = round_ev.get("extra") or {}
    tree = extra.get("tree")
    tokens = list(round_ev.get("tokens") or [])
    offsets = list(extra.get("offsets") or [])[:len(tokens)]
    if not isinstance(tree, Mapping) or len(offsets) != len(tokens):
        return None
    branches = list(tree.get("branches") or [])
    path = set(tree.get("path") or [])
    rows: list[tuple[int | None, set[int]]] = [(None, set())]    # (branch, offsets taken) per row; row 0: the line
    lanes = []
    for i, offset in enumerate(offsets):
        node = i - 1
        branch = None if node < 0 or node >= len(branches) or node in path else branches[node]
        lane = next((k for k, (b, taken) in enumerate(rows) if b == branch and offset not in taken), None)
        if lane is None:
            rows.append((branch, set()))
            lane = len(rows) - 1
        rows[lane][1].add(offset)
        lanes.append(lane)
    return lanes


# -- charts ---------------------------------------------------------------------------------------------------------


def add_cursor(fig: go.Figure, **where: Any) -> None:
    """The round cursor (a dotted vertical line at round 0) that app/static/viz.js moves without redrawing."""
    fig.add_vline(x=0, line={"color": "#111827", "width": 2, "dash": "dot"}, name="cursor", **where)


def int_axis(title: str, span: int) -> dict[str, Any]:
    """An integer axis: whole-number ticks only (no 0.5 ticks on short ranges)."""
    return {"title": title, "tickformat": "d", "dtick": 1 if span <= 12 else None}


def legend_top() -> dict[str, Any]:
    """A horizontal legend under the plot: on a narrow box a legend above it ran into the title."""
    return {"orientation": "h", "y": -0.32, "yanchor": "top", "x": 0, "xanchor": "left"}


LEGEND_BELOW_MARGIN = {"l": 50, "r": 50, "t": 40, "b": 78}
"""Room under the x axis for legend_top's legend."""


def accepted_length_figure(rounds: Sequence[Event]) -> go.Figure:
    """Accepted count per round (bars) with the committed count on an axis of its own (a block mode commits a
    whole block at once, which would flatten the bars); click a bar to jump to its round."""
    x = [r["round"] for r in rounds]
    accepted = [accepted_count(r) for r in rounds]
    committed = [len(r.get("committed") or []) for r in rounds]
    fig = go.Figure([
        go.Bar(x=x, y=accepted, name="accepted", marker_color="#22c55e",
               customdata=[[c, r.get("nfe")] for c, r in zip(committed, rounds, strict=True)],
               hovertemplate="round %{x}<br>accepted %{y}<br>committed %{customdata[0]}<br>"
                             "NFE +%{customdata[1]}<extra></extra>"),
        go.Scatter(x=x, y=committed, name="committed (right axis)", mode="lines+markers", yaxis="y2",
                   line={"color": "#3b82f6", "shape": "hvh"}, hoverinfo="skip"),   # level centred on its bar
    ])
    add_cursor(fig)
    fig.update_layout(**{**LAYOUT, "margin": LEGEND_BELOW_MARGIN}, title="accepted per round (click: jump)",
                      height=290, bargap=0.15, xaxis=int_axis("round", len(x)),
                      yaxis=int_axis("accepted", max(accepted, default=0)),
                      yaxis2={**int_axis("committed", max(committed, default=0)), "overlaying": "y", "side": "right",
                              "showgrid": False, "rangemode": "tozero"},
                      legend=legend_top())
    return fig


def kv_figure(intervals: Sequence[Event], n_rounds: int) -> go.Figure:
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
    add_cursor(fig)
    layout = {**LAYOUT, "margin": {**LEGEND_BELOW_MARGIN, "l": 60}}
    fig.update_layout(**layout, title="KV slots: alloc → free round",
                      barmode="overlay", xaxis={**int_axis("round", n_rounds), "range": [-0.5, n_rounds - 0.5]},
                      height=min(220 + 6 * len(slots), 640), legend=legend_top())
    fig.update_yaxes(categoryorder="array", categoryarray=[f"slot {s}" for s in reversed(slots)],
                     showticklabels=len(slots) <= 40, title="KV slot")
    return fig


def phase_timeline_figure(rounds: Sequence[Event]) -> go.Figure:
    """Each round's forward phases on the run's wall clock (Perfetto-style): a lane per phase kind, a bar per phase
    of its measured ms, laid end to end so the round's last phase ends at its event's t_ms; click a bar for its
    round."""
    lanes: dict[str, dict[str, list[Any]]] = {}
    for r in rounds:
        phases = r.get("phases") or []
        start = float(r.get("t_ms") or 0.0) - sum(float(p.get("ms") or 0.0) for p in phases)
        for p in phases:
            ms, kind = float(p.get("ms") or 0.0), str(p.get("kind") or "?")
            lane = lanes.setdefault(kind, {"base": [], "x": [], "custom": []})
            lane["base"].append(start)
            lane["x"].append(max(ms, 0.01))
            lane["custom"].append([r.get("round"), p.get("attn"), p.get("n_query"), "on" if p.get("lora") else "off",
                                   ms])
            start += ms
    fig = go.Figure()
    for kind, lane in lanes.items():
        fig.add_trace(go.Bar(base=lane["base"], x=lane["x"], y=[kind] * len(lane["x"]), orientation="h", name=kind,
                             marker_color=phase_color(kind), customdata=lane["custom"],
                             hovertemplate="round %{customdata[0]} · %{y} · %{customdata[4]:.2f} ms<br>attention "
                                           "%{customdata[1]} · %{customdata[2]} query rows · LoRA %{customdata[3]}"
                                           "<extra></extra>"))
    fig.update_layout(**LAYOUT, title="forward phases on the wall clock", barmode="overlay", showlegend=False,
                      height=140 + 34 * max(len(lanes), 1), xaxis={"title": "ms since the run began"},
                      yaxis={"title": "phase"})
    return fig


def kv_time_figure(intervals: Sequence[Event], rounds: Sequence[Event]) -> go.Figure:
    """KV slots held against wall-clock time after each round, stacked by how each occupancy ended (the slot
    lifecycle chart's colours); click a point for its round."""
    order = [r.get("round") for r in rounds]
    index = {n: i for i, n in enumerate(order)}
    deltas: dict[str | None, list[int]] = {}
    for iv in intervals:
        reason = iv.get("end_reason")
        delta = deltas.setdefault(reason, [0] * (len(order) + 1))
        delta[index.get(iv.get("alloc_round"), 0)] += 1
        if iv.get("free_round") is not None and iv["free_round"] in index:
            delta[index[iv["free_round"]]] -= 1   # freed during that round: not held after it
    times = [float(r.get("t_ms") or 0.0) for r in rounds]
    fig = go.Figure()
    for reason, delta in deltas.items():
        held, running = [], 0
        for d in delta[:len(order)]:
            running += d
            held.append(running)
        fig.add_trace(go.Scatter(x=times, y=held, customdata=order, stackgroup="kv", mode="lines",
                                 name=reason or "never freed", line={"color": kv_color(reason), "width": 1},
                                 hovertemplate="round %{customdata} · %{x:.0f} ms<br>%{y} slots held"
                                               f" ({KV_REASONS.get(reason, ('', str(reason)))[1]})<extra></extra>"))
    fig.update_layout(**LAYOUT, title="KV slots held over time, by how they ended", height=260,
                      legend={"orientation": "h", "y": -0.3, "yanchor": "top", "x": 0},
                      xaxis={"title": "ms since the run began"}, yaxis={"title": "slots held"})
    return fig


def acceptance_position_figure(rates: Sequence[float]) -> go.Figure:
    """vLLM's acceptance_rate_per_position: the share of verify steps whose i-th draft was accepted."""
    x = list(range(1, len(rates) + 1))
    fig = go.Figure(go.Bar(x=x, y=list(rates), marker_color="#8b5cf6", text=[f"{v:.0%}" for v in rates],
                           textposition="outside", cliponaxis=False,
                           hovertemplate="draft position %{x}<br>accepted in %{y:.1%} of verify steps<extra></extra>"))
    fig.update_layout(**LAYOUT, title="acceptance rate per position", height=240, showlegend=False,
                      xaxis=int_axis("draft position", len(x)),
                      yaxis={"title": "acceptance rate", "range": [0, 1.12], "tickformat": ".0%"})
    return fig


def case_figure(rounds: Sequence[Event]) -> go.Figure:
    """A run whose rounds record their case (ISD): the V/R/C case of every round (bar height = accepted length);
    click a bar to jump to its round."""
    fig = go.Figure()
    for case, (color, meaning) in CASES.items():
        chosen = [r for r in rounds if r.get("case") == case]
        fig.add_trace(go.Bar(x=[r["round"] for r in chosen], y=[r.get("accepted_len") for r in chosen], name=case,
                             marker_color=color, hovertemplate=f"round %{{x}}<br>{meaning}<br>accepted %{{y}}"
                                                               "<extra></extra>"))
    add_cursor(fig)
    top = max((r.get("accepted_len") or 0 for r in rounds), default=0)
    fig.update_layout(**{**LAYOUT, "margin": LEGEND_BELOW_MARGIN}, title="ISD round case (V / R / C)", height=270,
                      legend=legend_top(),
                      xaxis=int_axis("round", len(rounds)), yaxis=int_axis("accepted", top))
    return fig


NO_MODES = ModeBook()
"""No declarations at hand: every mode in the neutral colour, no claims, no baseline."""
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross")
PATTERNS = ("", "/", ".", "x", "-", "+")


def mode_color(mode: str, book: ModeBook = NO_MODES) -> str:
    """A mode's colour, the same in every comparison: the one it declares (`book`: the served modes)."""
    return book.color(mode)


def run_labels(runs: Sequence[RunTrace]) -> list[str]:
    """Each run's name in a comparison: its mode, plus the parameters that differ between runs of that mode."""
    labels = []
    for run in runs:
        same_mode = [r.params for r in runs if r.mode == run.mode]
        varied = sorted(k for k in run.params if any(p.get(k) != run.params[k] for p in same_mode))
        labels.append(" ".join([run.mode, *(f"{k}={run.params[k]}" for k in varied)]))
    return labels


def comparison_figure(runs: Sequence[RunTrace], book: ModeBook = NO_MODES) -> go.Figure:
    """Output tokens (as the table counts them) vs cumulative NFE, one step line per run: each mode in its declared
    colour, a different dash and marker per run of the same mode, so identical lines stay visible."""
    fig = go.Figure()
    seen: dict[str, int] = {}
    for run, label in zip(runs, run_labels(runs), strict=True):
        k = seen[run.mode] = seen.get(run.mode, -1) + 1
        nfe, tokens = run.progress()
        limit = run.metrics.get("tokens")
        if limit is not None:  # the table's count (EOS and stop tokens excluded)
            tokens = [min(t, int(limit)) for t in tokens]
        fig.add_trace(go.Scatter(x=nfe, y=tokens, mode="lines+markers", line={"shape": "hv",
                                 "color": mode_color(run.mode, book), "dash": DASHES[k % len(DASHES)], "width": 2},
                                 marker={"symbol": SYMBOLS[k % len(SYMBOLS)], "size": 7},
                                 name=f"{label} · {run.run_id[-6:]}",
                                 hovertemplate="NFE %{x}<br>tokens %{y}<extra>" + esc(label) + "</extra>"))
    fig.update_layout(**LAYOUT, title="output tokens vs forward passes (NFE)", height=340,
                      xaxis={"title": "cumulative NFE", "tickformat": "d"},
                      yaxis={"title": "output tokens", "tickformat": "d"}, legend={"orientation": "h", "y": -0.25})
    return fig


# -- tables, diffs, sparklines --------------------------------------------------------------------------------------

DEFINITIONS = {  # one definition per figure, shown as the hover of its label wherever it appears
    "tokens": "tokens generated (up to EOS)",
    **ROUND_COUNTS,
    "NFE": "forward passes of the model, prefill excluded",
    "TPF": "tokens per forward: tokens / NFE",
    "tok/s": "tokens per second of wall clock, prefill included",
    "wall ms": "the run's wall-clock time",
    "tokens / round": "tokens a round committed (its accepted_len: kept drafts plus any bonus or correction), "
                      "the mean over rounds after the prefill",
    "mean acc. length (vLLM)": "vLLM's mean_acceptance_length: 1 + drafts accepted / verify steps (the bonus "
                               "counted as the 1, as vLLM does)",
    "draft acc. rate (vLLM)": "vLLM's draft_acceptance_rate: drafts accepted / drafts verified",
    "drafts accepted": "drafted positions the verifier kept (the bonus token not counted)",
    "drafted": "drafted positions a verify step checked",
    "verify steps": "rounds whose forward verified drafts",
    "KV peak": "most KV slots the run held at once",
    "KV leaked": "KV slots still held after the run ended (must be 0)",
    "model's pick": ("the run's tokens that the served model picks itself (greedy) after the same prefix, of all, "
                     "and in brackets their mean negative log-likelihood under it (nats): teacher-forced on the "
                     "run's prompt and answer; every token for a lossless greedy run"),
}
METRIC_COLUMNS: tuple[tuple[str, str, int | str], ...] = (
                  ("tokens", "tokens", 0), ("nfe", "NFE", 0), ("tpf", "TPF", 2), ("tok_per_s", "tok/s", 1),
                  ("wall_ms", "wall ms", 0), ("accept_len_mean", "tokens / round", 2),
                  ("mean_acceptance_length", "mean acc. length (vLLM)", 2),
                  ("draft_acceptance_rate", "draft acc. rate (vLLM)", PERCENT),
                  ("kv_peak", "KV peak", 0), ("kv_leaked", "KV leaked", 0))


def defined(label: str, definition: str | None = None) -> str:
    """A table header: the label, with its definition (DEFINITIONS' by default) as the hover."""
    return f'<th title="{esc(DEFINITIONS.get(label, "") if definition is None else definition)}">{esc(label)}</th>'


Column = tuple[str, str, int | str]
"""A metric column: the run metric's key, its label, its format (digits, or PERCENT)."""


def metric_columns(runs: Sequence[RunTrace], book: ModeBook = NO_MODES) -> list[Column]:
    """METRIC_COLUMNS, then the columns the runs' modes declare of their own metrics (Mode.columns), before the KV
    columns."""
    own = [(c["key"], c["label"], PERCENT if c.get("format") == PERCENT else int(c.get("format") or 2))
           for c in book.columns(run.mode for run in runs)]
    kv = [c for c in METRIC_COLUMNS if c[0].startswith("kv_")]
    return [c for c in METRIC_COLUMNS if c not in kv] + own + kv


def column_definitions(book: ModeBook) -> dict[str, str]:
    """The declared columns' definitions by label."""
    return {c["label"]: c.get("definition", "") for c in book.all_columns()}


def run_metrics(run: RunTrace) -> dict[str, Any]:
    """A run's stored metrics plus its vLLM-style spec-decode metrics."""
    return {**run.metrics, **(spec_metrics(run) or {})}


def metrics_rows(runs: Sequence[RunTrace], book: ModeBook = NO_MODES) -> list[list[Any]]:
    """The comparison table as data (header first): one row per run, for the HTML table and the CSV export; the
    columns are `metric_columns`'."""
    columns = metric_columns(runs, book)
    head = ["run", "mode", "label", "status", *[label for _, label, _ in columns]]
    rows = []
    for run, label in zip(runs, run_labels(runs), strict=True):
        m = run_metrics(run)
        rows.append([run.run_id, run.mode, label, run.status, *[m.get(key) for key, _, _ in columns]])
    return [head, *rows]


def comparison_rows(runs: Sequence[RunTrace], reference: RunTrace | None,
                    book: ModeBook = NO_MODES) -> list[list[Any]]:
    """The comparison as data for its CSV: the metrics table's rows, then the two verdicts (output against the
    reference, the mode's own lossless claim), the prompt and the output text."""
    head, *rows = metrics_rows(runs, book)
    claims = book.claims
    extra = [[text_of(output_verdict(run, reference)), text_of(lossless_verdict(run, runs, claims)), run.prompt,
              run.text] for run in runs]
    return [head + ["output vs reference", "lossless claim", "prompt", "output"],
            *[row + more for row, more in zip(rows, extra, strict=True)]]


def text_of(found: Verdict | None) -> str:
    return "" if found is None else found[1]


def badge(css: str, text: str) -> str:
    return f'<span class="ss-badge {css}">{esc(text)}</span>'


def outcome(run: RunTrace) -> Outcome:
    """What the lossless verdict reads of a run (its weights: the hash where recorded, else the model's name)."""
    return Outcome(run.mode, run.output_ids, run.params, run.status, run.model_hash or run.model, run.matmul,
                   run.prompt_ids, run.forward or None)


Verdict = tuple[str, str]
"""A verdict as the table shows it: its badge's class and its text."""


def lossless_verdict(run: RunTrace, runs: Sequence[RunTrace], claims: Mapping[str, Claim]) -> Verdict | None:
    """The verdict on a mode's own lossless claim (its declared `lossless_vs`), given only where the claim holds for
    this run's settings (greedy, the declared parameters) and against a done, greedy run of the claim's reference
    mode on the same model, prompt and max_new_tokens. Elsewhere it says why there is none, with the measured
    agreement; a run that did not finish gets none."""
    claim = claims.get(run.mode)
    if claim is None:
        return None
    if run.status != "done":
        return ("ss-bad", f"no verdict: the run {run.status}")
    mine = outcome(run)
    bases = [outcome(r) for r in runs if r.mode == claim.reference and r.status == "done" and r is not run]
    if bases and all(model_difference(mine, b) for b in bases):
        why = model_difference(mine, bases[0])
        return ("ss-ref", f"{claim.reference} is of a different model" if why == "different model"
                     else f"{claim.reference} ran with {why}")
    off = unmet(mine, claim)
    sampled = f"{claim.reference} sampled"
    found = [verdict(mine, b, claim) for b in bases]
    comparable = [v for v in found if set(v.blockers) <= {*off, sampled}]
    if off:
        measured = f" · {comparable[0].agreement()}" if comparable else ""
        return ("ss-ref", f"not claimed ({', '.join(off)}){measured}")
    checked = [v for v in comparable if v.checked]
    if not checked:
        return ("ss-ref", f"add a greedy {claim.reference} run of this prompt to check")
    return ("ss-ok", f"== {claim.reference}") if checked[0].holds else \
        ("ss-bad", f"≠ {claim.reference} ({checked[0].agreement()})")


def lossless_badge(run: RunTrace, runs: Sequence[RunTrace], claims: Mapping[str, Claim]) -> str:
    found = lossless_verdict(run, runs, claims)
    return "" if found is None else badge(*found)


def output_verdict(run: RunTrace, reference: RunTrace | None) -> Verdict | None:
    """Whether the run's output equals the reference run's, or why that cannot be said."""
    if reference is None:
        return None
    if run is reference:
        return "ss-ref", "reference"
    if run.status != "done" or reference.status != "done":
        return "ss-bad", "no verdict: a run did not finish"
    if why := model_difference(outcome(reference), outcome(run)):
        return "ss-ref", why
    return ("ss-ok", "same output as reference") if run.output_ids == reference.output_ids else \
        ("ss-bad", "differs from reference")


def status_cell(run: RunTrace) -> str:
    """The run's status, with the reason when it failed."""
    return esc(run.status) + (f'<br><small class="ss-error">{esc(run.error)}</small>' if run.error else "")


PICK_LABEL = "model's pick"


def pick_words(fit: Mapping[str, Any]) -> str:
    """A rating (GET /api/runs/{id}/fit) in words: '39 of 39 tokens are the model's own pick; mean NLL 0.19 nats'."""
    if not fit.get("tokens"):
        return "no tokens to rate"
    return (f"{fit['greedy']} of {plural(fit['tokens'], 'token')} {'is' if fit['greedy'] == 1 else 'are'} the "
            f"model's own pick; mean NLL {fit['nll_mean']:.2f} nats")


def pick_cell(fit: Mapping[str, Any] | str | None) -> str:
    """A run's rating by the served model in words (`pick_words`; the short form '12/12 (0.58)' as its hover), or
    why there is none."""
    if fit is None:
        return ""
    if isinstance(fit, str):
        return f'<small>{esc(fit)}</small>'
    return f'<small class="ss-pick" title="{esc(pick_count(fit))}">{esc(pick_words(fit))}</small>'


def metrics_table_html(runs: Sequence[RunTrace], reference: RunTrace | None = None, book: ModeBook = NO_MODES,
                       fits: Mapping[str, Mapping[str, Any] | str] | None = None) -> str:
    """One row per run with its metrics (`metric_columns`: the runs' modes' own columns too), the served model's
    rating of its answer (`fits` by run id: the /api/runs/{id}/fit answer, or why there is none), a badge saying
    whether its output equals the reference's (none for a run that did not finish), the verdict on the mode's own
    lossless claim (`lossless_badge`, from the modes' declarations in `book`) and a link that opens the run in the
    visualizer; each run's name in its mode's colour. Scrolls sideways on a narrow screen."""
    columns = metric_columns(runs, book)
    definitions = column_definitions(book)
    head = "".join(defined(label, definitions.get(label)) for _, label, _ in columns)
    claims = book.claims
    rows = []
    for run, values in zip(runs, metrics_rows(runs, book)[1:], strict=True):
        cells = "".join(f"<td>{esc(fmt(v, digits))}</td>" for v, (_, _, digits) in zip(values[4:], columns,
                                                                                          strict=True))
        found = output_verdict(run, reference)
        same = "" if found is None else badge(*found)
        link = (f'<a class="ss-open" href="?run={esc(run.run_id)}&amp;round=0" target="_blank">open ↗</a>'
                if run.run_id else "")
        rows.append(f'<tr><td><b style="color:{mode_color(run.mode, book)}">{esc(values[2])}</b><br>'
                    f'<code>{esc(run.run_id or "(not started)")}</code> {link}{alarm_html(run.metrics)}'
                    f'{tier_html(run)}</td>'
                    f'<td>{status_cell(run)}</td>'
                    f'{cells}<td>{pick_cell((fits or {}).get(run.run_id))}</td><td>{same}</td>'
                    f'<td>{lossless_badge(run, runs, claims)}</td></tr>')
    return (f'<div class="ss-scroll"><table class="ss-table"><thead><tr><th>run</th><th>status</th>{head}'
            f'{defined(PICK_LABEL)}<th>output</th><th>lossless claim</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def speedup_html(runs: Sequence[RunTrace], book: ModeBook = NO_MODES) -> str:
    """The speedup explained: each finished run's tok/s against the first finished run of the baseline's (the
    exact mode `book` declares), as its three measured factors (TPF ratio × row cost × forward share ratio), their
    product, and the measured ratio."""
    exact = esc(book.baseline or "exact")
    base = next((r for r in runs if r.mode == book.baseline and r.status == "done"), None)
    if base is None:
        return (f'<div class="ss-note" id="cmp-speedup">The speedup explained needs a finished <code>{exact}</code> '
                "run in the comparison.</div>")
    rows = []
    for run, label in zip(runs, run_labels(runs), strict=True):
        found = against_baseline(run.metrics, base.metrics) if run is not base and run.status == "done" else None
        if found:
            found = shown(found)
            rows.append(f"<tr><td><b style=\"color:{mode_color(run.mode, book)}\">{esc(label)}</b></td>"
                        + "".join(f'<td class="ss-num">{found[k]:.{DIGITS}f}</td>' for k in FACTORS)
                        + f'<td class="ss-num"><b>{found["product"]:.{DIGITS}f}×</b></td>'
                          f'<td class="ss-num">{found["measured"]:.{DIGITS}f}×</td></tr>')
    if not rows:
        return ""
    return (f'<div class="ss-scroll" id="cmp-speedup"><b>the speedup explained</b> (against the <code>{exact}</code> '
            f"run: tok/s ratio = TPF ratio × row cost, {exact}'s mean forward ms ÷ the run's, × forward share ratio, "
            f"the run's share of wall time in forwards ÷ {exact}'s)<table class=\"ss-table\"><thead><tr><th>run</th>"
            "<th>TPF</th><th>× row cost</th><th>× forward share</th><th>= product</th><th>measured</th></tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table></div>")


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


WHITESPACE = str.maketrans({" ": "&#32;", "\n": "&#10;", "\t": "&#9;", "\r": "&#13;"})


MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")  # raw HTML in the source is shown as text


def markdown_html(text: str) -> str:
    """A model's answer as Markdown (code blocks, lists, tables): any HTML it writes is escaped, shown as written, and
    links keep only safe schemes (markdown-it's validateLink)."""
    return f'<div class="ss-md">{MARKDOWN.render(text)}</div>'


def pre_html(text: str) -> str:
    """Text as a preformatted block, escaped, its whitespace as character references (so a chat message's
    indentation and blank lines survive Gradio's clean-up of leading whitespace)."""
    return f'<pre class="ss-answer">{esc(text).translate(WHITESPACE)}</pre>'


def warning_html(problem: Exception | str) -> str:
    return badge("ss-bad", f"⚠ {problem}")


def sparkline(values: Sequence[float], width: int = 48) -> str:
    """A one-line unicode bar chart of at most `width` bars (a longer series is averaged in equal bins)."""
    bars = "▁▂▃▄▅▆▇█"
    if not values:
        return ""
    if len(values) > width:
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [sum(values[a:b]) / (b - a) for a, b in zip(edges, edges[1:], strict=False) if b > a]
    if min(values) == max(values):
        return bars[3] * len(values)
    top = max(values)
    return "".join(bars[min(int(v / top * (len(bars) - 1) + 0.5), len(bars) - 1)] for v in values)


STOP_ICON = ('<svg class="ss-icon" viewBox="0 0 10 10" width="10" height="10" aria-hidden="true">'
             '<rect width="10" height="10" rx="1.5" fill="currentColor"/></svg>')
"""The stop square as inline SVG: a glyph such as U+23F9 is an empty box where the fonts lack it."""
CANCELLED_BY = {"client": "stopped", "model_switch": "cancelled: the server switched models",
                "shutdown": "cancelled: the server shut down"}
"""What a cancelled run's note says, by run_end's reason (after STOP_ICON)."""


def run_stats_html(run: RunTrace) -> str:
    """The stats line shown under a chat answer (HTML: the chat renders no Markdown)."""
    m = run.metrics
    if run.error:
        return f"⚠ {esc(run.error)}"
    accepted = run.accepted_lens[1:]  # round 0 is the prefill
    cut = stop_note(run)
    note = f"{STOP_ICON} {CANCELLED_BY.get(run.cancel_reason or 'client', CANCELLED_BY['client'])} · " \
        if run.status == "cancelled" else f'<span class="ss-stop-note">{esc(cut)}</span> · ' if cut else ""
    return (f'<span class="ss-stats">{note}<b>{esc(run.mode)}</b> · TPF {fmt(m.get("tpf"), 2)} · NFE '
            f'{fmt(m.get("nfe"))} · {fmt(m.get("tok_per_s"), 1)} tok/s · '
            f'<span title="{esc(DEFINITIONS["tokens / round"])}">tokens/round</span> '
            f'{sparkline(accepted) or "—"} (max {max(accepted, default=0)}) · run <code>{esc(run.run_id)}</code> '
            f'({esc(run.status)}) · model <b class="ss-model">{esc(run.model or "?")}</b>{alarm_html(m)}'
            f'{tier_html(run)}</span>')


def stop_note(run: RunTrace) -> str:
    """'stopped at 64 tokens (max_new_tokens)' for a run that max_new_tokens cut before the model ended it (a run
    that ends with EOS counts fewer tokens than max_new_tokens); '' otherwise."""
    limit = run.params.get("max_new_tokens")
    if run.status != "done" or limit is None or run.metrics.get("tokens") != limit:
        return ""
    return f"stopped at {plural(limit, 'token')} (max_new_tokens)"


def tier_html(run: RunTrace) -> str:
    """A run's load-tier note (RunTrace.tier_note) as a warning line, or '' when no tier cut its drafting."""
    note = run.tier_note
    return f'<span class="ss-tier-note ss-badge ss-bad">⚠ {esc(note)}</span>' if note else ""


def alarm_html(metrics: Mapping[str, Any]) -> str:
    """A run's acceptance alarm (run_end's `alarm`: "garbled drafts" or "loop") as a warning badge with its `why` as
    the hover; '' for an unflagged run or one stored before the alarm was recorded."""
    found = metrics.get("alarm") or {}
    if not found.get("flag"):
        return ""
    return (f'<span class="ss-alarm ss-badge ss-bad" title="{esc(found.get("why") or found["flag"])}">'
            f'⚠ {esc(found["flag"])}</span>')


def acceptance_rates(metrics: Mapping[str, Any]) -> list[float]:
    """The share of a run's drafts whose token at each draft position was accepted: num_accepted_tokens_per_pos
    over num_drafts (run_end's vLLM counts); [] for a run that drafted nothing or stored no counts."""
    drafts, per_pos = metrics.get("num_drafts"), metrics.get("num_accepted_tokens_per_pos") or []
    return [n / drafts for n in per_pos] if drafts else []


def acceptance_by_position_figure(runs: Sequence[RunTrace], book: ModeBook = NO_MODES) -> go.Figure:
    """Per drafting run, the share of its drafts accepted at each draft position (`acceptance_rates`), as grouped
    bars in the run's mode's declared colour (runs of one mode told apart by their bars' pattern)."""
    fig = go.Figure()
    seen: dict[str, int] = {}
    depth = 0
    for run, label in zip(runs, run_labels(runs), strict=True):
        rates = acceptance_rates(run.metrics)
        if not rates:
            continue
        k = seen[run.mode] = seen.get(run.mode, -1) + 1
        depth = max(depth, len(rates))
        per_pos, drafts = run.metrics["num_accepted_tokens_per_pos"], run.metrics["num_drafts"]
        fig.add_trace(go.Bar(x=list(range(1, len(rates) + 1)), y=rates, name=f"{label} · {run.run_id[-6:]}",
                             marker={"color": mode_color(run.mode, book),
                                     "pattern": {"shape": PATTERNS[k % len(PATTERNS)]}},
                             customdata=[[n, drafts] for n in per_pos],
                             hovertemplate="draft position %{x}: %{customdata[0]} of %{customdata[1]} drafts "
                                           "accepted (%{y:.0%})<extra>" + esc(label) + "</extra>"))
    title = "acceptance by draft position" if fig.data else "acceptance by draft position: no run drafted"
    fig.update_layout(**{**LAYOUT, "margin": LEGEND_BELOW_MARGIN}, title=title, height=280, barmode="group",
                      xaxis=int_axis("draft position", depth), legend=legend_top(),
                      yaxis={"title": "accepted / drafts", "range": [0, 1.05], "tickformat": ".0%"})
    return fig


LOAD_TOLERANCE = 0.5
"""Runs whose 1-row forward ms differ from the reference's by more than this share were measured under other load."""


def one_row_ms(run: RunTrace) -> float | None:
    """The mean ms of the run's forwards (prefills left out) as a forward of one row of its own: each forward's ms
    scaled by the run's cost curve from the rows it computed for the run to one row (a forward shared with other
    runs' rows, or slowed by other work on the machine, counts as slower); without a cost curve, the mean ms of its
    1-row forwards. None when it has neither."""
    phases = [p for r in run.rounds for p in r.get("phases") or [] if p.get("kind") != "prefill" and p.get("ms")]
    if run.cost_curve:
        curve = CostCurve.from_json(run.cost_curve)
        scaled = [float(p["ms"]) * curve.at(1) / curve.at(max(int(p.get("n_query") or 1), 1)) for p in phases]
    else:
        scaled = [float(p["ms"]) for p in phases if int(p.get("n_query") or 0) == 1]
    return sum(scaled) / len(scaled) if scaled else None


def load_warning_html(runs: Sequence[RunTrace], reference: RunTrace | None) -> str:
    """A warning naming the runs measured under other load than the reference (the first run with a figure where
    the reference has none): each one's mean 1-row forward ms (`one_row_ms`) against the reference's and by how
    much, when they differ by more than LOAD_TOLERANCE; '' when none do."""
    figures = {id(r): one_row_ms(r) for r in runs if r.status != "running"}
    labels = dict(zip((id(r) for r in runs), run_labels(runs), strict=True))
    base = reference if reference is not None and figures.get(id(reference)) else \
        next((r for r in runs if figures.get(id(r))), None)
    if base is None:
        return ""
    base_ms = figures[id(base)]
    assert base_ms is not None
    off = []
    for run in runs:
        ms = figures.get(id(run))
        if run is base or not ms or abs(ms / base_ms - 1) <= LOAD_TOLERANCE:
            continue
        how = f"{ms / base_ms:.1f}× slower" if ms > base_ms else f"{base_ms / ms:.1f}× faster"
        off.append(f"<li><b>{esc(labels[id(run)])}</b> <code>{esc(run.run_id)}</code>: {ms:.2f} ms, {how}</li>")
    if not off:
        return ""
    return (f'<div class="ss-note ss-load-warning" id="cmp-load">⚠ <b>measured under different load</b>: the mean '
            f'1-row forward ms (each forward scaled to one row of the run\'s own) of '
            f'{"this run" if len(off) == 1 else "these runs"} differs from <b>{esc(labels[id(base)])}</b> '
            f'<code>{esc(base.run_id)}</code>\'s {base_ms:.2f} ms by more than {LOAD_TOLERANCE:.0%}, so their tok/s '
            f'and speedups are not comparable:<ul>{"".join(off)}</ul></div>')


def legend_html() -> str:
    """Every colour used by the grid and the charts, with its meaning."""
    def swatch(color: str, label: str, meaning: str, css_class: str = "") -> str:
        return (f'<span class="ss-legend-item"><span class="ss-swatch {css_class}" style="background:{color}">'
                f'</span><b>{html.escape(label)}</b> {html.escape(meaning)}</span>')

    states = "".join(swatch(bg, s, m, f"ss-s-{s}") for s, (bg, _, m) in STATES.items())
    kv = "".join(swatch(c, r or "held", m) for r, (c, m) in KV_REASONS.items())
    cases = "".join(swatch(c, k, m) for k, (c, m) in CASES.items())
    counts = "".join(f'<span class="ss-legend-item" data-count="{k}"><b>{esc(k)}</b> {esc(m)}</span>'
                     for k, m in ROUND_COUNTS.items())
    return (f'<div class="ss-legend"><div><b>token states</b> {states}</div><div><b>round counts</b> {counts}</div>'
            f'<div><b>KV slot end</b> {kv}</div><div><b>ISD round case</b> {cases}</div></div>')
