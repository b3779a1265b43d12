"""Bench tab: the stored results of `specscope bench` (modes on the shipped model) and `specscope bench-kernels`
(dense vs folded verification on a GPU), read from the backend's /api/bench."""
from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

import gradio as gr
import plotly.graph_objects as go

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.figures import LAYOUT, fmt, warning_html
from specscope.app.modebook import ModeBook
from specscope.app.session import Backend
from specscope.backend.bench_cells import model_pick, same_as_reference

MODE_COLUMNS = ["mode", "NFE", "TPF", "tok/s", "vs exact", "tokens / round", "accuracy", "same as ref",
                "model's pick (NLL)"]
"""The bench table's columns before the modes' own (Mode.columns); `vs exact`: tok/s over the exact mode's (the
baseline)."""
KERNEL_COLUMNS = ["branches", "prefix", "fold target", "fold QKV", "fold FFN", "dense ms", "folded ms", "speedup",
                  "TFLOP/s dense", "TFLOP/s folded", "GB/s dense", "GB/s folded"]


def mode_columns(book: ModeBook) -> list[str]:
    """MODE_COLUMNS (`vs` the baseline by its name), then a column for each metric a mode declares of its own."""
    vs = f"vs {book.baseline}" if book.baseline else "vs exact"
    return [vs if c == "vs exact" else c for c in MODE_COLUMNS] + [c["label"] for c in book.all_columns()]


def mode_rows(doc: dict[str, Any] | None, book: ModeBook = ModeBook()) -> list[list[Any]]:
    """One row per mode of a `specscope bench` document, with the modes' own metric columns (`mode_columns`)."""
    rows = []
    for name, m in ((doc or {}).get("modes") or {}).items():
        own = {**(m.get("mode_metrics") or {}), **m}
        rows.append([name, m.get("nfe"), fmt(m.get("tpf"), 2), fmt(m.get("tok_per_s"), 0),
                     fmt(m.get("speedup_vs_ar"), 2), fmt(m.get("accept_len_mean"), 2),
                     fmt((m.get("accuracy") or {}).get("average"), 2),
                     same_as_reference(m), model_pick(m), *[fmt(own.get(c["key"]), 2) for c in book.all_columns()]])
    return rows


def kernel_rows(doc: dict[str, Any] | None) -> list[list[Any]]:
    """One row per (branches, prefix, fold target) of a `specscope bench-kernels` document."""
    keys = ["branches", "prefix", "target_fold", "fold_qkv", "fold_ffn", "dense_ms", "folded_ms", "speedup",
            "dense_tflops", "folded_tflops", "dense_gbps", "folded_gbps"]
    return [[r[k] if isinstance(r[k], int) else fmt(float(r[k]), 2) for k in keys] for r in (doc or {}).get("rows", [])]


def speedup_figure(doc: dict[str, Any] | None) -> go.Figure:
    """Folded-verify speedup over dense vs measured QKV fold ratio, one line per (branches, prefix)."""
    lines: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for r in (doc or {}).get("rows", []):
        lines[(r["branches"], r["prefix"])].append((r["fold_qkv"], r["speedup"]))
    fig = go.Figure()
    for (b, p), points in sorted(lines.items()):
        points.sort()
        fig.add_trace(go.Scatter(x=[x for x, _ in points], y=[y for _, y in points], mode="lines+markers",
                                 name=f"B={b}, prefix {p}"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    title = f"folded vs dense verify · {(doc or {}).get('device', 'no kernel benchmark yet')}"
    fig.update_layout(**LAYOUT, title=title, xaxis_title="measured fold ratio (QKV)",
                      yaxis_title="speedup (dense ms / folded ms)", height=360, xaxis_range=[-0.02, 1.02])
    return fig


PROVENANCE = (("cpu", "machine"), ("cores", "cores"), ("cpu_flags", "ISA"), ("matmul", "matmuls"),
              ("dtype", "weights"), ("commit", "commit"), ("date", "date"))
"""What a stored benchmark's label names, from its meta (lab/bench.py's provenance and options)."""


def provenance_html(meta: dict[str, Any]) -> str:
    """Where, on what and when a stored benchmark was measured; a field its meta lacks is named as missing."""
    shown = {k: " ".join(v) if isinstance(v, list) else str(v) for k, v in meta.items()}
    known = [f"{label} <b>{html.escape(shown[key])}</b>" for key, label in PROVENANCE if meta.get(key)]
    missing = [label for key, label in PROVENANCE if not meta.get(key)]
    note = f" ({', '.join(missing)} not recorded)" if missing else ""
    return (f'<div id="bench-provenance" class="ss-badge ss-ref">stored figures, measured on: '
            f'{" · ".join(known)}{note}</div>')


def summary_html(bench: dict[str, Any]) -> str:
    parts = []
    modes, kernels = bench.get("modes"), bench.get("kernels")
    if modes:
        meta = modes.get("meta") or {}
        parts.append(provenance_html(meta))
        parts.append(f"Modes: {html.escape(str(meta.get('prompts', '?')))} prompts, "
                     f"max_new_tokens {html.escape(str(meta.get('max_new_tokens', '?')))}, model "
                     f"{html.escape(str(meta.get('model', '?')))}.")
    else:
        parts.append("No mode benchmark stored: run <code>specscope bench</code>.")
    if kernels:
        c = kernels.get("ceilings") or {}
        where = f"{kernels.get('device')} ({kernels.get('backend')})"
        parts.append(f"Kernels on {html.escape(where)}: ceilings {fmt(c.get('matmul_tflops'), 1)} TFLOP/s, "
                     f"{fmt(c.get('copy_gbps'), 0)} GB/s.")
    else:
        parts.append("No kernel benchmark stored: run <code>specscope bench-kernels</code> on a GPU.")
    parts += [f"⚠ {html.escape(p)}" for p in bench.get("problems", [])]
    return "<br>".join(parts)


def here_html(here: dict[str, Any], stored: dict[str, Any] | None) -> str:
    """This server's short benchmark beside the stored figures of the same modes."""
    rows = []
    for name, m in here["modes"].items():
        s = ((stored or {}).get("modes") or {}).get(name) or {}
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{fmt(m['tok_per_s'], 1)}</td>"
                    f"<td>{fmt(s.get('tok_per_s'), 1)}</td><td>{fmt(m['tpf'], 2)}</td><td>{fmt(s.get('tpf'), 2)}</td>"
                    f"<td>{m['tokens']}</td></tr>")
    where = (f"here: {html.escape(str(here['cpu']))} ({here['cores']} cores) · {html.escape(here['matmul'])} matmuls"
             f" · model {html.escape(here['model'])} · {here['prompts']} prompts × {here['max_new_tokens']} "
             f"tokens · {html.escape(here['date'])} UTC")
    return (f'<div class="ssv-note">{where}</div><div class="ss-scroll"><table class="ss-table"><thead><tr>'
            f"<th>mode</th><th>tok/s here</th><th>tok/s stored</th><th>TPF here</th><th>TPF stored</th>"
            f"<th>tokens here</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>")


def build_bench(backend: Backend, tab: gr.Tab) -> None:
    with gr.Row():
        summary = gr.HTML(elem_id="bench-summary")
        refresh = gr.Button("↻ reload", elem_id="bench-refresh", scale=0, min_width=100)
    with gr.Row():
        mode = gr.Dropdown(label="run it here: the exact mode against", choices=[], value=None,
                           elem_id="bench-here-mode", scale=2)   # filled when the tab opens (`modes_here`)
        run_here = gr.Button("run it here", elem_id="bench-here-run", scale=0, min_width=120)
    here = gr.HTML(elem_id="bench-here")
    modes = gr.Dataframe(headers=MODE_COLUMNS, value=[], interactive=False, elem_id="bench-modes",
                         label="decoding modes (specscope bench)")
    speedup = gr.Plot(elem_id="bench-speedup", label="kernels", visible=False)
    kernels = gr.Dataframe(headers=KERNEL_COLUMNS, value=[], interactive=False, elem_id="bench-kernels",
                           label="SpecFold verification (specscope bench-kernels)")

    def load(request: gr.Request) -> list[Any]:
        client = backend.client(request)
        try:
            bench = client.bench()
        except (BackendUnavailable, BackendError) as exc:
            return [warning_html(exc), gr.skip(), gr.skip(), gr.skip()]
        kernels = bench.get("kernels")
        book = backend.modes(client)
        return [summary_html(bench), gr.Dataframe(mode_rows(bench.get("modes"), book), headers=mode_columns(book)),
                gr.Plot(speedup_figure(kernels), visible=True) if kernels else gr.Plot(None, visible=False),
                gr.Dataframe(kernel_rows(kernels), visible=bool(kernels))]

    def modes_here(request: gr.Request) -> Any:
        """The modes the served model can run, beside the exact one (the baseline), labelled with its name; the
        first the modes declare for this picker chosen."""
        client = backend.client(request)
        try:
            book = backend.remember_modes(client, client.modes())
        except (BackendUnavailable, BackendError):
            return gr.skip()
        names = book.rivals()
        return gr.Dropdown(choices=names, value=book.pick("bench", names),
                           label=f"run it here: {book.baseline or 'the exact mode'} against")

    def measure(name: str | None, request: gr.Request) -> str:
        client = backend.client(request)
        try:
            book = backend.modes(client)
            name = name or book.pick("bench", book.rivals())   # clicked before the tab's list arrived
            if not name:
                return warning_html("The served model runs no mode beside the exact one.")
            return here_html(client.bench_here(name), client.bench().get("modes"))
        except (BackendUnavailable, BackendError) as exc:
            return warning_html(exc)

    for trigger in (refresh.click, tab.select):
        trigger(load, None, [summary, modes, speedup, kernels], concurrency_limit=None)
    tab.select(modes_here, None, mode, concurrency_limit=None)
    run_here.click(lambda: "running the exact mode and this one on this server…", None, here,
                   concurrency_limit=None).then(
        measure, mode, here)
