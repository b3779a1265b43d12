"""Cross-run analysis (app/analysis.py): the filter language, grouping, the derived figures and the CSV."""
from __future__ import annotations

import csv
import io

from specscope.app.analysis import (
    accept_hist,
    analysis_figures,
    group_runs,
    params_label,
    parse_query,
    position_acceptance,
    runs_csv,
    select_runs,
    summarize,
)


def run(run_id: str, mode: str, hist: dict[str, int], tokens: int, nfe: int, prompt: str = "What is 2 + 2?",
        model: str = "smollm2-135m", created: str = "2026-12-01T10:00:00+00:00", **params) -> dict:
    return {"run_id": run_id, "mode": mode, "model": model, "status": "done", "prompt": prompt, "created_at": created,
            "params": {"max_new_tokens": 32, **params},
            "metrics": {"accept_hist": hist, "tokens": tokens, "nfe": nfe, "tpf": tokens / nfe, "tok_per_s": 10.0}}


RUNS = [run("r1", "specfold", {"1": 6, "2": 2}, 10, 8, delta=0.0),
        run("r2", "specfold", {"1": 2, "3": 2}, 8, 4, delta=0.5, prompt="The capital of France?"),
        run("r3", "ar", {"1": 10}, 10, 10, model="tiny", created="2026-11-20T09:00:00+00:00")]


def test_filter_language() -> None:
    query = parse_query('delta>=0.5 model=smollm2 "capital of" france')
    assert query.conditions == [("delta", ">=", "0.5"), ("model", "=", "smollm2")]
    assert query.words == ["capital of", "france"]
    assert [r["run_id"] for r in select_runs(RUNS, "delta=0")] == ["r1"]          # numbers compare as numbers
    assert [r["run_id"] for r in select_runs(RUNS, "delta<=0.5 mode=specfold")] == ["r1", "r2"]
    assert [r["run_id"] for r in select_runs(RUNS, "model=smollm2")] == ["r1", "r2"]  # model by prefix
    assert [r["run_id"] for r in select_runs(RUNS, "since=2026-12-01")] == ["r1", "r2"]
    assert [r["run_id"] for r in select_runs(RUNS, '"Capital"')] == ["r2"]         # prompt words, any case
    assert select_runs(RUNS, "delta=0.5 ar") == []                                  # every term must hold
    assert select_runs(RUNS, "") == RUNS


def test_groups_and_what_is_derived_from_the_histograms() -> None:
    groups = group_runs(RUNS, "param:delta")
    assert list(groups) == ["delta=0.0", "delta=0.5", "delta unset"]
    sizes = [run(f"b{n}", "linear_spec", {"1": 1}, 1, 1, block_size=n) for n in (16, 8, 4)]
    assert list(group_runs(sizes, "param:block_size")) == ["block_size=4", "block_size=8", "block_size=16"]
    by_mode = group_runs(RUNS, "mode")
    hist = accept_hist(by_mode["specfold"])
    assert hist == {1: 8, 2: 2, 3: 2}
    assert position_acceptance(hist) == [1.0, 4 / 12, 2 / 12]   # share of rounds keeping position k or more
    summary = {s.group: s for s in summarize(by_mode)}
    assert summary["specfold"].runs == 2 and summary["specfold"].tokens == 18
    assert summary["specfold"].accepted_mean == (8 + 4 + 6) / 12
    assert summary["specfold"].tpf_mean == (10 / 8 + 8 / 4) / 2
    figures = analysis_figures(by_mode, "mode")
    assert len(figures) == 5 and all(f.layout.title.text for f in figures)
    assert [t.name for t in figures[0].data] == ["ar", "specfold"]
    assert list(figures[1].data[1].y) == [1.0, 4 / 12, 2 / 12]


def test_params_label_and_csv() -> None:
    defaults = {"specfold": {"max_new_tokens": 32, "delta": 0.0}}
    assert params_label(RUNS[0], defaults) == ""               # all at the mode's defaults
    assert params_label(RUNS[1], defaults) == "delta=0.5"
    assert params_label(RUNS[2]) == "max_new_tokens=32"         # defaults unknown: every parameter
    rows = list(csv.DictReader(io.StringIO(runs_csv(group_runs(RUNS, "mode")))))
    assert [(r["run_id"], r["group"]) for r in rows] == [("r3", "ar"), ("r1", "specfold"), ("r2", "specfold")]
    assert rows[2]["prompt"] == "The capital of France?" and rows[2]["tpf"] == "2.0"
