"""The Gradio UI (model picker; Chat, Visualizer, Compare, Runs, Analysis, Bench), mounted at "/" on the backend's
FastAPI app.

The UI talks to the backend only through REST and /ws/generate (app.client), so `backend_url` may point at another
machine. Without one, each browser request is served by the backend that served the page.
"""
from __future__ import annotations

import html
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr
from fastapi import FastAPI

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.palette import palette_css
from specscope.app.plot import serve_plotly_js
from specscope.app.session import Backend
from specscope.app.sweep import example
from specscope.app.tabs.analysis import build_analysis
from specscope.app.tabs.bench import build_bench
from specscope.app.tabs.card import build_model_card
from specscope.app.tabs.chat import build_chat
from specscope.app.tabs.compare import build_compare
from specscope.app.tabs.models import build_model_picker
from specscope.app.tabs.race import build_race
from specscope.app.tabs.runs import ALL, build_runs
from specscope.app.tabs.scheduler import build_scheduler
from specscope.app.tabs.viz import build_viz

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # read when Blocks are built and served

STATIC = Path(__file__).resolve().parent / "static"
HEALTH_EVERY_S = 1.0
SYSTEM_FONTS = [gr.themes.Font("ui-sans-serif"), gr.themes.Font("system-ui"), gr.themes.Font("sans-serif")]
MONO_FONTS = [gr.themes.Font("ui-monospace"), gr.themes.Font("monospace")]


def status_html(health: dict[str, Any] | None, problem: str = "", switching: str | None = None) -> str:
    """The banner: backend unavailable (with why), or connected with the model (and the one it switches to) and pool
    usage."""
    if health is None:
        return (f'<div class="ss-status ss-status-down" id="ss-down">⚠ {html.escape(problem)} · retrying every '
                f'{HEALTH_EVERY_S:g} s</div>')
    pool = health.get("pool") or {}
    store = health.get("store") or {}
    outage = "" if store.get("status", "ok") == "ok" else (
        ' · <b id="ss-store-down">⚠ run store not answering: runs go on and are stored when it is back</b>')
    moving = f' · <b id="ss-switching">switching to {html.escape(switching)}…</b>' if switching else ""
    return (f'<div class="ss-status ss-status-up" id="ss-up">● backend connected · model '
            f'{html.escape(str(health.get("model", "?")))}{moving} · active runs {health.get("active_runs", 0)} · '
            f'{slots_text(health.get("active_runs", 0), pool)}{outage}</div>')


def slots_text(active: Any, pool: dict[str, Any]) -> str:
    """The KV pool's use: the slots in use of all; with no run active, slots still held are said to be held outside
    any run (the engine's own ratings or re-scoring between steps, or a run's slots not yet released)."""
    used, slots = pool.get("used", "?"), pool.get("slots", "?")
    if active == 0 and isinstance(used, int) and used > 0:
        return (f'<span title="no run holds them: the engine\'s own rating or re-scoring between its steps, or a run '
                f'that just ended">KV slots held outside any run {used}/{slots}</span>')
    return f"KV slots in use {used}/{slots}"


def switching_html(name: str) -> str:
    return (f'<div id="model-switching" class="ss-note">switching to <b>{html.escape(name)}</b>… (its runs are '
            f'cancelled; sending waits until it is served)</div>')


def build_ui(backend: Backend) -> gr.Blocks:
    with gr.Blocks(title="specscope", analytics_enabled=False) as demo:
        with gr.Row():
            gr.Markdown("## specscope · self-speculative decoding, round by round")
        picker = build_model_picker(backend)
        card = build_model_card(backend)
        status = gr.HTML(status_html(None, "connecting to the backend…"), elem_id="ss-status")
        with gr.Tabs() as tabs:
            with gr.Tab("Chat", id="chat"):
                chat = build_chat(backend)
            with gr.Tab("Visualizer", id="viz") as viz_tab:
                viz = build_viz(backend, viz_tab)
            with gr.Tab("Compare", id="compare") as compare_tab:
                compare = build_compare(backend, compare_tab)
            with gr.Tab("Race", id="race"):
                race = build_race(backend)
            with gr.Tab("Runs", id="runs") as runs_tab:
                runs = build_runs(backend, runs_tab)
            with gr.Tab("Scheduler", id="scheduler") as scheduler_tab:
                scheduler = build_scheduler(backend, scheduler_tab)
            with gr.Tab("Analysis", id="analysis") as analysis_tab:
                build_analysis(backend, analysis_tab)
            with gr.Tab("Bench", id="bench") as bench_tab:
                build_bench(backend, bench_tab)
        health_timer = gr.Timer(HEALTH_EVERY_S)

        def check(modes: list[dict], chosen: str | None, request: gr.Request) -> list[Any]:
            """Health banner; (re)load the mode lists when they are empty (first load, after an outage or a model
            switch), keeping the chat's chosen mode where the served model can run it."""
            client = backend.client(request)
            try:
                health = client.health()
                specs = client.modes() if not modes else None
            except (BackendUnavailable, BackendError) as exc:
                return [status_html(None, str(exc))] + [gr.skip()] * (len(checked) - 1)
            if specs is None:
                return [status_html(health, switching=backend.switching)] + [gr.skip()] * (len(checked) - 1)
            book = backend.remember_modes(client, specs)
            names = book.names()   # what the served model can run
            off = [f'{m["name"]} ({m["unavailable"]})' for m in specs if not m.get("available", True)]
            compared = book.picks("compare", names) or names[:3]   # each picker's defaults: the modes' own `picked`
            exact = book.baseline if book.baseline in names else names[0]
            hint = picker_hint(specs, off)
            return [status_html(health), specs,
                    # the chosen mode is kept by not sending a value (a switch answers after the model loaded:
                    # a value sent then would undo a mode picked meanwhile)
                    gr.Dropdown(choices=names, info=hint) if chosen in names else
                    gr.Dropdown(choices=names, info=hint, value=book.pick("chat", names)),
                    gr.CheckboxGroup(choices=names, value=compared, info=hint),
                    gr.Dropdown(choices=names, value=exact),
                    gr.Dropdown(choices=[ALL, *[m["name"] for m in specs]]),
                    gr.Dropdown(choices=names, info=hint, value=exact),
                    gr.Dropdown(choices=names, info=hint,
                                value=next(iter(book.picks("race", names)), names[-1])),
                    gr.Textbox(placeholder=example(specs))]

        def open_run(run_id: str) -> tuple[Any, Any]:
            return (gr.Tabs(selected="viz"), run_id) if run_id else (gr.skip(), gr.skip())

        def open_from_url(request: gr.Request) -> tuple[Any, Any, Any]:
            """`/?run=<id>&round=<n>` opens that run in the visualizer (app/static/viz.js then goes to the round);
            `/?forwards=<id>` replays that run's forwards in the Scheduler."""
            replayed = request.query_params.get("forwards", "").strip()
            if replayed:
                return gr.Tabs(selected="scheduler"), gr.skip(), replayed
            return *open_run(request.query_params.get("run", "").strip()), gr.skip()

        def begin_switch(name: str) -> tuple[str, Any]:
            """At once: say the switch is under way (so no health tick resets the picker before `switch_model`
            starts) and hold sending until the model is served."""
            backend.switching = name
            return switching_html(name), gr.Button(interactive=False, value="switching model…")

        def switch_model(name: str, chosen: str | None, request: gr.Request) -> list[Any]:
            """Serve another model, then reload the banner, the mode lists and its card in the same update, and let
            the chat send again. Meanwhile the picker shows `name` (no health tick resets it) and no session's
            message is sent (it would be answered by the old model)."""
            backend.switching = name
            try:
                shown = picker.switch(name, request)
            finally:
                backend.switching = None
            return [*shown, *check([], chosen, request), *card.load(request),
                    gr.Button(interactive=True, value="Send")]

        checked = [status, chat.modes, chat.mode, compare.modes, compare.reference, runs.mode, race.mode_a,
                   race.mode_b, compare.variants]
        demo.load(picker.show, None, [picker.choice, picker.info], concurrency_limit=None, show_progress="hidden")
        carded = [card.html, chat.examples, compare.examples]
        picker.choice.input(begin_switch, picker.choice, [picker.info, chat.send], queue=False).then(
            switch_model, [picker.choice, chat.mode], [picker.choice, picker.info, *checked, *carded, chat.send],
            concurrency_limit=1, show_progress="hidden")
        demo.load(card.load, None, carded, concurrency_limit=None, show_progress="hidden")
        demo.load(check, [chat.modes, chat.mode], checked, concurrency_limit=None, show_progress="hidden")
        demo.load(open_from_url, None, [tabs, viz.run, scheduler.run], concurrency_limit=None,
                  show_progress="hidden").then(scheduler.opened, scheduler.run, scheduler.shown,
                                               concurrency_limit=None, show_progress="hidden")
        health_timer.tick(check, [chat.modes, chat.mode], checked, concurrency_limit=None, show_progress="hidden")
        health_timer.tick(picker.follow, picker.choice, [picker.choice, picker.info], concurrency_limit=None,
                          show_progress="hidden")
        for button, source in ((chat.open_button, chat.run_id), (runs.open_button, runs.selected)):
            button.click(open_run, source, [tabs, viz.run], concurrency_limit=None)
    return demo


def picker_hint(specs: list[dict[str, Any]], off: list[str]) -> str | None:
    """What a mode picker says under it: the modes whose output may differ from the model's greedy decode (lossy,
    by the registry), and those the served model cannot run."""
    lossy = [m["name"] for m in specs if m.get("lossy") and m.get("available", True)]
    parts = ([f"lossy (output may differ from the model's greedy decode): {', '.join(lossy)}"] if lossy else []) + \
        ([f"not offered for this model: {', '.join(off)}"] if off else [])
    return " · ".join(parts) or None


def mount_ui(fastapi_app: FastAPI, backend_url: str | None = None, token: str | None = None) -> FastAPI:
    """Mount the UI at "/" after every other route, so /api and /ws keep answering.

    `backend_url` (ws://host:port) is the backend the UI drives; None means the server it is mounted on.
    `token` (default $SPECSCOPE_TOKEN) is sent to the backend, and the UI itself then asks for it at a login
    page (any user name, the token as password), so the UI cannot be used to bypass the backend's token.
    """
    token = token or os.environ.get("SPECSCOPE_TOKEN") or None
    demo = build_ui(Backend(backend_url, token))
    serve_plotly_js(fastapi_app)
    css = (STATIC / "specscope.css").read_text() + "\n" + palette_css()
    head = "".join(f"<script>{(STATIC / name).read_text()}</script>" for name in ("specscope.js", "viz.js"))
    theme = gr.themes.Default(font=SYSTEM_FONTS, font_mono=MONO_FONTS)
    login = {"auth": token_login(token), "auth_message": "Enter the server token as the password."} if token else {}
    return gr.mount_gradio_app(fastapi_app, demo, path="/", css=css, head=head, theme=theme, footer_links=[],
                               **login)


def token_login(token: str) -> Callable[[str, str], bool]:
    def check(_user: str, password: str) -> bool:
        return secrets.compare_digest(password.encode(), token.encode())
    return check
