"""The Bench tab in Chromium: every stored benchmark says where, on what and when it was measured, and "run it
here" measures ar and a speculative mode on the served model, shown beside the stored figures."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from support.browser import NEEDS_BROWSER, new_page
from support.live_server import ui_server

pytest_plugins = ["support.browser"]  # the browser and errors fixtures
pytestmark = [pytest.mark.browser, *NEEDS_BROWSER]


@pytest.fixture(scope="module")
def server(loaded, tmp_path_factory) -> Iterator[dict]:
    with ui_server(loaded, tmp_path_factory.mktemp("bench")) as served:
        yield served


@pytest.fixture(scope="module")
def warnings() -> list[str]:
    return []


@pytest.fixture(scope="module")
def page(browser, errors, warnings, server) -> Iterator:
    page = new_page(browser, errors)
    page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
    page.goto(server["url"])
    page.wait_for_load_state("load")
    page.get_by_role("tab", name="Bench").click()
    yield page
    page.close()


def test_the_stored_bench_names_its_machine_precision_commit_and_date(page) -> None:
    from specscope.backend.server.api import BENCH_DIR

    meta = json.loads((BENCH_DIR / "bench.json").read_text())["meta"]
    label = page.wait_for_selector("#bench-provenance").inner_text()
    for key in ("cpu", "matmul", "commit", "date"):
        assert str(meta[key]) in label, key
    assert f"cores {meta['cores']}" in label


def test_run_it_here_measures_on_the_served_model_beside_the_stored_figures(page, server) -> None:
    page.click("#bench-here-run")
    table = page.wait_for_selector("#bench-here table", timeout=120_000)
    rows = [r.split("\t") for r in table.inner_text().splitlines()[1:]]
    assert [r[0] for r in rows] == ["ar", "linear_spec"]
    assert all(float(r[1]) > 0 and float(r[3]) > 0 for r in rows)      # tok/s and TPF measured here
    assert float(rows[1][3]) > float(rows[0][3])                        # linear_spec commits more per forward
    assert f"{server['engine'].rt.matmul} matmuls" in page.locator("#bench-here").inner_text()


def test_no_console_errors_or_warnings(errors, warnings) -> None:
    assert errors == [] and warnings == []
