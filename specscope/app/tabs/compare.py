"""Compare tab, an experiment bench: one prompt through several modes and parameter variants (one after another or
side by side; Stop cancels what runs and skips what waits), aligned on NFE, with a metrics table (CSV export), a
"same output as reference" badge, token diffs and a link that opens each run in the visualizer; comparisons are
saved and reopened with their settings."""
from __future__ import annotations

import asyncio
import csv
import html
import io
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable, Client
from specscope.app.diverge import differing_pairs
from specscope.app.figures import (
    acceptance_by_position_figure,
    comparison_figure,
    comparison_rows,
    load_warning_html,
    metrics_table_html,
    plural,
    run_labels,
    speedup_html,
    token_diff_html,
    warning_html,
)
from specscope.app.limits import LENGTH_NOTE, MAX_NEW_LABEL, clamp_max_new, served_toggle, too_long
from specscope.app.modebook import ModeBook
from specscope.app.plot import chart, figure_json
from specscope.app.session import Backend, StopFlags
from specscope.app.sweep import EXAMPLE, Variant, parse_variants
from specscope.app.tabs.card import example_picker
from specscope.app.tabs.why import BUTTON, pair_html
from specscope.app.trace import RunTrace

SIDE_BY_SIDE = "side by side (concurrently)"
EXPORT_DIR = Path(tempfile.gettempdir()) / "specscope-exports"


@dataclass
class CompareTab:
    modes: gr.CheckboxGroup
    reference: gr.Dropdown
    examples: gr.Dataset
    variants: gr.Textbox


def pick_reference(traces: list[RunTrace], mode: str | None) -> RunTrace | None:
    return next((t for t in traces if t.mode == mode), traces[0] if traces else None)


def plan(modes: list[str], variants: list[Variant]) -> list[Variant]:
    """The runs of a comparison: each ticked mode with its defaults, then the variants."""
    return [(m, {}) for m in modes] + variants


def settings_of(traces: list[RunTrace]) -> tuple[list[str], str, int | None]:
    """A saved comparison's settings, read back from its runs: ticked modes, variant lines, max_new_tokens."""
    modes, lines = [], []
    for t, label in zip(traces, run_labels(traces), strict=True):
        if label == t.mode:
            modes.append(t.mode)
        else:
            lines.append(label)
    max_new = next((int(t.params["max_new_tokens"]) for t in traces if "max_new_tokens" in t.params), None)
    return modes, "\n".join(lines), max_new


def diffs_html(traces: list[RunTrace], reference: RunTrace | None, backend: Backend, client: Client) -> str:
    rows = []
    labels = dict(zip((t.run_id for t in traces), run_labels(traces), strict=True))
    for t in traces:
        piece = backend.piece(client, t)
        label = f"<b>{html.escape(labels[t.run_id])}</b> <code>{html.escape(t.run_id)}</code>"
        base = t if reference is None else reference
        against = " (reference)" if base is t else f" vs {html.escape(labels[base.run_id])}"
        rows.append(f'<div class="ss-diff-row">{label}{against}'
                    f'{token_diff_html(base.output_ids, t.output_ids, piece)}</div>')
    return "".join(rows)


Ratings = dict[str, dict[str, Any] | str]


def ratings(traces: list[RunTrace], client: Client, known: Ratings | None = None) -> Ratings:
    """The served model's rating of each ended run's answer, or why there is none (a run of other weights or
    matmul precision); those in `known` are not asked again, and the new ones are added to it."""
    out: Ratings = {} if known is None else known
    for t in traces:
        if t.run_id and t.status != "running" and t.run_id not in out:
            try:
                out[t.run_id] = client.fit(t.run_id)
            except BackendError as e:
                out[t.run_id] = "made by other weights or matmuls" if e.status == 409 else "not rated"
    return out


RESULTS = 5
"""What `results` fills: the NFE chart, the acceptance-by-position chart, the table, the diffs, the diverge pairs."""


def results(traces: list[RunTrace], ref_mode: str | None, backend: Backend, client: Client,
            known: Ratings | None = None) -> list[Any]:
    """Charts, metrics table (a warning first when runs were measured under different load; the served model's
    rating of each answer), diffs of finished runs, and the pairs of runs whose outputs differ (for "why did they
    diverge?")."""
    reference = pick_reference(traces, ref_mode)
    book = backend.modes(client)
    table = (load_warning_html(traces, reference)
             + metrics_table_html(traces, reference, book, ratings(traces, client, known))
             + speedup_html(traces, book))
    pairs = differing_pairs(traces, reference, run_labels(traces))
    return [figure_json(comparison_figure(traces, book)), figure_json(acceptance_by_position_figure(traces, book)),
            table,
            diffs_html(traces, reference, backend, client),
            gr.Dropdown(choices=pairs, value=pairs[0][1] if pairs else None, visible=bool(pairs))]


def ended(traces: list[RunTrace]) -> list[RunTrace]:
    """The runs the backend took that have ended, in the comparison's order: the rows shown so far."""
    return [t for t in traces if started(t) and t.status != "running"]


def csv_text(traces: list[RunTrace], reference: RunTrace | None, book: ModeBook) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(comparison_rows(traces, reference, book))
    return out.getvalue()


def started(trace: RunTrace) -> bool:
    """Whether the backend took the run (it has an id) or refused it (an error)."""
    return bool(trace.run_id or trace.error)


def run_state(trace: RunTrace, stopped: bool) -> str:
    """A planned run's state: queued until the backend starts it (not run, once the comparison was stopped), then
    its status and rounds."""
    if started(trace):
        return f"{trace.status} ({plural(len(trace.rounds), 'round')})"
    return "not run (stopped)" if stopped else "queued"


def progress_html(traces: list[RunTrace], stopped: bool = False) -> str:
    return " · ".join(f"<b>{html.escape(label)}</b> {run_state(t, stopped)}"
                      for t, label in zip(traces, run_labels(traces), strict=True))


def build_compare(backend: Backend, tab: gr.Tab) -> CompareTab:
    stops = StopFlags()
    with gr.Row():
        prompt = gr.Textbox(label=f"prompt ({LENGTH_NOTE})", value="What is 12 + 30?", elem_id="cmp-prompt",
                            scale=3)
        max_new = gr.Number(label=MAX_NEW_LABEL, value=16, precision=0, elem_id="cmp-max-new", scale=1)
    examples = example_picker(prompt, "cmp-examples")
    with gr.Row():
        modes = gr.CheckboxGroup(label="modes (defaults)", choices=[], value=[], elem_id="cmp-modes",
                                 scale=3)   # the served modes and the defaults they declare, once they load (ui.py)
        reference = gr.Dropdown(label="reference mode (same-output badge)", choices=[], value=None,
                                elem_id="cmp-reference", scale=1)
        layout = gr.Radio(["one after another", SIDE_BY_SIDE], value="one after another", label="run",
                          elem_id="cmp-layout", scale=1)
        served = served_toggle("cmp-served")
    variants = gr.Textbox(label="parameter variants (one line per sweep: mode key=v1,v2,… ; every combination runs)",
                          placeholder=EXAMPLE, lines=2, max_lines=8, elem_id="cmp-variants")
    with gr.Row():
        go = gr.Button("Run comparison", variant="primary", elem_id="cmp-run", scale=3)
        stop = gr.Button("Stop", elem_id="cmp-stop", scale=1)
    status = gr.HTML(elem_id="cmp-status")
    aligned = chart("cmp-chart")
    positions = chart("cmp-positions")
    table = gr.HTML(elem_id="cmp-table")
    with gr.Row():
        pair = gr.Dropdown(label="runs whose outputs differ", choices=[], elem_id="cmp-diverge-pair", scale=3,
                           visible=False)
        why = gr.Button(BUTTON, elem_id="cmp-diverge", scale=1)
    why_report = gr.HTML(elem_id="cmp-diverge-report")
    with gr.Row():
        export = gr.Button("Export table as CSV", elem_id="cmp-csv", scale=0, min_width=180)
        download = gr.File(label="CSV", elem_id="cmp-csv-file", interactive=False, visible=False, scale=1)
    diffs = gr.HTML(elem_id="cmp-diffs")
    run_ids = gr.State([])
    with gr.Row():
        label = gr.Textbox(label="comparison name", placeholder="name this comparison", elem_id="cmp-label", scale=3)
        save = gr.Button("Save comparison", elem_id="cmp-save", scale=1)
    with gr.Row():
        saved = gr.Dropdown(label="saved comparisons", choices=[], elem_id="cmp-saved", scale=3)
        refresh = gr.Button("↻", elem_id="cmp-refresh", scale=0, min_width=60)
        reopen = gr.Button("Open", elem_id="cmp-open", scale=1)

    async def consume(client: Client, text: str, trace: RunTrace, params: dict[str, Any],
                      stop: Callable[[], bool]) -> None:
        async for event in client.generate(text, trace.mode, params, stop=stop):
            trace.run_id = trace.run_id or str(event.get("run_id", ""))
            trace.add(event)

    async def run(text: str, chosen: list[str], lines: str, ref_mode: str, how: str, max_new_tokens: float | None,
                  tiered: bool, request: gr.Request) -> AsyncIterator[list[Any]]:
        """Run the plan; each run's row (and the charts, diffs and pairs) appear as it ends."""
        skip = [gr.skip()] * (RESULTS + 2)
        client = backend.client(request)
        try:
            runs = plan(chosen, parse_variants(lines or "", await asyncio.to_thread(client.modes)))
        except (BackendUnavailable, BackendError, ValueError) as exc:
            yield [warning_html(exc), *skip]
            return
        why = too_long(text) or (None if text.strip() and runs else "Give a prompt and at least one mode or variant.")
        if why:
            yield [html.escape(why), *skip]
            return
        limit = clamp_max_new(max_new_tokens)
        traces = [RunTrace(run_id="", mode=m, params={"tiers": bool(tiered), **p, "max_new_tokens": limit})
                  for m, p in runs]
        cleared = ["", "", "", "", gr.Dropdown(choices=[], value=None, visible=False)]
        yield [progress_html(traces), *cleared, [], limit]  # the previous results go at once
        stops.clear(request)
        stopped = stops.checker(request)
        known: Ratings = {}
        shown_ids: list[str] = []
        try:
            async for _ in run_groups(traces, how, lambda t: consume(client, text, t, dict(t.params), stopped),
                                      stopped):
                done = ended(traces)
                if [t.run_id for t in done] != shown_ids:   # a run ended: its row appears now
                    shown_ids = [t.run_id for t in done]
                    shown = await asyncio.to_thread(results, done, ref_mode, backend, client, known)
                    yield [progress_html(traces), *shown, shown_ids, gr.skip()]
                else:
                    yield [progress_html(traces), *skip]
        except (BackendUnavailable, BackendError) as exc:
            yield [warning_html(exc), *skip]
            return
        finally:
            stops.clear(request)
        ran = [t for t in traces if started(t)]
        shown = await asyncio.to_thread(results, ran, ref_mode, backend, client, known) if ran else cleared
        yield [progress_html(traces, stopped=len(ran) < len(traces)), *shown, [t.run_id for t in ran], gr.skip()]

    def store(text: str, name: str, ids: list[str], ref_mode: str, request: gr.Request) -> tuple[str, Any]:
        """Save the runs, the reference's run first (reopening takes the first run's mode as the reference)."""
        if not ids:
            return "Run a comparison first.", gr.skip()
        try:
            client = backend.client(request)
            traces = [backend.trace(client, run_id) for run_id in ids]
            ref = pick_reference(traces, ref_mode)
            ordered = [t.run_id for t in sorted(traces, key=lambda t: t is not ref)]
            made = client.create_comparison(name or text[:40], text, ordered)
            return f"Saved as <code>{made['comparison_id']}</code>.", saved_choices(client, made["comparison_id"])
        except (BackendUnavailable, BackendError) as exc:
            return warning_html(exc), gr.skip()

    def saved_choices(client: Client, value: str | None = None) -> gr.Dropdown:
        found = client.comparisons()
        return gr.Dropdown(choices=[(f"{c['label'] or c['comparison_id']} · {plural(len(c['run_ids']), 'run')}",
                                     c["comparison_id"]) for c in found], value=value)

    def list_saved(request: gr.Request) -> Any:
        try:
            return saved_choices(backend.client(request))
        except (BackendUnavailable, BackendError):
            return gr.skip()

    def open_saved(comparison_id: str | None, request: gr.Request) -> list[Any]:
        """The saved runs' results, and the settings they were run with back in the inputs."""
        if not comparison_id:
            return ["Pick a saved comparison.", *[gr.skip()] * (RESULTS + 7)]
        try:
            client = backend.client(request)
            found = client.comparison(comparison_id)
            traces = [backend.trace(client, run_id) for run_id in found["run_ids"]]
            ref_mode = traces[0].mode if traces else None
            shown = results(traces, ref_mode, backend, client)
        except (BackendUnavailable, BackendError) as exc:
            return [warning_html(exc), *[gr.skip()] * (RESULTS + 7)]
        chosen, lines, max_new_tokens = settings_of(traces)
        head = (f"Comparison <b>{html.escape(found['label'] or comparison_id)}</b> · {plural(len(traces), 'run')} · "
                f"prompt <code>{html.escape(found['prompt'])}</code>")
        return [head, *shown, found["run_ids"], found["prompt"], chosen, lines,
                max_new_tokens if max_new_tokens is not None else gr.skip(), ref_mode]

    def export_csv(ids: list[str], ref_mode: str | None, request: gr.Request) -> tuple[Any, str]:
        if not ids:
            return gr.File(visible=False), "Run or open a comparison first."
        try:
            client = backend.client(request)
            traces = [backend.trace(client, run_id) for run_id in ids]
            book = backend.modes(client, fresh=True)
        except (BackendUnavailable, BackendError) as exc:
            return gr.File(visible=False), warning_html(exc)
        EXPORT_DIR.mkdir(exist_ok=True)
        path = EXPORT_DIR / f"comparison-{ids[0]}.csv"
        path.write_text(csv_text(traces, pick_reference(traces, ref_mode), book))
        return gr.File(str(path), visible=True), f"Exported <code>{html.escape(path.name)}</code>."

    shown = [aligned, positions, table, diffs, pair]
    go.click(run, [prompt, modes, variants, reference, layout, max_new, served],
             [status, *shown, run_ids, max_new], concurrency_limit=None, show_progress="hidden")

    def explain(chosen: str | None, request: gr.Request) -> str:
        return pair_html(backend, request, chosen)

    why.click(explain, pair, why_report, concurrency_limit=None)
    stop.click(stops.request, None, None, queue=False)
    save.click(store, [prompt, label, run_ids, reference], [status, saved], concurrency_limit=None)
    refresh.click(list_saved, None, saved, concurrency_limit=None)
    tab.select(list_saved, None, saved, concurrency_limit=None)
    reopen.click(open_saved, saved, [status, *shown, run_ids, prompt, modes, variants, max_new, reference],
                 concurrency_limit=None)
    export.click(export_csv, [run_ids, reference], [download, status], concurrency_limit=None)
    for trigger in (max_new.blur, max_new.submit):
        trigger(clamp_max_new, max_new, max_new, queue=False)
    return CompareTab(modes=modes, reference=reference, examples=examples, variants=variants)


async def run_groups(traces: list[RunTrace], how: str, consume: Callable[[RunTrace], Coroutine[Any, Any, None]],
                     stopped: Callable[[], bool]) -> AsyncIterator[None]:
    """Run the traces side by side or one after another, yielding every quarter second while they run; once
    `stopped()`, the runs under way are cancelled (by `consume`'s stop) and those not started are skipped."""
    groups = [traces] if how == SIDE_BY_SIDE else [[t] for t in traces]
    for group in groups:
        if stopped():
            return
        tasks = [asyncio.create_task(consume(t)) for t in group]
        try:
            while not all(task.done() for task in tasks):
                yield
                await asyncio.wait(tasks, timeout=0.25)
            for task in tasks:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
