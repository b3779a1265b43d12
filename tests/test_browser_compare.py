"""Compare and Runs in Chromium: a comparison run one after another shows each run's row as it ends, draws
acceptance by draft position and explains why two runs diverged; a saved comparison whose runs were measured under
other load says which and by how much; the Runs table fits 1400 px and a 390 px phone without a word broken."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest
from support.browser import NEEDS_BROWSER, choose, doc_shot, new_page, set_number
from support.live_server import free_port, serving

pytest_plugins = ["support.browser"]  # the browser and errors fixtures
pytestmark = [pytest.mark.browser, *NEEDS_BROWSER]
PROMPT = "Kindly show 11 x 1 through 11 x 4."   # block_diffusion's answer parts from ar's on the tiny model
SLOWER = 4.0
BROKEN_WORDS = """sel => [...document.querySelectorAll(sel)].flatMap(el => {
  const out = [];
  const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode())
    for (const m of node.textContent.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
      if (lines.size > 1) out.push(m[0]);
    }
  return out;
})"""
"""The words under the elements that `sel` picks that the browser laid out over more than one line."""


def store_run(store, run_id: str, events: list[dict], ms_times: float = 1.0) -> None:
    """Store a run's events under `run_id`, each forward's ms multiplied by `ms_times`."""
    events = [dict(e, run_id=run_id) for e in events]
    for e in events:
        if e["type"] == "round":
            e["phases"] = [{**p, "ms": p["ms"] * ms_times} for p in e.get("phases") or []]
    end = events[-1]
    run = {"run_id": run_id, "created_at": datetime.now(UTC).isoformat(), "mode": events[0]["mode"],
           "model": events[0].get("model"), "params": events[0]["params"], "prompt": events[0]["prompt"],
           "status": "done", "output": end["text"], "metrics": end["metrics"], "n_rounds": 0,
           "n_tokens": len(end["output_ids"])}
    store.insert_run(run, events)


@pytest.fixture(scope="module")
def server(loaded, tmp_path_factory) -> Iterator[dict]:
    """The UI over an engine of the tiny model, its store holding an ar run, a linear_spec run and a copy of that
    run whose forwards took SLOWER times as long (as under another client's load)."""
    from specscope.app.ui import mount_ui
    from specscope.backend.engine.cost_curve import FLAT
    from specscope.backend.engine.engine import Engine
    from specscope.backend.server import create_app
    from specscope.backend.store import Store
    from specscope.backend.tracing import RecordingTracer

    engine = Engine(loaded, num_slots=4096, cost_curve=FLAT)   # what linear_spec drafts: the same on every machine
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('compare') / 'runs.db'}")
    made = {}
    for mode in ("ar", "linear_spec"):
        tracer = RecordingTracer()
        engine.generate(PROMPT, mode, {"max_new_tokens": 12, "tiers": False}, tracer=tracer)
        made[mode] = tracer.events
    store_run(store, "r_calm0000000000ar", made["ar"])
    store_run(store, "r_calm000000000lin", made["linear_spec"])
    store_run(store, "r_busy000000000lin", made["linear_spec"], SLOWER)
    port = free_port()
    app = create_app(engine, store, backend_url=f"ws://127.0.0.1:{port}", ui=mount_ui)
    with serving(app, port):
        yield {"url": f"http://127.0.0.1:{port}/", "store": store}


def open_tab(browser, errors, server, tab: str, width: int = 1400, height: int = 900):
    page = new_page(browser, errors)
    page.set_viewport_size({"width": width, "height": height})
    page.goto(server["url"])
    page.wait_for_selector("#ss-up")
    page.get_by_role("tab", name=tab).click()
    return page


def test_rows_appear_as_each_run_ends_and_the_view_says_why_two_runs_diverged(browser, errors, server) -> None:
    page = open_tab(browser, errors, server, "Compare")
    page.wait_for_function("() => document.querySelectorAll('#cmp-modes input[type=checkbox]').length > 0")
    page.fill("#cmp-prompt textarea", PROMPT)
    set_number(page, "#cmp-max-new", 24)
    page.evaluate("""() => { window.__rows = []; new MutationObserver(() => {
        const rows = document.querySelectorAll('#cmp-table .ss-scroll:not(#cmp-speedup) tbody tr').length;
        window.__rows.push([rows, document.querySelector('#cmp-status').innerText]);
      }).observe(document.querySelector('#cmp-table'), {childList: true, subtree: true}); }""")
    page.click("#cmp-run")
    page.wait_for_function("() => document.querySelectorAll('#cmp-table .ss-scroll:not(#cmp-speedup) tbody tr')"
                           ".length === 3 && "
                           "!/running|queued/.test(document.querySelector('#cmp-status').innerText)",
                           timeout=120_000)
    seen = page.evaluate("() => window.__rows")
    # a row showed while the last run had not started: the comparison waits for nothing but the run it shows
    assert any(1 <= rows < 3 and "linear_spec queued" in status for rows, status in seen), seen
    page.wait_for_function("() => (document.querySelector('#cmp-positions .js-plotly-plot')?.data || []).length > 0",
                           timeout=30_000)    # the chart draws after the table it comes with
    bars = page.evaluate("() => document.querySelector('#cmp-positions .js-plotly-plot').data"
                         ".map(d => ({name: d.name, y: d.y}))")
    assert any(b["name"].startswith("linear_spec") and all(0 <= y <= 1 for y in b["y"]) for b in bars), bars
    assert not any(b["name"].startswith("ar ") for b in bars), bars   # ar drafts nothing
    page.wait_for_selector("#cmp-diverge-pair input")
    assert "ar vs block_diffusion" in page.input_value("#cmp-diverge-pair input")
    page.click("#cmp-diverge")
    report = page.wait_for_selector("#div-report", timeout=120_000).inner_text()
    assert "first part at output token" in report and "cause" in report, report
    assert page.locator("#div-a .ss-div-top tbody tr").count() >= 2 and page.locator("#div-b .ss-div-top").count()
    assert "margin" in page.locator("#div-a").inner_text()
    page.locator("#cmp-diverge-report").scroll_into_view_if_needed()
    doc_shot(page, "divergence")
    page.close()
    assert errors == []


def test_a_comparison_of_runs_under_other_load_says_which_and_by_how_much(browser, errors, server) -> None:
    made = httpx.post(server["url"] + "api/comparisons", json={
        "label": "load", "prompt": PROMPT,
        "run_ids": ["r_calm000000000lin", "r_calm0000000000ar", "r_busy000000000lin"]}).json()
    page = open_tab(browser, errors, server, "Compare")
    page.click("#cmp-refresh")
    choose(page, "#cmp-saved", "load · 3 runs")
    page.click("#cmp-open")
    warning = page.wait_for_selector("#cmp-load").inner_text()
    # the reference is the first run's mode's: the calm linear_spec run, whose very forwards the busy one took 4x as
    # long for
    assert "measured under different load" in warning and "differs from linear_spec r_calm000000000lin" in warning
    assert "r_busy000000000lin: " in warning and f"{SLOWER:.1f}× slower" in warning, warning
    assert made["comparison_id"]
    page.locator("#cmp-load").scroll_into_view_if_needed()
    doc_shot(page, "compare-load-warning")
    page.close()
    assert errors == []


@pytest.mark.parametrize("width", [1400, 390])
def test_the_runs_table_breaks_no_word(browser, errors, server, width: int) -> None:
    page = open_tab(browser, errors, server, "Runs")   # a phone's tabs fold into a menu: resized once it is open
    page.set_viewport_size({"width": width, "height": 900 if width > 400 else 844})
    page.wait_for_function("() => /r_calm/.test(document.querySelector('#runs-table')?.innerText ?? '')")
    headers = page.eval_on_selector_all("#runs-table thead th", "ths => ths.map(th => th.innerText.trim())")
    assert "params" in headers and "alarm" in headers, headers
    assert page.evaluate(BROKEN_WORDS, "#runs-table thead th") == []   # no "statu/s", "tok/ens"
    assert page.evaluate(BROKEN_WORDS, "#runs-table tbody td") == []   # params not a letter a line
    if width >= 1400:   # it fits: no sideways scroll
        assert page.evaluate("() => { const t = document.querySelector('#runs-table'); "
                             "return document.documentElement.scrollWidth <= window.innerWidth; }")
    page.close()
    assert errors == []
