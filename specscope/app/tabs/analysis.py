"""Analysis tab: stored runs picked by a filter, grouped by mode, model, status or a parameter, with each group's
accepted-length histogram, per-position acceptance, TPF and tok/s distributions, NFE against tokens, and CSV."""
from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gradio as gr

from specscope.app.analysis import (
    GROUP_FIELDS,
    Run,
    analysis_figures,
    group_runs,
    runs_csv,
    select_runs,
    summarize,
)
from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.figures import esc, fmt, warning_html
from specscope.app.plot import chart, figure_json
from specscope.app.session import Backend

STATUSES = ["done", "all", "cancelled", "error", "interrupted"]
FETCHED = 1000   # the newest runs the filter looks through (the REST list's limit)
CHARTS = ["an-hist", "an-positions", "an-tpf", "an-toks", "an-nfe"]
EXPORT_DIR = Path(tempfile.gettempdir()) / "specscope-exports"
FILTER_HELP = ('e.g. <code>delta=0.5 block_size&gt;=8 model=smollm2 since=2026-12-01 "capital of"</code>: '
               'parameter conditions (=, &gt;=, &lt;=; also mode=, sweep=, model= by prefix, since= a date) and '
               'words the prompt contains. Metrics are each run\'s own run_end metrics; hover a chart for its '
               'definition.')


def group_choices(runs: Sequence[Run]) -> list[str]:
    """mode, model, status, then every parameter the runs carry (`param:<name>`)."""
    names = sorted({name for r in runs for name in (r.get("params") or {})})
    return [*GROUP_FIELDS, *(f"param:{n}" for n in names)]


def summary_html(groups: Mapping[str, Sequence[Run]], fetched: int) -> str:
    if not groups:
        return f'<div class="ss-empty">No stored run matches (looked through the newest {fetched}).</div>'
    rows = "".join(
        f"<tr><td><b>{esc(s.group)}</b></td><td>{s.runs}</td><td>{s.tokens}</td><td>{fmt(s.tpf_mean, 2)}</td>"
        f"<td>{fmt(s.tok_s_median, 1)}</td><td>{fmt(s.accepted_mean, 2)}</td></tr>" for s in summarize(groups))
    total = sum(len(g) for g in groups.values())
    return (f'<div class="ss-note">{total} runs of the newest {fetched} match, in {len(groups)} groups.</div>'
            '<table class="ss-table" id="an-summary-table"><thead><tr><th>group</th><th>runs</th><th>tokens</th>'
            '<th title="tokens / NFE, the mean over the group\'s runs">mean TPF</th><th>median tok/s</th>'
            '<th title="tokens committed per round (accepted_len), over all the group\'s rounds">tokens per round'
            f'</th></tr></thead><tbody>{rows}</tbody></table>')


def build_analysis(backend: Backend, tab: gr.Tab) -> None:
    runs = gr.State([])
    with gr.Row():
        query = gr.Textbox(label="filter", elem_id="an-filter", scale=4,
                           placeholder='delta=0.5 block_size>=8 model=smollm2 "capital of"')
        status = gr.Dropdown(label="run status", choices=STATUSES, value="done", elem_id="an-status", scale=1)
        by = gr.Dropdown(label="group by", choices=list(GROUP_FIELDS), value="mode", elem_id="an-by", scale=1,
                         allow_custom_value=True)
        refresh = gr.Button("↻ analyse", variant="primary", elem_id="an-refresh", scale=0, min_width=110)
        export = gr.Button("Export CSV", elem_id="an-export", scale=0, min_width=110)
    gr.HTML(f'<div class="ss-note">{FILTER_HELP}</div>')
    summary = gr.HTML(elem_id="an-summary")
    with gr.Row():
        hist, positions = chart(CHARTS[0]), chart(CHARTS[1])
    with gr.Row():
        tpf, toks = chart(CHARTS[2]), chart(CHARTS[3])
    nfe = chart(CHARTS[4])
    download = gr.File(label="CSV", elem_id="an-file", interactive=False, visible=False)

    def analyse(found: Sequence[Run], text: str, group_by: str, request: gr.Request) -> list[Any]:
        groups = group_runs(select_runs(found, text), group_by or "mode")
        book = backend.modes(backend.client(request))
        figures = analysis_figures(groups, group_by or "mode", book) if groups else [None] * len(CHARTS)
        return [summary_html(groups, len(found)), *(figure_json(f) for f in figures)]

    def fetch(state: str, text: str, group_by: str, request: gr.Request) -> list[Any]:
        """The newest runs (of one status), then their analysis."""
        try:
            found = backend.client(request).runs(None, None if state == "all" else state, limit=FETCHED)
        except (BackendUnavailable, BackendError) as exc:
            return [gr.skip(), gr.skip(), warning_html(exc), *[gr.skip()] * len(CHARTS)]
        return [found, gr.Dropdown(choices=group_choices(found)), *analyse(found, text, group_by, request)]

    def save_csv(found: Sequence[Run], text: str, group_by: str) -> Any:
        groups = group_runs(select_runs(found, text), group_by or "mode")
        EXPORT_DIR.mkdir(exist_ok=True)
        path = EXPORT_DIR / "specscope-analysis.csv"
        path.write_text(runs_csv(groups))
        return gr.File(str(path), visible=True)

    charts = [hist, positions, tpf, toks, nfe]
    for trigger in (refresh.click, status.change, tab.select):
        trigger(fetch, [status, query, by], [runs, by, summary, *charts], concurrency_limit=None)
    for trigger in (query.submit, by.change):
        trigger(analyse, [runs, query, by], [summary, *charts], concurrency_limit=None)
    export.click(save_csv, [runs, query, by], download, concurrency_limit=None)
