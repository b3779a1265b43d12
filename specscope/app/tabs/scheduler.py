"""Scheduler tab: what the engine's forwards served (GET /api/forwards), or, replayed from the store, the forwards
of one stored run and every stored run that shared them (GET /api/runs/{id}/forwards; `/?forwards=<id>` opens it).
Each forward is a bar of its rows, stacked by request, each request in its own colour outlined in its mode's, over
the KV slots in use; the table below names each forward's requests and links every one to the run at the round that
forward computed. The live view follows the engine while runs are active ("follow live", on at first); with engine
replicas (`serve --ray`) it shows the replica picked."""
from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
import plotly.graph_objects as go
from plotly.colors import qualitative

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.figures import NO_MODES, mode_color, plural, warning_html
from specscope.app.modebook import ModeBook
from specscope.app.plot import chart, figure_json
from specscope.app.session import Backend

SHOWN = 300
"""The latest forwards the tab fetches and draws."""
LISTED = 25
FOLLOW_S = 2.0

Record = dict[str, Any]


REQUEST_COLORS = qualitative.Dark24
"""Each request's fill, by the order it first appears (its mode's colour outlines it)."""


def scheduler_figure(records: Sequence[Record], book: ModeBook = NO_MODES) -> go.Figure:
    """One stacked bar per forward (x: its id): a segment per request, its rows, in the request's own colour and
    outlined in its mode's (as `book` declares it), each request in the legend with its mode; the KV slots in use
    as a line on an axis of their own (scaled to the most used)."""
    fig = go.Figure()
    runs: dict[str, tuple[str, list[int], list[int], list[str]]] = {}
    for record in records:
        for group in record["groups"]:
            mode, x, y, text = runs.setdefault(group["run_id"], (group["mode"], [], [], []))
            x.append(record["id"])
            y.append(group["rows"])
            text.append(f"{group['run_id']} · {mode} · round {group['round']} · {group['kind']}")
    for i, (run_id, (mode, x, y, text)) in enumerate(runs.items()):
        fig.add_bar(x=x, y=y, name=f"{mode} · {run_id}", hovertext=text, hoverinfo="text+y",
                    marker={"color": REQUEST_COLORS[i % len(REQUEST_COLORS)],
                            "line": {"color": mode_color(mode, book), "width": 2}}, customdata=[run_id] * len(x))
    pooled = [r for r in records if r.get("pool_used") is not None]   # stored runs may lack it
    used = [int(r["pool_used"]) for r in pooled]
    fig.add_scatter(x=[r["id"] for r in pooled], y=used, name="KV slots in use", yaxis="y2", mode="lines",
                    line={"color": "#0f172a", "width": 1})
    # the legend under the x axis's title, never on it; room on the right for the slots' ticks and title
    fig.update_layout(barmode="stack", height=400, margin={"l": 50, "r": 80, "t": 30, "b": 90},
                      xaxis_title="forward", yaxis_title="query rows",
                      yaxis2={"overlaying": "y", "side": "right", "range": [0, max(used, default=1) * 1.1],
                              "title": "KV slots in use", "tickformat": "d", "showgrid": False},
                      legend={"orientation": "h", "y": -0.25, "yanchor": "top"})
    return fig


def forwards_table_html(records: Sequence[Record], book: ModeBook = NO_MODES) -> str:
    """The latest forwards, newest first: id, ms, rows, and each request it served (linked to that round)."""
    rows = []
    for record in list(records)[::-1][:LISTED]:
        served = ", ".join(
            f'<a class="ss-open" href="?run={html.escape(g["run_id"])}&amp;round={int(g["round"])}" target="_blank">'
            f'<b style="color:{mode_color(g["mode"], book)}">{html.escape(g["mode"])}</b> {html.escape(g["run_id"])} '
            f'round {int(g["round"])}</a> ({plural(int(g["rows"]), html.escape(g["kind"]) + " row")})'
            for g in record["groups"])
        rows.append(f'<tr><td>{int(record["id"])}</td><td>{record["ms"]:.1f}</td><td>{int(record["rows"])}</td>'
                    f'<td>{len(record["groups"])}</td><td>{served}</td></tr>')
    if not rows:
        return '<div class="ss-empty">No forward yet: run something.</div>'
    return ('<div class="ss-scroll"><table class="ss-table" id="sched-forwards"><thead><tr><th>forward</th><th>ms</th>'
            f'<th>rows</th><th>requests</th><th>served</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


@dataclass
class SchedulerTab:
    run: gr.Textbox
    """The stored run whose forwards are replayed (empty: the live view)."""
    opened: Callable[..., list[Any]]
    """Replay the run now in `run` (set from the page's URL), into `shown`; nothing when it is empty."""
    shown: list[Any]


def replay_note(replay: Record) -> str:
    """What a replay shows: the run, how many forwards, the other runs that shared them, and what is missing."""
    others = [r for r in replay["runs"] if r != replay["run_id"]]
    shared = sum(len(r["groups"]) > 1 for r in replay["forwards"])
    note = (f"run {replay['run_id']}, replayed from the store: {len(replay['forwards'])} forwards of its engine, "
            f"{shared} shared with {len(others)} other stored run{'' if len(others) == 1 else 's'}")
    if not replay["complete"]:
        note += " · some forwards or rows belong to runs not stored (still running, or stored elsewhere)"
    return f'<div class="ss-note" id="sched-replayed">{html.escape(note)}</div>'


def build_scheduler(backend: Backend, tab: gr.Tab) -> SchedulerTab:
    with gr.Row():
        refresh = gr.Button("↻ refresh", elem_id="sched-refresh", scale=0, min_width=110)
        follow = gr.Checkbox(label="follow live (every 2 s while runs are active)", value=True,
                             elem_id="sched-follow", scale=0)
        replica = gr.Dropdown(label="engine replica", choices=[0], value=0, elem_id="sched-replica", scale=0,
                              min_width=130, visible=False)
        run = gr.Textbox("", label="replay a stored run's forwards (run id; empty: the live engine)",
                         elem_id="sched-run", scale=2, max_lines=1)
        replay = gr.Button("replay", elem_id="sched-replay", scale=0, min_width=90)
    summary = gr.HTML(elem_id="sched-summary")
    plot = chart("sched-chart")
    table = gr.HTML(elem_id="sched-table")
    timer = gr.Timer(FOLLOW_S, active=False)   # started by opening the tab, while follow is on
    was_active = gr.State(False)   # whether runs were active at the last tick (their last forwards show once more)

    def drawn(note: str, records: Sequence[Record], book: ModeBook) -> list[Any]:
        return [note, figure_json(scheduler_figure(records, book)), forwards_table_html(records, book)]

    def fetch(run_id: str | None, replica: int | None, request: gr.Request) -> list[Any]:
        client, run_id = backend.client(request), (run_id or "").strip()
        try:
            if run_id:
                replayed = client.run_forwards(run_id)
                return drawn(replay_note(replayed), replayed["forwards"], backend.modes(client))
            records = client.forwards(replica=int(replica or 0))[-SHOWN:]
        except (BackendUnavailable, BackendError) as exc:
            return [warning_html(exc), gr.skip(), gr.skip()]
        shared = sum(len(r["groups"]) > 1 for r in records)
        note = (f"the latest {len(records)} forwards; {shared} served more than one request" if records
                else "no forward yet")
        if records and "replica" in records[-1]:
            note += f" (engine replica {records[-1]['replica']})"
        return drawn(f'<div class="ss-note">{html.escape(note)}</div>', records, backend.modes(client))

    def live(run_id: str | None, replica: int | None, was: bool, request: gr.Request) -> list[Any]:
        """A follow tick: the live view while runs are active, and once after they end (a replay is stored: it
        does not change)."""
        if (run_id or "").strip():
            return [gr.skip()] * 4
        try:
            health = backend.client(request).health()
        except (BackendUnavailable, BackendError):
            return [gr.skip()] * 4
        active = bool(health.get("active_runs") or health.get("queued_runs"))
        return [*(fetch("", replica, request) if active or was else [gr.skip()] * 3), active]

    def replicas(replica: int | None, request: gr.Request) -> Any:
        """The replica picker: shown when the server runs engine replicas (`serve --ray`)."""
        try:
            listed = backend.client(request).health().get("replicas") or []
        except (BackendUnavailable, BackendError):
            return gr.skip()
        choices = [int(r["replica"]) for r in listed] or [0]
        return gr.Dropdown(choices=choices, value=replica if replica in choices else choices[0],
                           visible=len(listed) > 1)

    def opened(run_id: str | None, request: gr.Request) -> list[Any]:
        """On page load: the replay `/?forwards=<id>` asked for (the box's value may be None until set)."""
        return fetch(run_id, 0, request) if (run_id or "").strip() else [gr.skip()] * 3

    tab.select(replicas, replica, replica, concurrency_limit=None, show_progress="hidden")
    for trigger in (refresh.click, replay.click, run.submit, tab.select, replica.input):
        trigger(fetch, [run, replica], [summary, plot, table], concurrency_limit=None, show_progress="hidden")
    timer.tick(live, [run, replica, was_active], [summary, plot, table, was_active], concurrency_limit=None,
               show_progress="hidden")
    for started in (follow.change, tab.select):
        started(lambda on: gr.Timer(active=on), follow, timer, queue=False)
    return SchedulerTab(run=run, opened=opened, shown=[summary, plot, table])
