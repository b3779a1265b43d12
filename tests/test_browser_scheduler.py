"""The Scheduler tab in Chromium: after two clients' runs of different modes shared forwards, it draws every
forward's rows stacked by request and coloured by mode, and its table links each request to the round that forward
computed."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.browser import NEEDS_BROWSER, new_page, shot
from support.live_server import ui_server
from websockets.sync.client import connect

pytest_plugins = ["support.browser"]  # the browser and errors fixtures
pytestmark = [pytest.mark.browser, *NEEDS_BROWSER]
SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"


@pytest.fixture(scope="module")
def server(loaded, tmp_path_factory) -> Iterator[dict]:
    with ui_server(loaded, tmp_path_factory.mktemp("sched")) as served:
        yield served


def run_at_once(url: str, modes: list[str]) -> list[str]:
    """One client per mode, all started together; their run ids."""
    ids: dict[str, str] = {}
    gate = threading.Barrier(len(modes))

    def client(mode: str) -> None:
        with connect(url) as ws:
            gate.wait()
            ws.send(json.dumps({"type": "generate", "prompt": "Copy: a b c d e f", "mode": mode,
                                "params": {"max_new_tokens": 24}}))
            while True:
                event = json.loads(ws.recv())
                ids.setdefault(mode, event["run_id"])
                if event["type"] == "run_end":
                    return

    threads = [threading.Thread(target=client, args=(m,)) for m in modes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return [ids[m] for m in modes]


def test_the_scheduler_shows_shared_forwards_by_mode_and_links_their_rounds(browser, errors, server) -> None:
    run_ids = run_at_once(server["ws"], ["ar", "isd", "linear_spec"])
    page = new_page(browser, errors)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(server["url"])
    page.wait_for_load_state("load")
    page.get_by_role("tab", name="Scheduler").click()
    page.wait_for_selector("#sched-chart .js-plotly-plot")
    page.wait_for_selector("#sched-forwards")
    names = page.evaluate("() => document.querySelector('#sched-chart .js-plotly-plot').data.map(d => d.name)")
    assert {"ar", "isd", "linear_spec", "KV pool in use"} <= set(names)
    assert "served more than one request" in page.locator("#sched-summary").inner_text()
    links = page.eval_on_selector_all("#sched-forwards a.ss-open", "as => as.map(a => a.getAttribute('href'))")
    assert any(f"?run={run_ids[1]}&round=" in href for href in links)
    shared = page.eval_on_selector_all("#sched-forwards tbody tr",
                                       "rs => rs.filter(r => Number(r.cells[3].innerText) > 1).length")
    assert shared > 0
    page.locator("#sched-chart").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "scheduler.png"))
    shot(page, "scheduler")
    page.close()
    assert errors == []


def test_a_stored_runs_forwards_replay_with_the_runs_that_shared_them(browser, errors, server) -> None:
    """`/?forwards=<id>` opens the Scheduler on that run's forwards, rebuilt from the store with the other runs that
    shared them; an unknown run id gets a clear warning."""
    run_ids = run_at_once(server["ws"], ["ar", "quadratic"])
    page = new_page(browser, errors)
    page.goto(f"{server['url']}?forwards={run_ids[1]}")
    page.wait_for_load_state("load")
    page.wait_for_selector("#sched-replayed >> text=replayed from the store")
    assert f"run {run_ids[1]}" in page.locator("#sched-replayed").inner_text()
    assert "shared with 1 other stored run" in page.locator("#sched-replayed").inner_text()
    page.wait_for_selector("#sched-chart .js-plotly-plot")
    names = page.evaluate("() => document.querySelector('#sched-chart .js-plotly-plot').data.map(d => d.name)")
    assert {"ar", "quadratic", "KV pool in use"} <= set(names)
    links = page.eval_on_selector_all("#sched-forwards a.ss-open", "as => as.map(a => a.getAttribute('href'))")
    assert any(f"?run={run_ids[0]}&round=" in href for href in links)
    page.fill("#sched-run input", "r_nothing_here")
    page.click("#sched-replay")
    page.wait_for_selector("#sched-summary >> text=no run r_nothing_here")
    page.close()
    assert errors == []
