""""Why did they diverge?": a pair of run ids asked of /api/diverge (through the client) and the report drawn as HTML
(app/diverge.py), shared by the Compare, Runs and Visualizer tabs."""
from __future__ import annotations

import re

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.diverge import diverge_html
from specscope.app.figures import warning_html
from specscope.app.session import Backend

RUN_IDS = re.compile(r"[^\s,]+")
BUTTON = "why did they diverge?"


def why_html(backend: Backend, request: gr.Request, a: str, b: str) -> str:
    """The divergence report of runs a and b, or why there is none (a missing id, an unknown or running run)."""
    a, b = (a or "").strip(), (b or "").strip()
    if not a or not b:
        return "Give two run ids: the run and the one to diverge from."
    if a == b:
        return "Pick two different runs."
    client = backend.client(request)
    try:
        report = client.diverge(a, b)
        piece = backend.piece(client, backend.trace(client, a))
    except BackendError as exc:
        if exc.status == 404:
            return warning_html(f"no stored run {a} or {b}")
        return warning_html(exc)
    except BackendUnavailable as exc:
        return warning_html(exc)
    return diverge_html(report, piece)


def pair_html(backend: Backend, request: gr.Request, pair: str | None) -> str:
    """The report of a pair given as 'A B' (the Compare tab's choice)."""
    ids = RUN_IDS.findall(pair or "")
    if len(ids) != 2:
        return "Pick a pair of runs whose outputs differ."
    return why_html(backend, request, *ids)


def diverge_from_row(backend: Backend, run: gr.Textbox | gr.Dropdown, prefix: str) -> None:
    """'diverge from …': a run-id box and the button, under a tab whose `run` component holds the run; the report
    below them."""
    with gr.Row():
        other = gr.Textbox(label="diverge from … (another run id of the same prompt)", elem_id=f"{prefix}-diverge-from",
                           scale=3, max_lines=1)
        button = gr.Button(BUTTON, elem_id=f"{prefix}-diverge", scale=1)
    report = gr.HTML(elem_id=f"{prefix}-diverge-report")

    def explain(a: str | None, b: str, request: gr.Request) -> str:
        return why_html(backend, request, a or "", b) if a else "Select a run first."

    for trigger in (button.click, other.submit):
        trigger(explain, [run, other], report, concurrency_limit=None)
