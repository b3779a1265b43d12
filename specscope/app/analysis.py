"""Analysis across stored runs: a filter over the runs list, groups by mode, model or a parameter, each group's
figures (from the runs' own run_end metrics), and CSV. Pure functions, no I/O.

Definitions (each figure's hover says them):
- accepted per round: a round's `accepted_len`, the tokens it committed (the runs' `accept_hist`, prefill excluded
  by the engine);
- per-position acceptance at k: the share of a group's rounds that committed k tokens or more (position k of the
  round's block was kept);
- TPF: tokens per forward (`metrics.tpf` = tokens / NFE); tok/s: the run's wall-clock rate.
"""
from __future__ import annotations

import csv
import io
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go

from specscope.app.figures import LAYOUT, NO_MODES, mode_color
from specscope.app.modebook import ModeBook

Run = Mapping[str, Any]
GROUP_FIELDS = ("mode", "model", "status", "sweep")  # besides `param:<name>`
TERM = re.compile(r'(\w+)(=|>=|<=)("[^"]*"|\S+)|"([^"]*)"|(\S+)')


@dataclass
class RunQuery:
    """What a run must match: parameter conditions (`name=value`, `name>=x`, `name<=x`; also model=, mode=,
    status=, sweep=, since=YYYY-MM-DD), and words its prompt contains (case-insensitive)."""
    conditions: list[tuple[str, str, str]] = field(default_factory=list)
    words: list[str] = field(default_factory=list)


def parse_query(text: str) -> RunQuery:
    """`delta=0.5 block_size>=8 model=smollm2 "capital of"` -> conditions and prompt words."""
    query = RunQuery()
    for name, op, value, quoted, word in TERM.findall(text or ""):
        if name:
            query.conditions.append((name, op, value.strip('"')))
        elif quoted or word:
            query.words.append((quoted or word).lower())
    return query


def field_value(run: Run, name: str) -> Any:
    if name in ("model", "mode", "status", "sweep"):
        return run.get(name)
    if name == "since":
        return str(run.get("created_at") or "")[:10]
    return (run.get("params") or {}).get(name)


def holds(value: Any, op: str, wanted: str) -> bool:
    """`value op wanted`: numbers compare as numbers, text by equality (model: by prefix), since: as dates."""
    if value is None:
        return False
    try:
        number, target = float(value), float(wanted)
    except (TypeError, ValueError):
        text = str(value).lower()
        return text == wanted.lower() if op == "=" else (text >= wanted if op == ">=" else text <= wanted)
    return number == target if op == "=" else (number >= target if op == ">=" else number <= target)


def matches(run: Run, query: RunQuery) -> bool:
    for name, op, wanted in query.conditions:
        value = field_value(run, name)
        if name == "model" and op == "=":
            if not str(value or "").lower().startswith(wanted.lower()):
                return False
        elif name == "since":
            if str(value) < wanted:
                return False
        elif not holds(value, op, wanted):
            return False
    prompt = str(run.get("prompt") or "").lower()
    return all(word in prompt for word in query.words)


def select_runs(runs: Sequence[Run], text: str) -> list[Run]:
    query = parse_query(text)
    return [r for r in runs if matches(r, query)]


def mode_defaults(specs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """mode -> {param: default}, from /api/modes."""
    return {m["name"]: {p["name"]: p.get("default") for p in m.get("params", [])} for m in specs}


def params_label(run: Run, defaults: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The run's parameters that differ from its mode's defaults (all of them when the defaults are unknown)."""
    known = (defaults or {}).get(str(run.get("mode")), {})
    shown = {k: v for k, v in sorted((run.get("params") or {}).items()) if k not in known or known[k] != v}
    return " ".join(f"{k}={v}" for k, v in shown.items())


def group_of(run: Run, by: str) -> str:
    if by.startswith("param:"):
        value = (run.get("params") or {}).get(by[len("param:"):])
        return f"{by[len('param:'):]}={value}" if value is not None else f"{by[len('param:'):]} unset"
    return str(run.get(by) or "?")


def group_order(name: str) -> tuple[str, float, str]:
    """Groups sort by name, a parameter's numeric values by number (block_size=8 before block_size=16)."""
    key, _, value = name.partition("=")
    try:
        return key, float(value), ""
    except ValueError:
        return key, float("inf"), value


def group_runs(runs: Sequence[Run], by: str) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(group_of(run, by), []).append(run)
    return {name: groups[name] for name in sorted(groups, key=group_order)}


def accept_hist(runs: Sequence[Run]) -> dict[int, int]:
    """Rounds by tokens committed, summed over the runs."""
    total: dict[int, int] = {}
    for run in runs:
        for k, n in ((run.get("metrics") or {}).get("accept_hist") or {}).items():
            total[int(k)] = total.get(int(k), 0) + int(n)
    return dict(sorted(total.items()))


def position_acceptance(hist: Mapping[int, int]) -> list[float]:
    """Share of rounds that committed at least k tokens, k = 1 .. the longest."""
    rounds = sum(hist.values())
    if not rounds:
        return []
    return [sum(n for length, n in hist.items() if length >= k) / rounds for k in range(1, max(hist) + 1)]


def metric(runs: Sequence[Run], name: str) -> list[float]:
    return [float(v) for r in runs if isinstance(v := (r.get("metrics") or {}).get(name), (int, float))]


@dataclass
class GroupSummary:
    group: str
    runs: int
    tokens: int
    tpf_mean: float | None
    tok_s_median: float | None
    accepted_mean: float | None   # tokens committed per round, over all the group's rounds


def summarize(groups: Mapping[str, Sequence[Run]]) -> list[GroupSummary]:
    out = []
    for name, runs in groups.items():
        hist, tpf, rate = accept_hist(runs), metric(runs, "tpf"), metric(runs, "tok_per_s")
        rounds = sum(hist.values())
        out.append(GroupSummary(name, len(runs), int(sum(metric(runs, "tokens"))),
                                statistics.fmean(tpf) if tpf else None,
                                statistics.median(rate) if rate else None,
                                sum(k * n for k, n in hist.items()) / rounds if rounds else None))
    return out


CSV_COLUMNS = ["run_id", "group", "created_at", "mode", "model", "status", "params", "tokens", "nfe", "tpf",
               "tok_per_s", "accept_len_mean", "rounds", "prompt"]


def runs_csv(groups: Mapping[str, Sequence[Run]]) -> str:
    """One row per run: its group, parameters and run_end metrics."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for name, runs in groups.items():
        for r in runs:
            m = r.get("metrics") or {}
            writer.writerow([r.get("run_id"), name, r.get("created_at"), r.get("mode"), r.get("model"), r.get("status"),
                             params_label(r), m.get("tokens"), m.get("nfe"), m.get("tpf"), m.get("tok_per_s"),
                             m.get("accept_len_mean"), m.get("rounds"), r.get("prompt")])
    return buffer.getvalue()


# -- figures ---------------------------------------------------------------------------------------------------------

GROUP_COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"]


def colors(groups: Mapping[str, Any], by: str, book: ModeBook = NO_MODES) -> dict[str, str]:
    """Groups by mode take the modes' colours everywhere else in the UI (as `book` declares them); other groups a
    palette, in order."""
    return {name: mode_color(name, book) if by == "mode" else GROUP_COLORS[i % len(GROUP_COLORS)]
            for i, name in enumerate(groups)}


def figure(title: str, x: str, y: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**LAYOUT, title={"text": title, "font": {"size": 13}}, height=340,
                      legend={"orientation": "h", "y": -0.22, "yanchor": "top", "x": 0},  # below: never on the title
                      xaxis={"title": {"text": x}}, yaxis={"title": {"text": y}})
    return fig


def accept_hist_figure(groups: Mapping[str, Sequence[Run]], by: str, book: ModeBook = NO_MODES) -> go.Figure:
    fig = figure("tokens committed per round", "tokens committed in the round", "share of the group's rounds")
    for name, color in colors(groups, by, book).items():
        hist = accept_hist(groups[name])
        rounds = sum(hist.values()) or 1
        fig.add_bar(x=list(hist), y=[n / rounds for n in hist.values()], name=name, marker_color=color,
                    hovertemplate="%{y:.1%} of the rounds committed %{x} tokens<extra>" + name + "</extra>")
    fig.update_layout(barmode="group", xaxis={"dtick": 1})
    return fig


def position_figure(groups: Mapping[str, Sequence[Run]], by: str, book: ModeBook = NO_MODES) -> go.Figure:
    fig = figure("per-position acceptance", "position k in the round's block", "share of rounds keeping k or more")
    for name, color in colors(groups, by, book).items():
        rates = position_acceptance(accept_hist(groups[name]))
        fig.add_scatter(x=list(range(1, len(rates) + 1)), y=rates, name=name, mode="lines+markers",
                        line={"color": color},
                        hovertemplate="%{y:.1%} of the rounds kept position %{x}<extra>" + name + "</extra>")
    fig.update_layout(yaxis={"range": [0, 1.05]}, xaxis={"dtick": 1})
    return fig


def distribution_figure(groups: Mapping[str, Sequence[Run]], by: str, name: str, title: str,
                        book: ModeBook = NO_MODES) -> go.Figure:
    fig = figure(title, "group", title)
    for group, color in colors(groups, by, book).items():
        fig.add_box(y=metric(groups[group], name), name=group, marker_color=color, boxpoints="all", jitter=0.4,
                    pointpos=0, showlegend=False)
    return fig


def nfe_figure(groups: Mapping[str, Sequence[Run]], by: str, book: ModeBook = NO_MODES) -> go.Figure:
    fig = figure("forwards against tokens", "tokens generated", "NFE (forwards)")
    for group, color in colors(groups, by, book).items():
        runs = [r for r in groups[group] if (r.get("metrics") or {}).get("nfe") is not None]
        fig.add_scatter(x=[r["metrics"].get("tokens") for r in runs], y=[r["metrics"]["nfe"] for r in runs],
                        text=[r.get("run_id") for r in runs], mode="markers", name=group, marker={"color": color},
                        hovertemplate="%{text}: %{x} tokens in %{y} forwards<extra>" + group + "</extra>")
    most = max((float(v) for runs in groups.values() for v in metric(runs, "tokens")), default=0.0)
    fig.add_scatter(x=[0, most], y=[0, most], mode="lines", name="one token per forward (TPF 1)",
                    line={"color": "#94a3b8", "dash": "dot"}, hoverinfo="skip")
    return fig


def analysis_figures(groups: Mapping[str, Sequence[Run]], by: str, book: ModeBook = NO_MODES) -> list[go.Figure]:
    """The five figures, in the tab's order (modes in the colours `book` declares)."""
    return [accept_hist_figure(groups, by, book), position_figure(groups, by, book),
            distribution_figure(groups, by, "tpf", "TPF (tokens per forward)", book),
            distribution_figure(groups, by, "tok_per_s", "tok/s (wall clock)", book), nfe_figure(groups, by, book)]
