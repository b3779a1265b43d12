"""Compare tab: one prompt through several modes (one after another or side by side), aligned on NFE, with a
metrics table, a "same output as reference" badge and token diffs; comparisons are saved and reopened."""
from __future__ import annotations

import asyncio
import html
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from app.client import BackendError, BackendUnavailable, Client
from app.figures import comparison_figure, metrics_table_html, token_diff_html, warning_html
from app.plot import chart, figure_json
from app.session import Backend
from app.trace import RunTrace

DEFAULT_MODES = ["ar", "block_diffusion", "linear_spec"]
SIDE_BY_SIDE = "side by side (concurrently)"


@dataclass
class CompareTab:
    modes: gr.CheckboxGroup
    reference: gr.Dropdown


def pick_reference(traces: list[RunTrace], mode: str | None) -> RunTrace | None:
    return next((t for t in traces if t.mode == mode), traces[0] if traces else None)


def diffs_html(traces: list[RunTrace], reference: RunTrace | None, backend: Backend, client: Client) -> str:
    rows = []
    for t in traces:
        piece = backend.piece(client, t)
        label = f"<b>{html.escape(t.mode)}</b> <code>{html.escape(t.run_id)}</code>"
        base = t if reference is None else reference
        against = " (reference)" if base is t else f" vs {html.escape(base.mode)}"
        rows.append(f'<div class="ss-diff-row">{label}{against}'
                    f'{token_diff_html(base.output_ids, t.output_ids, piece)}</div>')
    return "".join(rows)


def results(traces: list[RunTrace], ref_mode: str | None, backend: Backend, client: Client) -> list[Any]:
    """Chart, metrics table and diffs of finished runs."""
    reference = pick_reference(traces, ref_mode)
    lossless = {m["name"]: m.get("lossless_vs") for m in client.modes()}
    return [figure_json(comparison_figure(traces)), metrics_table_html(traces, reference, lossless),
            diffs_html(traces, reference, backend, client)]


def progress_html(traces: list[RunTrace]) -> str:
    return " · ".join(f"<b>{html.escape(t.mode)}</b> {t.status} ({len(t.rounds)} rounds)" for t in traces)


def build_compare(backend: Backend, tab: gr.Tab) -> CompareTab:
    with gr.Row():
        prompt = gr.Textbox(label="prompt", value="What is 12 + 30?", elem_id="cmp-prompt", scale=3)
        max_new = gr.Number(label="max_new_tokens", value=16, precision=0, minimum=1, maximum=1024,
                            elem_id="cmp-max-new", scale=1)
    with gr.Row():
        modes = gr.CheckboxGroup(label="modes", choices=DEFAULT_MODES, value=DEFAULT_MODES, elem_id="cmp-modes",
                                 scale=3)
        reference = gr.Dropdown(label="reference mode (same-output badge)", choices=DEFAULT_MODES, value="ar",
                                elem_id="cmp-reference", scale=1)
        layout = gr.Radio(["one after another", SIDE_BY_SIDE], value="one after another", label="run",
                          elem_id="cmp-layout", scale=1)
    go = gr.Button("Run comparison", variant="primary", elem_id="cmp-run")
    status = gr.HTML(elem_id="cmp-status")
    aligned = chart("cmp-chart")
    table = gr.HTML(elem_id="cmp-table")
    diffs = gr.HTML(elem_id="cmp-diffs")
    run_ids = gr.State([])
    with gr.Row():
        label = gr.Textbox(label="comparison name", placeholder="name this comparison", elem_id="cmp-label", scale=3)
        save = gr.Button("Save comparison", elem_id="cmp-save", scale=1)
    with gr.Row():
        saved = gr.Dropdown(label="saved comparisons", choices=[], elem_id="cmp-saved", scale=3)
        refresh = gr.Button("↻", elem_id="cmp-refresh", scale=0, min_width=60)
        reopen = gr.Button("Open", elem_id="cmp-open", scale=1)

    async def consume(client: Client, text: str, trace: RunTrace, max_new_tokens: int) -> None:
        async for event in client.generate(text, trace.mode, {"max_new_tokens": int(max_new_tokens)}):
            trace.run_id = trace.run_id or str(event.get("run_id", ""))
            trace.add(event)

    async def run(text: str, chosen: list[str], ref_mode: str, how: str, max_new_tokens: float,
                  request: gr.Request) -> AsyncIterator[list[Any]]:
        if not text.strip() or not chosen:
            yield ["Give a prompt and at least one mode.", gr.skip(), gr.skip(), gr.skip(), gr.skip()]
            return
        client = backend.client(request)
        traces = [RunTrace(run_id="", mode=m) for m in chosen]
        groups = [traces] if how == SIDE_BY_SIDE else [[t] for t in traces]
        tasks: list[asyncio.Task] = []
        try:
            for group in groups:
                tasks = [asyncio.create_task(consume(client, text, t, int(max_new_tokens))) for t in group]
                while not all(task.done() for task in tasks):
                    yield [progress_html(traces), gr.skip(), gr.skip(), gr.skip(), gr.skip()]
                    await asyncio.sleep(0.25)
                for task in tasks:
                    task.result()
        except (BackendUnavailable, BackendError) as exc:
            yield [warning_html(exc), gr.skip(), gr.skip(), gr.skip(), gr.skip()]
            return
        finally:
            for task in tasks:
                task.cancel()
        shown = await asyncio.to_thread(results, traces, ref_mode, backend, client)
        yield [progress_html(traces), *shown, [t.run_id for t in traces]]

    def store(text: str, name: str, ids: list[str], request: gr.Request) -> tuple[str, Any]:
        if not ids:
            return "Run a comparison first.", gr.skip()
        try:
            client = backend.client(request)
            made = client.create_comparison(name or text[:40], text, ids)
            return f"Saved as <code>{made['comparison_id']}</code>.", saved_choices(client, made["comparison_id"])
        except (BackendUnavailable, BackendError) as exc:
            return warning_html(exc), gr.skip()

    def saved_choices(client: Client, value: str | None = None) -> gr.Dropdown:
        found = client.comparisons()
        return gr.Dropdown(choices=[(f"{c['label'] or c['comparison_id']} · {len(c['run_ids'])} runs",
                                     c["comparison_id"]) for c in found], value=value)

    def list_saved(request: gr.Request) -> Any:
        try:
            return saved_choices(backend.client(request))
        except (BackendUnavailable, BackendError):
            return gr.skip()

    def open_saved(comparison_id: str | None, ref_mode: str, request: gr.Request) -> list[Any]:
        if not comparison_id:
            return ["Pick a saved comparison.", gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()]
        try:
            client = backend.client(request)
            found = client.comparison(comparison_id)
            traces = [backend.trace(client, run_id) for run_id in found["run_ids"]]
            shown = results(traces, ref_mode, backend, client)
        except (BackendUnavailable, BackendError) as exc:
            return [warning_html(exc), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()]
        head = (f"Comparison <b>{html.escape(found['label'] or comparison_id)}</b> · "
                f"prompt <code>{html.escape(found['prompt'])}</code>")
        return [head, *shown, found["run_ids"], found["prompt"]]

    go.click(run, [prompt, modes, reference, layout, max_new], [status, aligned, table, diffs, run_ids])
    save.click(store, [prompt, label, run_ids], [status, saved], concurrency_limit=None)
    refresh.click(list_saved, None, saved, concurrency_limit=None)
    tab.select(list_saved, None, saved, concurrency_limit=None)
    reopen.click(open_saved, [saved, reference], [status, aligned, table, diffs, run_ids, prompt],
                 concurrency_limit=None)
    return CompareTab(modes=modes, reference=reference)
