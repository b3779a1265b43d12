"""Visualizer tab: pick a stored run; the browser gets the run's document once (app/vizdoc.py) and steps through
its rounds itself (app/static/viz.js: buttons, slider, keys, autoplay, chart clicks, token history, URL per round).
A run still recording is followed: its new events arrive through /ws/replay until it ends."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from specscope.app.analysis import mode_defaults, params_label
from specscope.app.client import BackendError, BackendUnavailable, Client
from specscope.app.figures import legend_html, warning_html
from specscope.app.modebook import ModeBook
from specscope.app.plot import PLOTLY_ROUTE
from specscope.app.session import Backend
from specscope.app.tabs.why import diverge_from_row
from specscope.app.trace import RunTrace
from specscope.app.vizdoc import document_json, viz_document

FAST: dict[str, Any] = {"concurrency_limit": None, "show_progress": "hidden"}  # cheap, frequent events
MOUNT_JS = """
const draw = () => window.specscopeViz.mount(element, props.value);
draw();
watch('value', draw);
"""
FOLLOW_EVERY_S = 0.4     # at most one document per this many seconds while following
FOLLOW_COST_SHARE = 0.2  # and building documents takes at most this share of the time (a long run redraws less often)
FOLLOW_RETRY_S = 0.5     # wait before asking for more events of a run still recording
FOLLOW_LIMIT_S = 1800.0  # stop following a run that has not ended after this long
FOLLOW_FAILURES = 5      # streams dropped in a row before a follow gives up
MAX_SESSIONS = 1024      # sessions whose shown run is remembered


@dataclass
class VizTab:
    run: gr.Dropdown


def viz_component() -> gr.HTML:
    return gr.HTML(value="", html_template='<div class="ssv"></div>', js_on_load=MOUNT_JS, elem_id="viz-app",
                   head=f'<script src="{PLOTLY_ROUTE}"></script>')


async def follow_events(client: Client, trace: RunTrace) -> AsyncIterator[RunTrace]:
    """Take the new events of a run still recording into `trace`, yielding it after each batch, until it ends. A
    dropped stream is opened again from the next event; FOLLOW_FAILURES drops in a row end the follow."""
    deadline = time.monotonic() + FOLLOW_LIMIT_S
    failures = 0
    while trace.status == "running" and time.monotonic() < deadline:
        before = trace.next_seq
        try:
            async for event in client.replay(trace.run_id, trace.next_seq):
                trace.add(event)
                if event.get("type") == "round":
                    yield trace
            failures = 0
        except BackendUnavailable:
            failures += 1
            if failures >= FOLLOW_FAILURES:
                raise
        if trace.next_seq > before:
            yield trace
        if trace.status == "running":
            await asyncio.sleep(FOLLOW_RETRY_S)


def document_of(trace: RunTrace, piece: Any, book: ModeBook, fit: dict[str, Any] | None = None) -> str:
    return document_json(viz_document(trace, piece, book=book, fit=fit))


def build_viz(backend: Backend, tab: gr.Tab) -> VizTab:
    watching: dict[str, str] = {}  # session -> the run its visualizer shows (a follow stops when it changes)
    with gr.Column(elem_id="viz-panel"):
        with gr.Row():
            run = gr.Dropdown(label="run", choices=[], allow_custom_value=True, elem_id="viz-run", scale=4)
            refresh = gr.Button("↻ runs", elem_id="viz-refresh", scale=0, min_width=80)
        with gr.Accordion("legend: what the colours mean", open=False, elem_id="viz-legend"):   # above the run,
            gr.HTML(legend_html())                                                            # not 2000 px below
        message = gr.HTML(elem_id="viz-message")
        app = viz_component()
        diverge_from_row(backend, run, "viz")

    def load(run_id: str | None, request: gr.Request) -> tuple[str, str, bool]:
        """The run's document (or a warning), drawn once and stepped in the browser; whether it was still running."""
        watching.pop(request.session_hash or "", None)
        watching[request.session_hash or ""] = run_id or ""
        while len(watching) > MAX_SESSIONS:  # the oldest sessions are long gone
            watching.pop(next(iter(watching)))
        if not run_id:
            return "", "", False
        client = backend.client(request)
        try:
            trace = backend.trace(client, run_id)
            doc = viz_document(trace, backend.piece(client, trace), book=backend.modes(client),
                               fit=backend.rating(client, trace), elsewhere=backend.stored_curves(client))
            return "", document_json(doc), trace.status == "running"
        except BackendError as exc:
            if exc.status == 404:  # a deep link to a deleted run, or to another store's
                return warning_html(f"Run {run_id} is not stored here: it was deleted, or the link names a run of "
                                    f"another server's store. Pick a run from the list (↻ runs)."), "", False
            return warning_html(exc), gr.skip(), False
        except BackendUnavailable as exc:
            return warning_html(exc), gr.skip(), False

    async def follow(run_id: str | None, running: bool, request: gr.Request) -> AsyncIterator[Any]:
        """While the shown run is recording: a new document per batch of events, then the final stored one (also
        when the run ended between the first document and this follow)."""
        yield gr.skip()  # a generator that yields nothing would blank the visualizer
        session = request.session_hash or ""
        if not run_id or not running:
            return
        client = backend.client(request)
        try:
            trace = await asyncio.to_thread(backend.trace, client, run_id)
            piece = await asyncio.to_thread(backend.piece, client, trace)
            book = await asyncio.to_thread(backend.modes, client)
        except (BackendUnavailable, BackendError):
            return
        shown, every = time.monotonic(), FOLLOW_EVERY_S
        try:
            async for now in follow_events(client, trace):
                if watching.get(session) != run_id:
                    return
                if time.monotonic() - shown >= every:
                    started = time.monotonic()
                    doc = await asyncio.to_thread(document_of, now, piece, book)
                    shown = time.monotonic()
                    every = max(FOLLOW_EVERY_S, (shown - started) / FOLLOW_COST_SHARE)
                    yield doc
        except (BackendUnavailable, BackendError):
            pass  # the follow broke off: what is stored of the run is shown below, if it can be read
        try:
            backend.forget(client, run_id)
            final = await asyncio.to_thread(backend.trace, client, run_id)  # with its KV intervals
        except (BackendUnavailable, BackendError):
            return
        if watching.get(session) == run_id:
            fit = await asyncio.to_thread(backend.rating, client, final)
            yield await asyncio.to_thread(document_of, final, piece, book, fit)

    def list_runs(request: gr.Request) -> Any:
        """The newest runs, each with the parameters that differ from its mode's defaults."""
        client = backend.client(request)
        try:
            runs, defaults = client.runs(limit=200), mode_defaults(client.modes())
        except (BackendUnavailable, BackendError):
            return gr.skip()
        return gr.Dropdown(choices=[(" · ".join(part for part in (r["run_id"], r["mode"], params_label(r, defaults),
                                                                  r["status"], r["prompt"][:40]) if part),
                                     r["run_id"]) for r in runs])

    running = gr.State(False)
    run.change(load, run, [message, app, running], **FAST).then(follow, [run, running], app, **FAST)
    refresh.click(list_runs, None, run, **FAST)
    tab.select(list_runs, None, run, **FAST)
    return VizTab(run=run)
