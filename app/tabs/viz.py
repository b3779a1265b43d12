"""Visualizer tab: pick a stored run, step through its rounds (buttons, slider, arrow keys) or autoplay them."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.client import BackendError, BackendUnavailable
from app.figures import (
    accepted_length_figure,
    branches_html,
    confidence_figure,
    fmt,
    fold_figure,
    isd_figure,
    kv_figure,
    legend_html,
    token_grid_html,
    warning_html,
)
from app.plot import MOVE_CURSOR_JS, chart, figure_json
from app.session import Backend
from app.trace import Piece, RunTrace

FAST: dict[str, Any] = {"concurrency_limit": None, "show_progress": "hidden"}  # cheap, frequent events


@dataclass
class VizTab:
    run: gr.Dropdown


def run_summary(trace: RunTrace) -> str:
    m = trace.metrics
    params = ", ".join(f"{k}={v}" for k, v in trace.params.items())
    head = (f"{trace.mode} · {trace.run_id} · {trace.status} · {len(trace.rounds)} rounds · NFE {fmt(m.get('nfe'))}"
            f" · TPF {fmt(m.get('tpf'), 2)}")
    rows = [("prompt", trace.prompt), ("params", params), ("output", trace.text)]
    body = "".join(f"<div><b>{k}</b> <code>{html.escape(v)}</code></div>" for k, v in rows)
    return f'<div class="ss-summary"><b>{html.escape(head)}</b>{body}</div>'


def run_charts(trace: RunTrace) -> list[str]:
    """The charts drawn once per run (their round cursor moves in the browser): accepted length, KV slots."""
    n_rounds = trace.rounds[-1]["round"] + 1
    return [figure_json(accepted_length_figure(trace.rounds, 0)), figure_json(kv_figure(trace.kv, n_rounds + 1, 0))]


def round_panels(trace: RunTrace, index: int, piece: Piece) -> list[Any]:
    """Grid, confidence, ISD, branches and fold panels of round `index`; per-mode panels only when data exists."""
    rnd = trace.rounds[index]
    has_conf = any(c is not None for c in rnd.get("conf") or [])
    has_isd = any(x.get("case") for x in trace.rounds)
    has_branches = bool(rnd.get("branches"))
    has_fold = bool(rnd.get("fold"))
    return [
        token_grid_html(rnd, piece, trace.context(index)),
        gr.HTML(figure_json(confidence_figure(rnd, piece, trace.params.get("threshold")) if has_conf else None),
                visible=has_conf),
        gr.HTML(figure_json(isd_figure(trace.rounds, rnd["round"]) if has_isd else None), visible=has_isd),
        gr.HTML(branches_html(rnd, piece), visible=has_branches),
        gr.HTML(figure_json(fold_figure(rnd) if has_fold else None), visible=has_fold),
    ]


def build_viz(backend: Backend, tab: gr.Tab) -> VizTab:
    with gr.Column(elem_id="viz-panel"):
        with gr.Row():
            run = gr.Dropdown(label="run", choices=[], allow_custom_value=True, elem_id="viz-run", scale=4)
            refresh = gr.Button("↻ runs", elem_id="viz-refresh", scale=0, min_width=80)
        summary = gr.HTML(elem_id="viz-summary")
        with gr.Row(equal_height=True):
            prev = gr.Button("◀ prev", elem_id="viz-prev", scale=0, min_width=90)
            index = gr.Slider(0, 1, value=0, step=1, label="round (← / → keys step)", elem_id="viz-slider", scale=5)
            nxt = gr.Button("next ▶", elem_id="viz-next", scale=0, min_width=90)
            play = gr.Button("▶ play", elem_id="viz-play", scale=0, min_width=80)
            pause = gr.Button("❚❚ pause", elem_id="viz-pause", scale=0, min_width=80)
            speed = gr.Slider(0.5, 10, value=2, step=0.5, label="rounds / s", elem_id="viz-speed", scale=2)
        timer = gr.Timer(0.5, active=False)
        grid = gr.HTML(elem_id="viz-grid", value='<div class="ss-empty">Pick a run.</div>')
        with gr.Row():
            accepted = chart("viz-accepted", cursor=True)
            conf = chart("viz-conf", visible=False)
        isd = chart("viz-isd", visible=False)
        branches = gr.HTML(elem_id="viz-branches", visible=False)
        fold = chart("viz-fold", visible=False)
        kv = chart("viz-kv", cursor=True)
        with gr.Accordion("legend", open=False):
            gr.HTML(legend_html())
    outputs = [grid, conf, isd, branches, fold]

    def load_trace(run_id: str, request: gr.Request) -> tuple[RunTrace, Piece]:
        client = backend.client(request)
        trace = backend.trace(client, run_id)
        return trace, backend.piece(client, trace)

    def failure(message: str) -> list[Any]:
        return [warning_html(message)] + [gr.skip()] * (len(outputs) - 1)

    def load(run_id: str | None, request: gr.Request) -> list[Any]:
        """Summary, slider range and the per-run charts, then round 0's panels."""
        if not run_id:
            return ["", gr.Slider(maximum=1, value=0), "", ""] + [gr.skip()] * len(outputs)
        try:
            trace, piece = load_trace(run_id, request)
        except (BackendUnavailable, BackendError) as exc:
            return ["", gr.skip(), gr.skip(), gr.skip()] + failure(str(exc))
        if not trace.rounds:
            return [run_summary(trace), gr.Slider(maximum=1, value=0), "", ""] + failure("this run has no rounds")
        slider = gr.Slider(maximum=max(len(trace.rounds) - 1, 1), value=0)
        return [run_summary(trace), slider, *run_charts(trace), *round_panels(trace, 0, piece)]

    def show(run_id: str | None, i: float, request: gr.Request) -> list[Any]:
        if not run_id:
            return [gr.skip()] * len(outputs)
        try:
            trace, piece = load_trace(run_id, request)
        except (BackendUnavailable, BackendError) as exc:
            return failure(str(exc))
        if not trace.rounds:
            return [gr.skip()] * len(outputs)
        return round_panels(trace, min(int(i), len(trace.rounds) - 1), piece)

    def last_index(run_id: str | None, request: gr.Request) -> int:
        try:
            return len(load_trace(run_id, request)[0].rounds) - 1 if run_id else 0
        except (BackendUnavailable, BackendError):
            return 0

    def step(delta: int) -> Any:
        def move(run_id: str | None, i: float, request: gr.Request) -> int:
            return max(0, min(int(i) + delta, last_index(run_id, request)))
        return move

    def tick(run_id: str | None, i: float, request: gr.Request) -> tuple[int, Any]:
        end = last_index(run_id, request)
        nxt_i = min(int(i) + 1, end)
        return nxt_i, (gr.Timer(active=False) if nxt_i >= end else gr.skip())

    def start(run_id: str | None, i: float, rate: float, request: gr.Request) -> tuple[int, gr.Timer]:
        at_end = int(i) >= last_index(run_id, request)
        return (0 if at_end else int(i)), gr.Timer(value=1 / rate, active=True)

    def list_runs(request: gr.Request) -> Any:
        try:
            runs = backend.client(request).runs(limit=200)
        except (BackendUnavailable, BackendError):
            return gr.skip()
        return gr.Dropdown(choices=[(f"{r['run_id']} · {r['mode']} · {r['status']} · {r['prompt'][:40]}",
                                     r["run_id"]) for r in runs])

    run.change(load, run, [summary, index, accepted, kv, *outputs], **FAST)
    index.change(None, index, None, js=MOVE_CURSOR_JS)
    index.change(show, [run, index], outputs, trigger_mode="always_last", **FAST)
    prev.click(step(-1), [run, index], index, **FAST)
    nxt.click(step(+1), [run, index], index, **FAST)
    timer.tick(tick, [run, index], [index, timer], **FAST)
    play.click(start, [run, index, speed], [index, timer], **FAST)
    pause.click(lambda: gr.Timer(active=False), None, timer, **FAST)
    speed.change(lambda rate: gr.Timer(value=1 / rate), speed, timer, **FAST)
    refresh.click(list_runs, None, run, **FAST)
    tab.select(list_runs, None, run, **FAST)
    return VizTab(run=run)
