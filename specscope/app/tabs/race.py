"""The Race tab: one message answered by two modes at once, side by side, each pane streaming its text with its
tokens per forward and tok/s ticking; both runs are stored and open in the visualizer."""
from __future__ import annotations

import asyncio
import html
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.session import Backend
from specscope.app.trace import RunTrace

REDRAW_EVERY_S = 0.25
"""The panes redraw at most this often (a fast mode's rounds are coalesced)."""
MAX_NEW = (1, 1024)
"""max_new_tokens bounds: the server's cap."""


@dataclass
class Lane:
    """One mode's side of a race: its run as streamed so far."""
    mode: str
    trace: RunTrace = field(default_factory=lambda: RunTrace(run_id=""))
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    problem: str = ""

    @property
    def tokens(self) -> int:
        return len(self.trace.output_ids)

    @property
    def nfe(self) -> int:
        """Forwards so far (a round's nfe leaves the prefill out)."""
        return sum(int(r.get("nfe") or 0) for r in self.trace.rounds)

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    @property
    def done(self) -> bool:
        return self.ended is not None


def lane_html(lane: Lane, rival: Lane | None = None) -> str:
    """A pane: the mode, the live figures (tokens, NFE, tokens per forward, tok/s), the text so far."""
    tpf = f"{lane.tokens / lane.nfe:.2f}" if lane.nfe else "—"
    rate = f"{lane.tokens / lane.seconds:.1f}" if lane.seconds > 0 and lane.tokens else "—"
    status = lane.problem or (lane.trace.status if lane.done else "running")
    first = rival is not None and lane.done and not lane.problem and lane.trace.status == "done" and (
        not rival.done or (rival.ended or 0) > (lane.ended or 0))
    badge = ' <span class="ss-badge ss-ok">finished first</span>' if first else ""
    run_id = html.escape(lane.trace.run_id)
    run = f' · run <code>{run_id}</code> <a href="?run={run_id}" target="_blank">open ↗</a>' if run_id else ""
    text = lane.trace.text
    return (f'<div class="ss-race-lane"><div class="ss-round-head"><b>{html.escape(lane.mode)}</b>{badge} · '
            f'<span class="ss-race-stats">{lane.tokens} tokens · NFE {lane.nfe} · '
            f'<span title="tokens committed per forward (TPF = tokens / NFE)">tokens/forward {tpf}</span> · '
            f'{rate} tok/s · {lane.seconds:.1f} s</span> · {html.escape(status)}{run}</div>'
            f'<pre class="ss-answer">{html.escape(text)}</pre></div>')


async def run_lane(backend: Backend, request: gr.Request, lane: Lane, message: str, params: dict[str, Any]) -> None:
    client = backend.client(request)
    lane.started = time.monotonic()
    try:
        async for event in client.generate([{"role": "user", "content": message}], lane.mode, params):
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
    gr.Markdown("The same message in two modes at once, each streaming live with its tokens per forward and tok/s. "
                "Both runs share the server, as two users' runs would; each is stored and opens in the visualizer.")
    with gr.Row():
        mode_a = gr.Dropdown(label="mode A", choices=["ar"], value="ar", elem_id="race-mode-a", scale=1)
        mode_b = gr.Dropdown(label="mode B", choices=["ar"], value="ar", elem_id="race-mode-b", scale=1)
        max_new = gr.Number(label=f"max_new_tokens [{MAX_NEW[0]}, {MAX_NEW[1]}]", value=64, precision=0,
                            minimum=MAX_NEW[0], maximum=MAX_NEW[1], elem_id="race-max", scale=1)
    message = gr.Textbox(label="message", value="Write a Python function that reverses a string.",
                         elem_id="race-input", lines=2)
    start = gr.Button("▶ race", variant="primary", elem_id="race-start")
    with gr.Row(equal_height=False):
        pane_a = gr.HTML('<div class="ss-empty">Mode A answers here.</div>', elem_id="race-a")
        pane_b = gr.HTML('<div class="ss-empty">Mode B answers here.</div>', elem_id="race-b")

    async def race(text: str, a: str, b: str, limit: float | None, request: gr.Request) -> AsyncIterator[Any]:
        if not text.strip():
            yield '<div class="ss-empty">Type a message first.</div>', gr.skip()
            return
        params = {"max_new_tokens": int(min(max(limit or 64, MAX_NEW[0]), MAX_NEW[1]))}
        lanes = [Lane(a), Lane(b)]
        tasks = [asyncio.create_task(run_lane(backend, request, lane, text, params)) for lane in lanes]
        try:
            while not all(t.done() for t in tasks):
                yield lane_html(lanes[0], lanes[1]), lane_html(lanes[1], lanes[0])
                await asyncio.wait(tasks, timeout=REDRAW_EVERY_S)
            yield lane_html(lanes[0], lanes[1]), lane_html(lanes[1], lanes[0])
        finally:
            for t in tasks:   # a closed page cancels both runs (their sockets close)
                t.cancel()

    start.click(race, [message, mode_a, mode_b, max_new], [pane_a, pane_b], concurrency_limit=None)
    return RaceTab(mode_a, mode_b)
