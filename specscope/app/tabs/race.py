"""The Race tab: one message answered by two modes at once, side by side, each pane streaming its text with its
tokens per forward and tok/s ticking; Stop cancels both; both runs are stored and open in the visualizer."""
from __future__ import annotations

import asyncio
import html
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.figures import tier_html
from specscope.app.limits import LENGTH_NOTE, MAX_NEW_LABEL, clamp_max_new, served_toggle, too_long
from specscope.app.live import figures_html, running_figures
from specscope.app.session import Backend, StopFlags
from specscope.app.trace import RunTrace

REDRAW_EVERY_S = 0.25
"""The panes redraw at most this often (a fast mode's rounds are coalesced)."""


@dataclass
class Lane:
    """One mode's side of a race: its run as streamed so far."""
    mode: str
    trace: RunTrace = field(default_factory=lambda: RunTrace(run_id=""))
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    problem: str = ""

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    @property
    def done(self) -> bool:
        return self.ended is not None


def lane_status(lane: Lane) -> str:
    """queued until the backend has started the run, then running, then how it ended."""
    if lane.problem or lane.done:
        return lane.problem or lane.trace.status
    return "running" if lane.trace.run_id else "queued"


def lane_html(lane: Lane, rival: Lane | None = None) -> str:
    """A pane: the mode, the live figures (tokens, NFE, tokens per forward, tok/s), the text so far."""
    first = rival is not None and lane.done and not lane.problem and lane.trace.status == "done" and (
        not rival.done or (rival.ended or 0) > (lane.ended or 0))
    badge = ' <span class="ss-badge ss-ok">finished first</span>' if first else ""
    run_id = html.escape(lane.trace.run_id)
    run = f' · run <code>{run_id}</code> <a href="?run={run_id}" target="_blank">open ↗</a>' if run_id else ""
    figures = figures_html(running_figures(lane.trace, lane.seconds))
    return (f'<div class="ss-race-lane"><div class="ss-round-head"><b>{html.escape(lane.mode)}</b>{badge} · '
            f'<span class="ss-race-stats">{figures} · {lane.seconds:.1f} s</span> · '
            f'<span class="ss-race-status">{html.escape(lane_status(lane))}</span>{run}{tier_html(lane.trace)}</div>'
            f'<pre class="ss-answer">{html.escape(lane.trace.text)}</pre></div>')


async def run_lane(backend: Backend, request: gr.Request, lane: Lane, message: str, params: dict[str, Any],
                   stop: Callable[[], bool]) -> None:
    client = backend.client(request)
    lane.started = time.monotonic()
    try:
        async for event in client.generate([{"role": "user", "content": message}], lane.mode, params, stop=stop):
            lane.trace.run_id = lane.trace.run_id or str(event.get("run_id", ""))
            lane.trace.add(event)
        if lane.trace.error:
            lane.problem = lane.trace.error
    except (BackendUnavailable, BackendError) as exc:
        lane.problem = f"⚠ {exc}"
    finally:
        lane.ended = time.monotonic()


@dataclass
class RaceTab:
    mode_a: gr.Dropdown
    mode_b: gr.Dropdown


def build_race(backend: Backend) -> RaceTab:
    stops = StopFlags()
    gr.Markdown("The same message in two modes at once, each streaming live with its tokens per forward and tok/s. "
                "Both runs share the server's forwards, as two users' runs would, and each drafts as it would alone "
                "unless *as served under load* is ticked; each is stored and opens in the visualizer.")
    with gr.Row():
        # the served modes once they load (ui.py): A the baseline, B the first the modes' `picked` names for a race
        mode_a = gr.Dropdown(label="mode A", choices=[], value=None, elem_id="race-mode-a", scale=1)
        mode_b = gr.Dropdown(label="mode B", choices=[], value=None, elem_id="race-mode-b", scale=1)
        max_new = gr.Number(label=MAX_NEW_LABEL, value=64, precision=0, elem_id="race-max", scale=1)
        served = served_toggle("race-served")
    message = gr.Textbox(label=f"message ({LENGTH_NOTE})", value="Write a Python function that reverses a string.",
                         elem_id="race-input", lines=2)
    with gr.Row():
        start = gr.Button("▶ race", variant="primary", elem_id="race-start", scale=3)
        stop = gr.Button("Stop", elem_id="race-stop", scale=1)
    with gr.Row(equal_height=False):
        pane_a = gr.HTML('<div class="ss-empty">Mode A answers here.</div>', elem_id="race-a")
        pane_b = gr.HTML('<div class="ss-empty">Mode B answers here.</div>', elem_id="race-b")

    async def race(text: str, a: str, b: str, limit: float | None, tiered: bool,
                   request: gr.Request) -> AsyncIterator[Any]:
        why = "Type a message first." if not text.strip() else too_long(text) or \
            (None if a and b else "Pick the two modes first (the list is still loading).")
        if why:
            yield f'<div class="ss-empty">{html.escape(why)}</div>', gr.skip(), gr.skip()
            return
        params = {"max_new_tokens": clamp_max_new(limit), "tiers": bool(tiered)}
        lanes = [Lane(a), Lane(b)]
        stops.clear(request)
        tasks = [asyncio.create_task(run_lane(backend, request, lane, text, params, stops.checker(request)))
                 for lane in lanes]
        used: Any = params["max_new_tokens"]   # shown once, as the runs use it
        try:
            while not all(t.done() for t in tasks):
                yield lane_html(lanes[0], lanes[1]), lane_html(lanes[1], lanes[0]), used
                used = gr.skip()
                await asyncio.wait(tasks, timeout=REDRAW_EVERY_S)
            yield lane_html(lanes[0], lanes[1]), lane_html(lanes[1], lanes[0]), used
        finally:
            stops.clear(request)
            for t in tasks:   # a closed page cancels both runs (their sockets close)
                t.cancel()

    start.click(race, [message, mode_a, mode_b, max_new, served], [pane_a, pane_b, max_new], concurrency_limit=None,
                show_progress="hidden")
    stop.click(stops.request, None, None, queue=False)
    for trigger in (max_new.blur, max_new.submit):
        trigger(clamp_max_new, max_new, max_new, queue=False)
    return RaceTab(mode_a, mode_b)
