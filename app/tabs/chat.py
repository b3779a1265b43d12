"""Chat tab: a streaming Chatbot driven through /ws/generate, a mode switch, that mode's parameters (from
/api/modes) and, under every answer, its stats and run id."""
from __future__ import annotations

import asyncio
import html
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.client import BackendError, BackendUnavailable
from app.figures import run_stats_markdown, token_grid_html
from app.session import Backend
from app.trace import Piece, RunTrace

RUN_ID = re.compile(r"\br_[0-9a-f]{6,32}\b")
Spec = dict[str, Any]
History = list[dict[str, Any]]


@dataclass
class ChatTab:
    mode: gr.Dropdown
    modes: gr.State
    run_id: gr.Textbox
    open_button: gr.Button


def mode_spec(modes: list[Spec], name: str | None) -> Spec | None:
    return next((m for m in modes or [] if m["name"] == name), None)


def mode_params(modes: list[Spec], name: str, chosen: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The parameters sent with a run: the user's choices for this mode, in the declared types."""
    spec = mode_spec(modes, name)
    values = (chosen or {}).get(name, {})
    params = {}
    for p in spec["params"] if spec else []:
        if p["name"] in values and values[p["name"]] is not None:
            value = values[p["name"]]
            params[p["name"]] = int(value) if p["type"] == "int" else float(value) if p["type"] == "float" else value
    return params


def param_component(p: Spec, key: str) -> gr.Checkbox | gr.Dropdown | gr.Slider | gr.Number:
    """A widget for one declared parameter: checkbox, choice list, bounded slider, or number box."""
    common = {"label": p["name"], "info": p.get("help") or None, "key": key, "elem_id": f"param-{p['name']}",
              "interactive": True}
    lo, hi = p.get("min"), p.get("max")
    if p["type"] == "bool":
        return gr.Checkbox(value=bool(p["default"]), **common)
    if p.get("choices"):
        return gr.Dropdown(choices=list(p["choices"]), value=p["default"], **common)
    if lo is not None and hi is not None and (p["type"] == "float" or hi - lo <= 4096):
        step = 1 if p["type"] == "int" else (hi - lo) / 100
        return gr.Slider(lo, hi, value=p["default"], step=step, **common)
    return gr.Number(value=p["default"], precision=0 if p["type"] == "int" else None, minimum=lo, maximum=hi,
                     **common)


def answer(trace: RunTrace, done: bool) -> str:
    """An assistant message: the answer as text (HTML escaped), then the run's stats once it has ended."""
    body = html.escape(trace.text) or ("…" if not done else "*(empty answer)*")
    return f"{body}\n\n▸ {run_stats_markdown(trace)}" if done else body


def build_chat(backend: Backend) -> ChatTab:
    modes = gr.State([])
    chosen = gr.State({})  # mode -> {param: value} the user changed
    with gr.Row():
        with gr.Column(scale=3):
            chatbot = gr.Chatbot(label="chat (every message is one independent run)", height=430,
                                 elem_id="chat-bot", buttons=["copy"])
            prompt = gr.Textbox(label="message", placeholder="Ask something, e.g. What is 12 + 30?  (Enter sends)",
                                elem_id="chat-input", lines=1, max_lines=6)
            with gr.Row():
                send = gr.Button("Send", variant="primary", elem_id="chat-send")
                stop = gr.Button("Stop", elem_id="chat-stop")
                clear = gr.Button("Clear", elem_id="chat-clear")
        with gr.Column(scale=2):
            mode = gr.Dropdown(label="decoding mode", choices=[], elem_id="chat-mode", interactive=True)

            @gr.render(inputs=[mode, modes], triggers=[mode.change])
            def params_ui(name: str | None, specs: list[Spec]) -> None:
                spec = mode_spec(specs, name)
                if spec is None:
                    gr.Markdown("*Modes load from the backend…*")
                    return
                gr.Markdown(f"**{spec['name']}**: {spec['summary']}  \n*NFE: {spec['nfe']}*")
                with gr.Accordion("parameters", open=True):
                    for p in spec["params"]:
                        widget = param_component(p, key=f"{spec['name']}:{p['name']}")

                        def remember(value: Any, state: dict, mode_name: str = spec["name"],
                                     param: str = p["name"]) -> dict:
                            return {**state, mode_name: {**state.get(mode_name, {}), param: value}}

                        widget.change(remember, [widget, chosen], chosen, queue=False)

            live = gr.HTML(label="latest round", elem_id="chat-live",
                           value='<div class="ss-empty">The latest round of a streaming run shows here.</div>')
            with gr.Row():
                run_id = gr.Textbox(label="last run", interactive=False, elem_id="chat-run", scale=3)
                open_button = gr.Button("Open in visualizer", elem_id="chat-open", scale=1)

    async def respond(message: str, history: History, name: str, specs: list[Spec], values: dict,
                      request: gr.Request) -> AsyncIterator[tuple[History, str, str, str]]:
        if not message.strip() or not name:
            yield history, message, gr.skip(), gr.skip()
            return
        history = [*history, {"role": "user", "content": html.escape(message)},
                   {"role": "assistant", "content": "…"}]
        yield history, "", gr.skip(), gr.skip()
        client = backend.client(request)
        trace = RunTrace(run_id="")
        piece: Piece | None = None
        try:
            async for event in client.generate(message, name, mode_params(specs, name, values)):
                trace.run_id = trace.run_id or str(event.get("run_id", ""))
                trace.add(event)
                final = event.get("type") in ("run_end", "error")
                history[-1] = {"role": "assistant", "content": answer(trace, final)}
                grid: Any = gr.skip()
                if event.get("type") == "round":
                    if piece is None:  # off the event loop: the backend may be this very server
                        piece = await asyncio.to_thread(backend.piece, client, trace)
                    grid = token_grid_html(event, piece, trace.context(len(trace.rounds) - 1))
                yield history, "", grid, trace.run_id
        except (BackendUnavailable, BackendError) as exc:
            history[-1] = {"role": "assistant", "content": f"⚠ **{html.escape(str(exc))}**"}
            yield history, "", gr.skip(), trace.run_id

    inputs = [prompt, chatbot, mode, modes, chosen]
    outputs = [chatbot, prompt, live, run_id]
    events = [prompt.submit(respond, inputs, outputs), send.click(respond, inputs, outputs)]
    stop.click(None, cancels=events)
    clear.click(lambda: ([], ""), None, [chatbot, run_id], queue=False)

    def pick_run(evt: gr.SelectData) -> str:
        found = RUN_ID.search(str(evt.value))
        return found.group(0) if found else gr.skip()

    chatbot.select(pick_run, None, run_id)
    return ChatTab(mode=mode, modes=modes, run_id=run_id, open_button=open_button)
