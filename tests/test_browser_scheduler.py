"""The Scheduler tab in Chromium: after two clients' runs of different modes shared forwards, it draws every
forward's rows stacked by request, each request in its own colour and outlined in its mode's, with the KV slots in
use on an axis of their own, follows the engine live from the start, and its table links each request to the round
that forward computed."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from support.browser import NEEDS_BROWSER, doc_shot, new_page, shot
from support.live_server import ui_server
from websockets.sync.client import connect

pytest_plugins = ["support.browser"]  # the browser and errors fixtures
pytestmark = [pytest.mark.browser, *NEEDS_BROWSER]


@pytest.fixture(scope="module")
def server(loaded, tmp_path_factory) -> Iterator[dict]:
    with ui_server(loaded, tmp_path_factory.mktemp("sched")) as served:
        yield served


def run_at_once(url: str, modes: list[str]) -> list[str]:
    """One client per mode (a mode may come twice), all started together; their run ids."""
    ids: dict[int, str] = {}
    gate = threading.Barrier(len(modes))

    def client(i: int, mode: str) -> None:
        with connect(url) as ws:
            gate.wait()
            ws.send(json.dumps({"type": "generate", "prompt": "Copy: a b c d e f", "mode": mode,
                                "params": {"max_new_tokens": 24}}))
            while True:
                event = json.loads(ws.recv())
                ids.setdefault(i, event["run_id"])
                if event["type"] == "run_end":
                    return

    threads = [threading.Thread(target=client, args=pair) for pair in enumerate(modes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return [ids[i] for i in range(len(modes))]


def test_the_scheduler_shows_shared_forwards_by_request_and_links_their_rounds(browser, errors, server) -> None:
    run_ids = run_at_once(server["ws"], ["ar", "isd", "linear_spec", "isd"])
    page = new_page(browser, errors)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(server["url"])
    page.wait_for_load_state("load")
    page.get_by_role("tab", name="Scheduler").click()
    page.wait_for_selector("#sched-chart .js-plotly-plot")
    page.wait_for_selector("#sched-forwards")
    assert page.is_checked("#sched-follow input")
    plot = page.evaluate("() => { const p = document.querySelector('#sched-chart .js-plotly-plot'); return {data: "
                         "p.data.map(d => ({name: d.name, fill: d.marker && d.marker.color, type: d.type, y: d.y})), "
                         "axis: p.layout.yaxis2}; }")
    bars = {d["name"]: d["fill"] for d in plot["data"] if d["type"] == "bar"}
    assert {f"{mode} · {run_id}" for mode, run_id in zip(["ar", "isd", "linear_spec", "isd"], run_ids,
                                                          strict=True)} <= set(bars)
    assert len(set(bars.values())) == len(bars)   # each request its own colour, the two isd runs too
    kv = next(d for d in plot["data"] if d["name"] == "KV slots in use")
    assert plot["axis"]["title"]["text"] == "KV slots in use" and max(kv["y"]) <= plot["axis"]["range"][1] < 4096
    assert "served more than one request" in page.locator("#sched-summary").inner_text()
    links = page.eval_on_selector_all("#sched-forwards a.ss-open", "as => as.map(a => a.getAttribute('href'))")
    assert any(f"?run={run_ids[1]}&round=" in href for href in links)
    shared = page.eval_on_selector_all("#sched-forwards tbody tr",
                                       "rs => rs.filter(r => Number(r.cells[3].innerText) > 1).length")
    assert shared > 0
    page.locator("#sched-chart").scroll_into_view_if_needed()
    doc_shot(page, "scheduler")
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
    assert {f"ar · {run_ids[0]}", f"quadratic · {run_ids[1]}", "KV slots in use"} <= set(names)
    links = page.eval_on_selector_all("#sched-forwards a.ss-open", "as => as.map(a => a.getAttribute('href'))")
    assert any(f"?run={run_ids[0]}&round=" in href for href in links)
    page.fill("#sched-run input", "r_nothing_here")
    page.click("#sched-replay")
    page.wait_for_selector("#sched-summary >> text=no run r_nothing_here")
    page.close()
    assert errors == []
