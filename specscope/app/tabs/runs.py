"""Runs tab: stored runs filtered by mode, status and a filter (parameters, model, prompt words), with the parameters
that differ from their mode's defaults; open one in the visualizer, delete it, export it."""
from __future__ import annotations

import html
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gradio as gr

from specscope.app.analysis import mode_defaults, params_label, select_runs
from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.figures import alarm_html, fmt, plural, warning_html
from specscope.app.session import Backend
from specscope.app.tabs.why import diverge_from_row
from specscope.backend.engine.draft_tiers import tier_note

ALL = "all"
STATUSES = [ALL, "running", "done", "cancelled", "error", "interrupted"]
COLUMNS = ["run id", "created", "mode", "params", "model", "status", "alarm", "tokens", "rounds", "NFE", "TPF",
           "load tier", "prompt"]
WIDTHS: list[str | int] = ["145px", "100px", "100px", "140px", "110px", "75px", "70px", "62px", "62px", "50px",
                           "50px", "110px", "130px"]
"""Each column's width: every header word and parameter fits on one line; a narrow screen scrolls the table."""
DATATYPES: list[Literal["str", "html"]] = ["html" if column == "alarm" else "str" for column in COLUMNS]
"""The alarm is a badge whose hover says why."""
EXPORTS = {"json": ".json", "perfetto": ".perfetto.json"}
EXPORT_DIR = Path(tempfile.gettempdir()) / "specscope-exports"


@dataclass
class RunsTab:
    mode: gr.Dropdown
    selected: gr.Textbox
    open_button: gr.Button


def model_label(run: Mapping[str, Any]) -> str:
    """The model a run used: its name and weights hash, as far as they were recorded."""
    return " · ".join(str(v) for v in (run.get("model"), run.get("model_hash")) if v) or "?"


def table_rows(runs: Sequence[Mapping[str, Any]],
               defaults: dict[str, dict[str, Any]] | None = None) -> list[list[Any]]:
    rows = []
    for r in runs:
        m = r.get("metrics") or {}
        rows.append([r["run_id"], r["created_at"][:19].replace("T", " "), r["mode"], params_label(r, defaults),
                     model_label(r), r["status"], alarm_html(m), r["n_tokens"], r["n_rounds"], fmt(m.get("nfe")),
                     fmt(m.get("tpf"), 2), tier_note(m.get("tier_cut")), r["prompt"][:80]])
    return rows


def build_runs(backend: Backend, tab: gr.Tab) -> RunsTab:
    with gr.Row():
        mode = gr.Dropdown(label="run mode", choices=[ALL], value=ALL, elem_id="runs-mode", scale=1)
        status = gr.Dropdown(label="run status", choices=STATUSES, value=ALL, elem_id="runs-status", scale=1)
        query = gr.Textbox(label="filter (Enter)", elem_id="runs-filter", scale=3,
                           placeholder='delta=0.5 block_size>=8 model=smollm2 "capital of"')
        refresh = gr.Button("↻ refresh", elem_id="runs-refresh", scale=0, min_width=100)
    table = gr.Dataframe(headers=COLUMNS, value=[], interactive=False, wrap=True, elem_id="runs-table",
                         label="runs (click a row to select it)", column_widths=WIDTHS, datatype=DATATYPES)
    with gr.Row():
        selected = gr.Textbox(label="selected run", interactive=True, elem_id="runs-selected", scale=3)
        open_button = gr.Button("Open in visualizer", elem_id="runs-open", scale=1)
        delete = gr.Button("Delete…", variant="stop", elem_id="runs-delete", scale=1)
        export_json = gr.Button("Export JSON", elem_id="runs-export-json", scale=1)
        export_perfetto = gr.Button("Export Perfetto", elem_id="runs-export-perfetto", scale=1)
    with gr.Row(visible=False, elem_id="runs-confirm-row") as confirm_row:
        confirm_text = gr.HTML(elem_id="runs-confirm-text")
        confirm = gr.Button("Yes, delete", variant="stop", elem_id="runs-confirm", scale=0, min_width=120)
        cancel = gr.Button("Keep it", elem_id="runs-cancel", scale=0, min_width=100)
    message = gr.HTML(elem_id="runs-message")
    diverge_from_row(backend, selected, "runs")
    download = gr.File(label="download", elem_id="runs-file", interactive=False, visible=False)

    def refresh_table(mode_name: str, state: str, text: str, request: gr.Request) -> tuple[Any, str]:
        client = backend.client(request)
        try:
            runs = client.runs(None if mode_name == ALL else mode_name, None if state == ALL else state, limit=500)
            defaults = mode_defaults(client.modes())
        except (BackendUnavailable, BackendError) as exc:
            return gr.skip(), warning_html(exc)
        shown = select_runs(runs, text)
        return table_rows(shown, defaults), plural(len(shown), "run") + (f" of {len(runs)}" if text.strip() else "")

    def select(evt: gr.SelectData) -> str:
        row = evt.row_value or []
        return str(row[0]) if row else gr.skip()

    def ask(run_id: str, request: gr.Request) -> tuple[Any, Any, str]:
        """Deleting needs a second click; the question names the saved comparisons the run would leave."""
        if not run_id:
            return gr.Row(visible=False), gr.skip(), "Select a run first."
        try:
            within = [c for c in backend.client(request).comparisons() if run_id in c["run_ids"]]
        except (BackendUnavailable, BackendError) as exc:
            return gr.Row(visible=False), gr.skip(), warning_html(exc)
        names = ", ".join(f"<b>{html.escape(c['label'] or c['comparison_id'])}</b>" for c in within)
        also = f" It is part of saved comparison(s) {names}, which will no longer include it." if within else ""
        return gr.Row(visible=True), f"Delete run <code>{html.escape(run_id)}</code> for good?{also}", ""

    def remove(run_id: str, mode_name: str, state: str, text: str,
               request: gr.Request) -> tuple[Any, str, str, Any]:
        client = backend.client(request)
        try:
            client.delete_run(run_id)
        except (BackendUnavailable, BackendError) as exc:
            return gr.skip(), warning_html(exc), gr.skip(), gr.Row(visible=False)
        backend.forget(client, run_id)
        rows, _ = refresh_table(mode_name, state, text, request)
        return rows, f"Deleted <code>{html.escape(run_id)}</code>.", "", gr.Row(visible=False)

    def export(fmt_name: str) -> Any:
        def run_export(run_id: str, request: gr.Request) -> tuple[Any, str]:
            if not run_id:
                return gr.File(visible=False), "Select a run first."
            try:
                body = backend.client(request).export(run_id, fmt_name)
            except (BackendUnavailable, BackendError) as exc:
                return gr.File(visible=False), warning_html(exc)
            EXPORT_DIR.mkdir(exist_ok=True)
            path = EXPORT_DIR / (re.sub(r"[^\w.-]", "_", run_id) + EXPORTS[fmt_name])
            path.write_bytes(body)
            note = f"Exported <code>{html.escape(path.name)}</code> ({len(body)} bytes)."
            return gr.File(str(path), visible=True), note
        return run_export

    filters = [mode, status, query]
    for trigger in (refresh.click, mode.change, status.change, query.submit, tab.select):
        trigger(refresh_table, filters, [table, message], concurrency_limit=None)
    table.select(select, None, selected, concurrency_limit=None)
    delete.click(ask, selected, [confirm_row, confirm_text, message], concurrency_limit=None)
    confirm.click(remove, [selected, *filters], [table, message, selected, confirm_row], concurrency_limit=None)
    cancel.click(lambda: gr.Row(visible=False), None, confirm_row, queue=False)
    export_json.click(export("json"), selected, [download, message], concurrency_limit=None)
    export_perfetto.click(export("perfetto"), selected, [download, message], concurrency_limit=None)
    return RunsTab(mode=mode, selected=selected, open_button=open_button)
