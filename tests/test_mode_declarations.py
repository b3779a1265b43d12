"""A mode declares everything about itself (engine/modes/base.py: its colour, lossless claim, draft length under a
row budget, the pickers that choose it, its own metric columns), and nothing outside engine/modes/ names a mode:
the engine, the server, the UI, the CLI and the lab read the registry. Checked both ways: a walk of the product's
code finds no mode named outside the modes (but for the places listed with their reason), and a test-only mode
(support/probe_mode.py), registered for the test alone, reaches the picker, the bench, the draft tiers, the
Visualizer and Compare without a line of the product changed."""
from __future__ import annotations

import argparse
import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.probe_mode import COLOR, NAME, registered

from specscope.app.figures import (
    acceptance_by_position_figure,
    comparison_figure,
    metrics_rows,
    metrics_table_html,
    mode_color,
    speedup_html,
)
from specscope.app.modebook import ModeBook
from specscope.app.sweep import example, parse_variants
from specscope.app.tabs.bench import mode_columns, mode_rows
from specscope.app.trace import RunTrace, make_piece
from specscope.app.ui import picker_hint
from specscope.app.vizdoc import viz_document
from specscope.backend.engine.modes import REGISTRY, baseline, describe_modes, get_mode, mode_names, picks
from specscope.backend.engine.modes.base import PICKERS
from specscope.backend.tracing import RecordingTracer

ROOT = Path(__file__).resolve().parents[1]
MODES_DIR = ROOT / "specscope" / "backend" / "engine" / "modes"
REAL_MODES = mode_names()
"""The registered modes (the probe is registered only inside its tests)."""
ALLOWED: dict[tuple[str, str], str] = {
    ("specscope/backend/train/tiny.py", "ar"):
        "the causal-LM training objective of the tiny model (OBJECTIVES ar / bd / idlm), not the decoding mode",
    ("specscope/backend/engine/cost_measure.py", "ar"):
        "the cost curve's measuring request, a plain decode step (the cost-curve work owns the file)",
}
"""(file, string) pairs that may name a mode, each with why."""
OWN_MODULES = {"specscope/lab/calibrate.py":
               "calibrates the draft graph on block_diffusion's own trajectories: it records that mode's denoise "
               "steps by subclassing it"}
"""Files outside engine/modes/ that may import a mode's own module (not just the registry or modes.base)."""
PROSE = ("specscope/app/", "specscope/backend/server/")
"""Where even a sentence may not name a mode: what the UI and the server say comes from the modes' declarations."""


def product_files() -> Iterator[Path]:
    for path in sorted((ROOT / "specscope").rglob("*.py")):
        if MODES_DIR not in path.parents:
            yield path


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string statements (docstrings, attribute docstrings): prose for the reader of the code."""
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(stmt.value) for node in ast.walk(tree) if isinstance(node, scopes) for stmt in node.body
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)}


def named(text: str, modes: set[str]) -> set[str]:
    """The modes a text names as words (`linear_spec`, not `linear_spec_x` nor `speedup_vs_ar`)."""
    return modes & set(re.findall(r"[A-Za-z0-9_]+", text))


def mode_valued(text: str, modes: set[str]) -> bool:
    """Whether a string is nothing but mode names (and separators): a value that picks modes, as code does."""
    words = [w for w in re.split(r"[\s,:;|]+", text) if w]
    return bool(words) and all(w in modes for w in words)


def naming(source: str, rel: str, modes: set[str]) -> list[str]:
    """Where a Python file (its `source`, at `rel` in the repository) names a mode: a string that is one (or a list of
    them), any string of the UI and the server that mentions one, a function or class named after one (outside the
    kernels, named after the papers' algorithms), an import of a mode's own module."""
    tree = ast.parse(source)
    prose = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            hits = named(node.value, modes)
            if mode_valued(node.value, modes) or rel.startswith(PROSE) and hits:
                found += [f"{rel}:{node.lineno}: {m} in {node.value[:60]!r}" for m in sorted(hits)
                          if (rel, node.value) not in ALLOWED]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and not rel.startswith("specscope/kernels/"):
            found += [f"{rel}:{node.lineno}: def {node.name}" for m in sorted(modes)
                      if re.search(rf"(^|_){m}(_|$)", node.name.lower())]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specscope.backend.engine.modes.") \
                and node.module != "specscope.backend.engine.modes.base" and rel not in OWN_MODULES:
            found.append(f"{rel}:{node.lineno}: imports {node.module}")
    return found


def test_nothing_outside_the_modes_names_one() -> None:
    modes = set(REAL_MODES)
    found = [hit for path in product_files()
             for hit in naming(path.read_text(), path.relative_to(ROOT).as_posix(), modes)]
    for script in sorted((ROOT / "specscope" / "app" / "static").glob("*.js")):
        text = script.read_text()
        found += [f"{script.name}: {m!r}" for m in sorted(modes) if re.search(rf"""["'`]{m}["'`]""", text)]
    assert found == []


def test_the_walk_finds_a_mode_named_in_code_and_in_the_uis_words() -> None:
    """The check itself: a mode picked by name, a UI string naming one, a function named after one and an import
    of a mode's module are all caught; a docstring, a comment and a key like `speedup_vs_ar` are not, nor (outside
    the UI and the server) a sentence."""
    code = ('"""isd and ar in a docstring."""\nfrom specscope.backend.engine.modes.isd import ISD\n'
            'BASE = "ar"  # isd in a comment\nKEY = "speedup_vs_ar"\nLIST = "ar,isd"\n'
            'def isd_length():\n    return f"run {1} in isd"\n')
    modes = set(REAL_MODES)
    assert sorted(naming(code, "specscope/app/x.py", modes)) == sorted([
        "specscope/app/x.py:2: imports specscope.backend.engine.modes.isd", "specscope/app/x.py:3: ar in 'ar'",
        "specscope/app/x.py:5: ar in 'ar,isd'", "specscope/app/x.py:5: isd in 'ar,isd'",
        "specscope/app/x.py:6: def isd_length", "specscope/app/x.py:7: isd in ' in isd'"])
    assert "specscope/lab/x.py:7: isd in ' in isd'" not in naming(code, "specscope/lab/x.py", modes)
    assert naming('OBJECTIVES = ("ar", "bd")\n', "specscope/backend/train/tiny.py", modes) == []   # allowed


# -- what every mode declares --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", REAL_MODES)
def test_every_mode_declares_what_the_product_reads_of_it(mode: str) -> None:
    cls = REGISTRY[mode]
    assert re.fullmatch(r"#[0-9a-f]{6}", cls.color), "a colour of its own, as #rrggbb"
    assert set(cls.picked) <= set(PICKERS)
    params = {p.name for p in cls.params}
    if cls.draft_param is not None:
        assert cls.draft_param in params and cls.min_draft >= 1
        rows = [get_mode(mode).draft_rows(n) for n in range(cls.min_draft, cls.min_draft + 6)]
        assert rows == sorted(set(rows)) and rows[0] > 0, "more rows for a longer draft"
    assert cls.lossless_vs is None or cls.lossless_vs in REGISTRY
    assert all(c.key and c.label and c.definition for c in cls.columns)


def test_modes_are_told_apart_and_every_picker_has_a_default() -> None:
    colours = [REGISTRY[m].color for m in REAL_MODES]
    assert len(set(colours)) == len(colours)
    assert baseline() in REAL_MODES and REGISTRY[baseline()].exact and not REGISTRY[baseline()].needs_mask
    for picker in PICKERS:
        assert picks(picker), f"no mode declares itself a default of {picker}"
    book = ModeBook.of(describe_modes())
    assert book.baseline == baseline() and book.color(baseline()) == REGISTRY[baseline()].color
    assert book.claims[next(m for m in REAL_MODES if REGISTRY[m].lossless_vs)].reference in REAL_MODES


# -- a mode registered for the test alone ---------------------------------------------------------------------------

@pytest.fixture
def probe(shared_engine) -> Iterator[None]:
    with registered(shared_engine):
        yield


def traced(engine, mode: str, params: dict | None = None) -> RunTrace:
    """A run of `mode` as the store would hand it to the UI: its events, as a trace."""
    tracer = RecordingTracer()
    engine.generate("What is 12 + 30?", mode, {"max_new_tokens": 6, **(params or {})}, tracer)
    return RunTrace.from_events(tracer.events)


def test_the_picker_offers_it(probe, shared_engine, tmp_path) -> None:
    """GET /api/modes (what every picker of the UI is built from) carries it with its declarations, and the UI's
    reading of that list offers it, ticks it in Compare as it asks, and sweeps its parameter."""
    from specscope.backend.server import create_app
    from specscope.backend.store import Store

    with Store(f"sqlite:///{tmp_path / 'runs.db'}") as store, TestClient(create_app(shared_engine, store)) as c:
        listed = c.get("/api/modes").json()
    spec = next(m for m in listed if m["name"] == NAME)
    assert spec["color"] == COLOR and spec["lossless_vs"] == "ar" and not spec["lossy"] and spec["available"]
    assert spec["draft_param"] == "n" and spec["columns"][0]["key"] == "probe_rounds"
    book = ModeBook.of(listed)
    assert NAME in book.names() and NAME in book.rivals() and book.picks("compare")[-1] == NAME
    assert book.baseline == baseline() and NAME not in (picker_hint(listed, []) or "")
    assert (NAME, {"n": 1}) in parse_variants(example(listed, lines=len(listed)), listed)


@pytest.mark.slow   # one bench pass of two modes on the tiny model, with its verify-rows table
def test_the_bench_runs_it(probe, tmp_path) -> None:
    """`specscope bench --modes <baseline>,<it>` in-process: its row, its claim checked against its reference, its
    speedup against the baseline and its own metric, in the table and in the Bench tab's rows."""
    from specscope.lab import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--model", "tiny", "--cost-curve", "flat", "--modes", f"{baseline()},{NAME}",
                         "--per-kind", "1", "--repeats", "1", "--max-new-tokens", "6", "--clock", "cpu", "--no-peer",
                         "--no-tracing", "--out", str(tmp_path)])
    rows = bench.run(args)
    row = rows[NAME]
    assert row["reference"] == "ar" and row["same_as_reference"] == 1.0 and row["lossless"]["identical"] > 0
    assert row["speedup_vs_ar"] > 0 and row["mode_metrics"]["probe_rounds"] > 0
    assert f"| {NAME} |" in (tmp_path / "bench.md").read_text()
    book = ModeBook.of(describe_modes())
    doc = json.loads((tmp_path / "bench.json").read_text())
    shown = {r[0]: r for r in mode_rows(doc, book)}
    assert "probe rounds" in mode_columns(book) and shown[NAME][mode_columns(book).index("probe rounds")] != "—"


def test_a_draft_tier_fits_its_length(probe, shared_engine) -> None:
    """Its draft length under a budget comes from the rows it declares (3n - 1): the longest that fits, none where
    not even n = 1 does; with two requests running under a tier of 2 extra rows, each round records n = 1."""
    mode = get_mode(NAME)
    assert [mode.draft_length(3, rows) for rows in (None, 1, 2, 5, 8, 100)] == [3, None, 1, 2, 3, 3]
    shared_engine.scheduler.draft_tiers = [(1, None), (64, 2)]
    try:
        tracers = [RecordingTracer(), RecordingTracer()]
        shared_engine.run([shared_engine.new_request("What is 12 + 30?", NAME, {"max_new_tokens": 5}, t)
                           for t in tracers])
    finally:
        shared_engine.scheduler.draft_tiers = []
    rounds = [e for t in tracers for e in t.events if e["type"] == "round" and e["round"] > 0]
    together = [e for e in rounds if e["extra"]["tier"]["running"] == 2]
    assert together and all(e["extra"]["probe_length"] == 1 for e in together)
    assert all(e["extra"]["tier"]["own_rows"] == mode.draft_rows(3) for e in together)


def test_the_visualizer_and_compare_draw_it(probe, shared_engine) -> None:
    """A run of it draws in the Visualizer (what a round means there, its colour) and in Compare beside the
    baseline: its line and bars in its colour, its own metric column, its lossless claim checked, its speedup."""
    book = ModeBook.of(describe_modes())
    run, base = traced(shared_engine, NAME), traced(shared_engine, baseline())
    piece = make_piece(None)
    doc = viz_document(run, piece, book=book)
    assert doc["mode"] == NAME and doc["color"] == COLOR and doc["explain"] == REGISTRY[NAME].explain
    assert {"accepted", "kv", "timeline"} <= set(doc["figures"]) and len(doc["rounds"]) == len(run.rounds)
    figure = comparison_figure([base, run], book)
    assert [t.line.color for t in figure.data] == [book.color(baseline()), COLOR] == \
        [mode_color(baseline(), book), mode_color(NAME, book)]
    acceptance_by_position_figure([base, run], book)      # neither drafted: drawn empty, not refused
    head, *rows = metrics_rows([base, run], book)
    assert "probe rounds" in head and rows[1][head.index("probe rounds")] == run.metrics["probe_rounds"] > 0
    table = metrics_table_html([base, run], base, book)
    assert f"color:{COLOR}" in table and "== ar" in table and "rounds the test-only probe mode ran" in table
    assert f"color:{COLOR}" in speedup_html([base, run], book)


def test_it_is_gone_after_its_test(shared_engine) -> None:
    assert NAME not in mode_names() and NAME not in shared_engine.scheduler.policies
    with registered(shared_engine):
        assert NAME in mode_names() and NAME in {m["name"] for m in describe_modes()}
    assert mode_names() == REAL_MODES
