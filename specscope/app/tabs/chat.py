"""Chat tab: a streaming Chatbot driven through /ws/generate, a mode switch, that mode's parameters (from
/api/modes) and, under every answer, its stats and run id."""
from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.figures import esc, live_round, markdown_html, pre_html, run_stats_html
from specscope.app.session import Backend
from specscope.app.tabs.card import example_picker
from specscope.app.trace import Piece, RunTrace

REDRAW_EVERY_S = 0.1        # the shortest interval between two redraws of a streaming answer
REDRAW_MAX_S = 1.0          # the longest
REDRAW_CHARS_PER_S = 8_000  # answer HTML a second of interval buys: each redraw re-renders the whole answer
LIVE_JS = """
const draw = () => window.specscopeViz.live(element.querySelector(".ss-live") || element, props.value);
draw();
watch('value', draw);
"""
"""The latest-round panel draws its value (app/figures.py:live_round) with the visualizer's renderer."""
RUN_ID = re.compile(r"\br_[0-9a-f]{6,32}\b")
Spec = dict[str, Any]
History = list[dict[str, Any]]


@dataclass
class ChatTab:
    mode: gr.Dropdown
    modes: gr.State
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


def answer(trace: RunTrace, done: bool, raw: bool = False) -> str:
    """An assistant message (the chat shows our HTML as is): a conversation's answer rendered as Markdown with its
    HTML escaped, a raw continuation as preformatted text, then the run's stats once it has ended (with a note when
    it was stopped)."""
    shown = pre_html if raw else markdown_html
    body = shown(trace.text) if trace.text else ("…" if not done else "<i>(empty)</i>")
    return f"{body}{run_stats_html(trace)}" if done else body


def queue_html(waiting: Iterable[str]) -> str:
    """The messages waiting for the running answer to end (nothing when none)."""
    items = [f"<li>{esc(m if len(m) <= 80 else m[:79] + '…')}</li>" for m in waiting]
    if not items:
        return ""
    return f'<div class="ss-note" id="chat-queued">queued, answered in turn:<ol>{"".join(items)}</ol></div>'


CLEAR_ON_SEND = """(message, ...rest) => {
  const box = document.querySelector('#chat-input textarea');
  if (box && message.trim()) { box.value = ''; box.dispatchEvent(new Event('input', {bubbles: true})); }
  return [message, ...rest];
}"""  # runs in the browser before respond: the box empties at once, never later over what the user typed next


def build_chat(backend: Backend) -> ChatTab:
    stopping: set[str] = set()  # sessions whose running answer was stopped: the run is cancelled, its end shown
    queued: dict[str, deque[str]] = {}  # session -> messages sent and not yet answered, in order
    answering: set[str] = set()  # sessions whose queue is being answered
    modes = gr.State([])
    chosen = gr.State({})  # mode -> {param: value} the user changed
    conversation = gr.State([])  # the messages said so far, as the model reads them (raw text, no markup)
    with gr.Row():
        with gr.Column(scale=3):
            chatbot = gr.Chatbot(label="chat (each answer is one run, on the whole conversation so far)", height=430,
                                 elem_id="chat-bot", buttons=["copy"], render_markdown=False)
            prompt = gr.Textbox(label="message", elem_id="chat-input", lines=1, max_lines=6,
                                placeholder="Ask something, e.g. What is the capital of Japan?  (Enter sends)")
            examples = example_picker(prompt, "chat-examples")
            with gr.Row():
                send = gr.Button("Send", variant="primary", elem_id="chat-send")
                stop = gr.Button("Stop", elem_id="chat-stop")
                clear = gr.Button("Clear", elem_id="chat-clear")
            waiting_box = gr.HTML(queue_html(()), elem_id="chat-queue")  # under the buttons: they never move
        with gr.Column(scale=2):
            mode = gr.Dropdown(label="decoding mode", choices=[], elem_id="chat-mode", interactive=True)

            @gr.render(inputs=[mode, modes, chosen], triggers=[mode.change])
            def params_ui(name: str | None, specs: list[Spec], values: dict) -> None:
                spec = mode_spec(specs, name)
                if spec is None:
                    gr.Markdown("*Modes load from the backend…*")
                    return
                gr.Markdown(f"**{spec['name']}**: {spec['summary']}  \n*NFE: {spec['nfe']}*")
                with gr.Accordion("parameters", open=True):
                    for p in spec["params"]:
                        widget = param_component(p, f"{spec['name']}:{p['name']}",
                                                 (values or {}).get(spec["name"], {}).get(p["name"]))

                        def remember(value: Any, state: dict, mode_name: str = spec["name"],
                                     param: str = p["name"]) -> dict:
                            return {**state, mode_name: {**state.get(mode_name, {}), param: value}}

                        widget.change(remember, [widget, chosen], chosen, queue=False)
                        if isinstance(widget, gr.Number):  # show the value the run will use
                            for trigger in (widget.blur, widget.submit):
                                trigger(lambda v, p=p: clamp(p, v), widget, widget, queue=False)
                        elif isinstance(widget, gr.Slider):   # the box shows the clamped value
                            widget.change(lambda v: v, widget, widget, queue=False)

            live = gr.HTML(value="", label="latest round", elem_id="chat-live",
                           html_template='<div class="ss-live"></div>', js_on_load=LIVE_JS)
            with gr.Row():
                run_id = gr.Textbox(label="last run", interactive=False, elem_id="chat-run", scale=3)
                open_button = gr.Button("Open in visualizer", elem_id="chat-open", scale=1)

    async def respond(message: str, history: History, said: list[dict[str, str]], name: str, specs: list[Spec],
                      values: dict, request: gr.Request) -> AsyncIterator[tuple[Any, ...]]:
        """Run the conversation so far plus `message`; the answer streams into the chat. A raw run (`raw` checked)
        continues the message alone, as text, and stays out of the conversation. The browser clears the message
        box as it sends (CLEAR_ON_SEND), so nothing here writes it and what the user types meanwhile is kept."""
        if not message.strip():
            return
        if not name:
            yield [*history, {"role": "user", "content": pre_html(message)},
                   {"role": "assistant", "content": "⚠ <b>choose a decoding mode first</b>"}], *[gr.skip()] * 3
            return
        params = mode_params(specs, name, values)
        turn = {"role": "user", "content": message}
        asked: str | list[dict[str, str]] = message if params.get("raw") else [*said, turn]
        history = [*history, {"role": "user", "content": pre_html(message)},
                   {"role": "assistant", "content": "…"}]
        yield history, gr.skip(), gr.skip(), gr.skip()
        client = backend.client(request)
        trace = RunTrace(run_id="")
        piece: Piece | None = None
        session = request.session_hash or ""
        stopping.discard(session)
        shown, every = 0.0, REDRAW_EVERY_S
        try:
            async for event in client.generate(asked, name, params,
                                               stop=lambda: session in stopping):
                trace.run_id = trace.run_id or str(event.get("run_id", ""))
                trace.add(event)
                final = event.get("type") in ("run_end", "error")
                if not final and (event.get("type") != "round" or time.monotonic() - shown < every):
                    continue  # a fast run's rounds are coalesced: the browser redraws the chat at most this often
                shown = time.monotonic()
                history[-1] = {"role": "assistant", "content": answer(trace, final, raw=bool(params.get("raw")))}
                every = redraw_interval(history[-1]["content"])
                if piece is None:  # off the event loop: the backend may be this very server
                    piece = await asyncio.to_thread(backend.piece, client, trace)
                grid = live_round(trace.rounds[-1], piece, trace.context(len(trace.rounds) - 1)) \
                    if trace.rounds else gr.skip()
                answered = [*asked, {"role": "assistant", "content": trace.text}] \
                    if final and trace.text and isinstance(asked, list) else gr.skip()
                yield history, grid, trace.run_id, answered
        except (BackendUnavailable, BackendError) as exc:
            history[-1] = {"role": "assistant", "content": f"⚠ <b>{esc(exc)}</b>"}
            yield history, gr.skip(), trace.run_id, gr.skip()
        finally:
            stopping.discard(session)

    def enqueue(message: str, request: gr.Request) -> str:
        """Take a sent message into the session's queue (at once, also while an answer streams)."""
        session = request.session_hash or ""
        waiting = queued.setdefault(session, deque())
        if message.strip():
            waiting.append(message)
        return queue_html(waiting) if session in answering else ""

    async def answer_queue(history: History, said: list[dict[str, str]], name: str, specs: list[Spec], values: dict,
                           request: gr.Request) -> AsyncIterator[tuple[Any, ...]]:
        """Answer the session's queued messages in order, each one run on the conversation the answers before it
        left; the queue box shows what still waits."""
        session = request.session_hash or ""
        waiting = queued.setdefault(session, deque())
        answering.add(session)
        try:
            while waiting:
                message = waiting.popleft()
                async for out in respond(message, history, said, name, specs, values, request):
                    history = out[0] if isinstance(out[0], list) else history
                    said = out[3] if isinstance(out[3], list) else said
                    yield *out, queue_html(waiting)
        finally:
            answering.discard(session)
            if not waiting:
                queued.pop(session, None)
        yield *[gr.skip()] * 4, ""

    for sent in (prompt.submit, send.click):  # a message sent while an answer streams waits its turn, never dropped
        sent(enqueue, prompt, waiting_box, js=CLEAR_ON_SEND, queue=False, trigger_mode="multiple").then(
            answer_queue, [chatbot, conversation, mode, modes, chosen], [chatbot, live, run_id, conversation,
                                                                         waiting_box], trigger_mode="always_last")

    def request_stop(request: gr.Request) -> str:
        """Stop the running answer and drop the messages waiting behind it."""
        stopping.add(request.session_hash or "")
        queued.get(request.session_hash or "", deque()).clear()  # in place: the running answer_queue holds it
        return queue_html(())

    def clear_chat(request: gr.Request) -> tuple[Any, ...]:
        queued.get(request.session_hash or "", deque()).clear()
        return [], "", [], queue_html(())

    stop.click(request_stop, None, waiting_box, queue=False)
    clear.click(clear_chat, None, [chatbot, run_id, conversation, waiting_box], queue=False)

    def pick_run(evt: gr.SelectData) -> str:
        found = RUN_ID.search(str(evt.value))
        return found.group(0) if found else gr.skip()

    chatbot.select(pick_run, None, run_id)
    return ChatTab(mode=mode, modes=modes, run_id=run_id, open_button=open_button, examples=examples)
