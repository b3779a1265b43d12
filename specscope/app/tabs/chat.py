"""Chat tab: a streaming Chatbot driven through /ws/generate, a mode switch, the run's latest round beside the
conversation (labelled with its run and running figures), that mode's parameters (from /api/modes, collapsed) and,
under every answer, its stats, model and run id. Every session's answers stream at once: the engine schedules
them."""
from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable, Client
from specscope.app.figures import esc, live_round, markdown_html, pre_html, run_stats_html
from specscope.app.limits import LENGTH_NOTE, MAX_MESSAGE_CHARS, too_long
from specscope.app.live import live_head_html
from specscope.app.session import Backend, StopFlags, session_of
from specscope.app.tabs.card import example_picker
from specscope.app.trace import RunTrace

REDRAW_EVERY_S = 0.1        # the shortest interval between two redraws of a streaming answer
REDRAW_MAX_S = 1.0          # the longest
REDRAW_CHARS_PER_S = 8_000  # answer HTML a second of interval buys: each redraw re-renders the whole answer
WAIT_NOTE_S = 1.0           # a run with no round this long after it was sent says that it waits for the engine
LIVE_JS = """
const draw = () => window.specscopeViz.live(element.querySelector(".ss-live") || element, props.value);
draw();
watch('value', draw);
"""
"""The latest-round panel draws its value (app/figures.py:live_round) with the visualizer's renderer."""
RUN_ID = re.compile(r"\br_[0-9a-f]{6,32}\b")
INDENTED = re.compile(r"[ \t]+(?![-*+] |\d+[.)] )\S")
"""A line indented as code is (not a nested list item)."""
Spec = dict[str, Any]
History = list[dict[str, Any]]


@dataclass
class ChatTab:
    mode: gr.Dropdown
    modes: gr.State
    send: gr.Button
    run_id: gr.Textbox
    open_button: gr.Button
    examples: gr.Dataset


def mode_spec(modes: list[Spec], name: str | None) -> Spec | None:
    return next((m for m in modes or [] if m["name"] == name), None)


def clamp(p: Spec, value: Any) -> Any:
    """A parameter value in its declared type and range (an out-of-range number becomes the nearest bound)."""
    if p["type"] not in ("int", "float") or value is None:
        return value
    value = int(round(float(value))) if p["type"] == "int" else float(value)
    if p.get("min") is not None:
        value = max(value, type(value)(p["min"]))
    if p.get("max") is not None:
        value = min(value, type(value)(p["max"]))
    return value


def mode_params(modes: list[Spec], name: str, chosen: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The parameters sent with a run: the user's choices for this mode, in the declared types and ranges."""
    spec = mode_spec(modes, name)
    values = (chosen or {}).get(name, {})
    return {p["name"]: clamp(p, values[p["name"]]) for p in (spec["params"] if spec else [])
            if values.get(p["name"]) is not None}


def clamped_slider(lo: float, hi: float, **kwargs: Any) -> gr.Slider:
    """A slider whose number box takes any number: one past the bounds becomes the nearest bound (Gradio's own
    slider refuses it with an error, an HTTP 500 in the browser's console). An instance's preprocess, not a
    subclass: Gradio writes a .pyi stub beside the module of every Component subclass."""
    slider = gr.Slider(lo, hi, **kwargs)
    checked = slider.preprocess
    slider.preprocess = lambda payload: checked(min(max(float(payload), lo), hi))  # type: ignore[method-assign]
    return slider


def param_component(p: Spec, key: str, value: Any = None) -> gr.Checkbox | gr.Dropdown | gr.Slider | gr.Number:
    """A widget for one declared parameter (checkbox, choice list, bounded slider, or number box) showing `value`,
    the user's earlier choice for it, else its default. Number boxes carry no bounds (out-of-range input is
    clamped by the handler and shown clamped, never refused with an error)."""
    value = p["default"] if value is None else value
    lo, hi = p.get("min"), p.get("max")
    shown = (lambda v: str(int(v))) if p["type"] == "int" else (lambda v: f"{v:g}")
    bounds = f" [{shown(lo)}, {shown(hi)}]" if lo is not None and hi is not None else ""
    common = {"label": p["name"], "info": (p.get("help") or "") + bounds or None, "key": key,
              "elem_id": f"param-{p['name']}", "interactive": True}
    if p["type"] == "bool":
        return gr.Checkbox(value=bool(value), **common)
    if p.get("choices"):
        return gr.Dropdown(choices=list(p["choices"]), value=value, **common)
    if p["type"] == "float" and lo is not None and hi is not None:
        return clamped_slider(lo, hi, value=value, step=(hi - lo) / 100, **common)
    return gr.Number(value=value, precision=0 if p["type"] == "int" else None, **common)


def redraw_interval(answer_html: str) -> float:
    """Seconds until the next redraw of a streaming answer: longer as the answer grows, so that the browser's work
    per second (redraws times what each one renders) stays bounded on a slow machine."""
    return min(REDRAW_MAX_S, max(REDRAW_EVERY_S, len(answer_html) / REDRAW_CHARS_PER_S))


def code_shaped(text: str) -> bool:
    """Whether an answer is code written without fences: no ``` fence, and a line after the first indented as code
    is (Markdown would fold its indentation away)."""
    return "```" not in text and any(INDENTED.match(line) for line in text.splitlines()[1:])


def answer(trace: RunTrace, done: bool, raw: bool = False) -> str:
    """An assistant message (the chat shows our HTML as is): a conversation's answer rendered as Markdown with its
    HTML escaped, a raw continuation or code written without fences as preformatted text, then the run's stats
    once it has ended (with a note when it was stopped, the error when it failed)."""
    shown = pre_html if raw or code_shaped(trace.text) else markdown_html
    empty = "" if trace.error else "<i>(empty)</i>" if done else "…"
    body = shown(trace.text) if trace.text else empty
    return f"{body}{run_stats_html(trace)}" if done else body


def queue_html(waiting: Iterable[str]) -> str:
    """The messages waiting for the running answer to end (nothing when none)."""
    items = [f"<li>{esc(m if len(m) <= 80 else m[:79] + '…')}</li>" for m in waiting]
    if not items:
        return ""
    return f'<div class="ss-note" id="chat-queued">queued, answered in turn:<ol>{"".join(items)}</ol></div>'


def refusal_html(why: str) -> str:
    return f'<div class="ss-note ss-refused" id="chat-refused">⚠ {esc(why)}</div>'


def waiting_note(client: Client) -> str:
    """Why a sent run has no round yet: the engine holds other runs (as many as its health says)."""
    try:
        ahead = max(0, int(client.health().get("active_runs", 1)) - 1)
    except (BackendUnavailable, BackendError):
        return "waiting for the engine"
    return f"waiting for the engine ({ahead} ahead)"


END = object()


async def ticking(events: AsyncIterator[dict], every: float) -> AsyncIterator[dict | None]:
    """The events, and None each time `every` seconds pass without one."""
    async def following() -> Any:
        try:
            return await anext(events)
        except StopAsyncIteration:
            return END

    pending: asyncio.Task | None = None
    try:
        while True:
            pending = pending or asyncio.create_task(following())
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield None
                continue
            event, pending = pending.result(), None
            if event is END:
                return
            yield event
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await events.aclose()  # type: ignore[attr-defined]


CLEAR_ON_SEND = """(message, ...rest) => {
  const box = document.querySelector('#chat-input textarea');
  const sendable = !document.querySelector('#chat-send')?.disabled && message.length <= MAX_CHARS;
  if (box && message.trim() && sendable) { box.value = ''; box.dispatchEvent(new Event('input', {bubbles: true})); }
  return [message, ...rest];
}""".replace("MAX_CHARS", str(MAX_MESSAGE_CHARS))
"""Runs in the browser before `enqueue`: the box empties at once, never later over what the user typed next; a
message the server would refuse (too long, or sent while the model switches) stays in it."""


def build_chat(backend: Backend) -> ChatTab:
    stops = StopFlags()  # sessions whose running answer was stopped: the run is cancelled, its end shown
    queued: dict[str, deque[str]] = {}  # session -> messages sent and not yet answered, in order
    answering: set[str] = set()  # sessions whose queue is being answered
    modes = gr.State([])
    chosen = gr.State({})  # mode -> {param: value} the user changed
    params_open = gr.State(False)  # whether the user opened the parameters (kept across modes)
    conversation = gr.State([])  # the messages said so far, as the model reads them (raw text, no markup)
    with gr.Row(elem_id="chat-row"):
        with gr.Column(scale=3, min_width=320):
            chatbot = gr.Chatbot(label="chat (each answer is one run, on the whole conversation so far)", height=None,
                                 min_height=120, max_height=360, elem_id="chat-bot", buttons=["copy"],
                                 render_markdown=False)
            prompt = gr.Textbox(label=f"message ({LENGTH_NOTE}; Enter sends, Shift+Enter a new line)",
                                elem_id="chat-input", lines=1, max_lines=6,
                                placeholder="Type a message, or pick one of this model's examples below")
            with gr.Row():
                send = gr.Button("Send", variant="primary", elem_id="chat-send", min_width=80)
                stop = gr.Button("Stop", elem_id="chat-stop", min_width=80)
                clear = gr.Button("Clear", elem_id="chat-clear", min_width=80)
            waiting_box = gr.HTML(queue_html(()), elem_id="chat-queue")  # under the buttons: they never move
            refused_box = gr.HTML("", elem_id="chat-refusal")  # why the last message sent stayed in the box
            examples = example_picker(prompt, "chat-examples")
        with gr.Column(scale=2, min_width=320):
            mode = gr.Dropdown(label="decoding mode", choices=[], elem_id="chat-mode", interactive=True)
            live_head = gr.HTML("", elem_id="chat-live-head")
            live = gr.HTML(value="", label="latest round", elem_id="chat-live",
                           html_template='<div class="ss-live"></div>', js_on_load=LIVE_JS)
            with gr.Row():
                run_id = gr.Textbox(label="last run", interactive=False, elem_id="chat-run", scale=3)
                open_button = gr.Button("Open in visualizer", elem_id="chat-open", scale=1)
            params_ui(mode, modes, chosen, params_open)

    async def respond(message: str, history: History, said: list[dict[str, str]], name: str, specs: list[Spec],
                      values: dict, request: gr.Request) -> AsyncIterator[tuple[Any, ...]]:
        """Run the conversation so far plus `message`; the answer streams into the chat, its latest round and
        running figures beside it. A raw run (`raw` checked) continues the message alone, as text, and stays out of
        the conversation. The browser clears the message box as it sends (CLEAR_ON_SEND), so nothing here writes
        it and what the user types meanwhile is kept."""
        history = [*history, {"role": "user", "content": pre_html(message)}]
        if not name:
            yield [*history, {"role": "assistant", "content": "⚠ <b>choose a decoding mode first</b>"}], \
                *[gr.skip()] * 4
            return
        params = mode_params(specs, name, values)
        asked: str | list[dict[str, str]] = message if params.get("raw") else [*said, {"role": "user",
                                                                                      "content": message}]
        history.append({"role": "assistant", "content": "…"})
        trace = RunTrace(run_id="")
        started = time.monotonic()

        def head(waiting: str = "") -> str:
            return live_head_html(trace, name, time.monotonic() - started, waiting)

        yield history, "", head(), gr.skip(), gr.skip()  # the previous run's round goes at once
        client = backend.client(request)
        stops.clear(request)
        try:
            async for shown in stream(client, trace, asked, name, params, stops.checker(request)):
                if shown is None:  # no round yet: the engine has not taken the run
                    note = await asyncio.to_thread(waiting_note, client)
                    history[-1] = {"role": "assistant", "content": f'<i class="ss-waiting">{esc(note)}…</i>'}
                    yield history, gr.skip(), head(note), trace.run_id or gr.skip(), gr.skip()
                    continue
                final = trace.status != "running"
                history[-1] = {"role": "assistant", "content": answer(trace, final, raw=bool(params.get("raw")))}
                grid = await asyncio.to_thread(latest_round, backend, client, trace) if trace.rounds else gr.skip()
                answered = [*asked, {"role": "assistant", "content": trace.text}] \
                    if final and trace.text and isinstance(asked, list) else gr.skip()
                yield history, grid, head(), trace.run_id, answered
        except (BackendUnavailable, BackendError) as exc:
            history[-1] = {"role": "assistant", "content": f"⚠ <b>{esc(exc)}</b>"}
            yield history, gr.skip(), head(), trace.run_id or gr.skip(), gr.skip()
        finally:
            stops.clear(request)

    def enqueue(message: str, request: gr.Request) -> tuple[Any, str, Any]:
        """Take a sent message into the session's queue (at once, also while an answer streams); one the server
        would refuse goes back into the box, and says why until the next message is taken."""
        session = session_of(request)
        why = too_long(message) or (f"The model is switching to {backend.switching}: send once it is served."
                                    if backend.switching and message.strip() else None)
        if why:
            return gr.skip(), refusal_html(why), message
        waiting = queued.setdefault(session, deque())
        if message.strip():
            waiting.append(message)
        return (queue_html(waiting) if session in answering else ""), "", gr.skip()

    async def answer_queue(history: History, said: list[dict[str, str]], name: str, specs: list[Spec], values: dict,
                           request: gr.Request) -> AsyncIterator[tuple[Any, ...]]:
        """Answer the session's queued messages in order, each one run on the conversation the answers before it
        left; the queue box shows what still waits."""
        session = session_of(request)
        waiting = queued.setdefault(session, deque())
        answering.add(session)
        try:
            while waiting:
                message = waiting.popleft()
                async for out in respond(message, history, said, name, specs, values, request):
                    history = out[0] if isinstance(out[0], list) else history
                    said = out[4] if isinstance(out[4], list) else said
                    yield *out, queue_html(waiting)
        finally:
            answering.discard(session)
            if not waiting:
                queued.pop(session, None)
        yield *[gr.skip()] * 5, gr.skip() if session in queued else ""

    answered_into = [chatbot, live, live_head, run_id, conversation, waiting_box]
    for sent in (prompt.submit, send.click):  # a message sent while an answer streams waits its turn, never dropped
        # every session's answers stream at once (no concurrency limit: the engine schedules the runs), and the
        # queue's overlay stays off the answer and the live round the user is watching
        sent(enqueue, prompt, [waiting_box, refused_box, prompt], js=CLEAR_ON_SEND, queue=False,
             trigger_mode="multiple").then(
            answer_queue, [chatbot, conversation, mode, modes, chosen], answered_into, trigger_mode="always_last",
            concurrency_limit=None, show_progress="hidden")

    def request_stop(request: gr.Request) -> str:
        """Stop the running answer and drop the messages waiting behind it."""
        stops.request(request)
        queued.get(session_of(request), deque()).clear()  # in place: the running answer_queue holds it
        return queue_html(())

    def clear_chat(request: gr.Request) -> tuple[Any, ...]:
        queued.get(session_of(request), deque()).clear()
        return [], "", [], queue_html(())

    stop.click(request_stop, None, waiting_box, queue=False)
    clear.click(clear_chat, None, [chatbot, run_id, conversation, waiting_box], queue=False)

    def pick_run(evt: gr.SelectData) -> str:
        found = RUN_ID.search(str(evt.value))
        return found.group(0) if found else gr.skip()

    chatbot.select(pick_run, None, run_id)
    return ChatTab(mode=mode, modes=modes, send=send, run_id=run_id, open_button=open_button, examples=examples)


async def stream(client: Client, trace: RunTrace, asked: str | list[dict[str, str]], mode: str,
                 params: dict[str, Any], stop: Callable[[], bool]) -> AsyncIterator[RunTrace | None]:
    """Run `asked` into `trace`, yielding it whenever the chat should redraw (the run's start, a round, at most as
    often as `redraw_interval` allows for an answer this long, and its end) and None each WAIT_NOTE_S it has had no
    round yet."""
    shown, every = 0.0, REDRAW_EVERY_S
    async for event in ticking(client.generate(asked, mode, params, stop=stop), WAIT_NOTE_S):
        if event is None:
            if not trace.rounds:
                yield None
            continue
        trace.run_id = trace.run_id or str(event.get("run_id", ""))
        trace.add(event)
        kind = event.get("type")
        if kind == "round" and time.monotonic() - shown < every:
            continue  # a fast run's rounds are coalesced: the browser redraws the chat at most this often
        if kind in ("run_start", "round", "run_end", "error"):
            shown = time.monotonic()
            every = redraw_interval(trace.text)
            yield trace


def latest_round(backend: Backend, client: Client, trace: RunTrace) -> str:
    """The live panel's value: the run's latest round (off the event loop: the backend may be this very server)."""
    piece = backend.piece(client, trace)
    return live_round(trace.rounds[-1], piece, trace.context(len(trace.rounds) - 1))


def params_ui(mode: gr.Dropdown, modes: gr.State, chosen: gr.State, params_open: gr.State) -> None:
    """The chosen mode's summary and its parameters, collapsed until the user opens them (then open in every mode).
    A switch renders nothing first, then the new mode's widgets: rendered over the last mode's in one step, the
    browser would hand a new widget the value of the old one in its place (a checkbox's `true` to a number box)."""
    panel = gr.Textbox(visible=False)    # the mode whose widgets show ("" between two modes)
    mode.change(lambda: "", None, panel, queue=False).then(lambda name: name, mode, panel, queue=False)

    @gr.render(inputs=[panel, modes, chosen, params_open], triggers=[panel.change])
    def shown(name: str | None, specs: list[Spec], values: dict, opened: bool) -> None:
        if not name:
            return
        spec = mode_spec(specs, name)
        if spec is None:
            gr.Markdown("*Modes load from the backend…*")
            return
        lossy = "  \n**lossy**: its output may differ from the model's greedy decode" if spec.get("lossy") else ""
        gr.Markdown(f"**{spec['name']}**: {spec['summary']}  \n*NFE: {spec['nfe']}*{lossy}")
        with gr.Accordion(f"parameters of {spec['name']}", open=bool(opened), elem_id="chat-params") as box:
            for p in spec["params"]:
                param_widget(p, spec["name"], chosen, (values or {}).get(spec["name"], {}).get(p["name"]))
        box.expand(lambda: True, None, params_open, queue=False)
        box.collapse(lambda: False, None, params_open, queue=False)


def param_widget(p: Spec, mode_name: str, chosen: gr.State, value: Any) -> None:
    """One parameter's widget, remembering what the user sets in `chosen` and showing the value the run will use."""
    widget = param_component(p, f"{mode_name}:{p['name']}", value)

    def remember(picked: Any, state: dict) -> dict:
        return {**state, mode_name: {**state.get(mode_name, {}), p["name"]: picked}}

    widget.change(remember, [widget, chosen], chosen, queue=False)
    if isinstance(widget, gr.Number):  # show the value the run will use
        for trigger in (widget.blur, widget.submit):
            trigger(lambda v: clamp(p, v), widget, widget, queue=False)
    elif isinstance(widget, gr.Slider):   # the box shows the clamped value
        widget.change(lambda v: v, widget, widget, queue=False)
