"""The visualizer in a real browser (Playwright + the system Chromium) on stored runs of every mode: step latency,
everything recorded visible, navigation (chart clicks, token history, step map, URL per round), a run followed
live while it records, and the phone layout."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from support.browser import ARTIFACTS, CODE_PROMPT, NEEDS_BROWSER, PROMPT, TIMEOUT_MS, new_page, painted, shot
from support.live_server import free_port, serving

pytest_plugins = ["support.browser"]  # the browser and errors fixtures
pytestmark = [pytest.mark.browser, *NEEDS_BROWSER]

SMALL = {"block_size": 16, "branches": 3}  # short blocks, few branches: quick to record, still with cache hits
MODES = {"ar": {}, "block_diffusion": {"block_size": 16}, "linear_spec": {}, "isd": {"temperature": 0.7, "seed": 1},
         "spiffy": SMALL, "specfold": SMALL}
LABEL = "document.querySelector('#viz-label').innerText"
# leaving a page (each test opens a URL) aborts Gradio's open queue requests: not errors of the page itself
NAVIGATION_NOISE = ("AbortError", "Connection errored out")


@pytest.fixture(scope="module")
def server(loaded, tmp_path_factory) -> Iterator[dict]:
    from specscope.app.ui import mount_ui
    from specscope.backend.engine.cost_curve import FLAT
    from specscope.backend.engine.engine import Engine
    from specscope.backend.engine.modes import get_mode
    from specscope.backend.server import create_app
    from specscope.backend.store import Store
    from specscope.backend.tracing import RecordingTracer

    engine = Engine(loaded, num_slots=4096, cost_curve=FLAT)   # the rounds drawn: the same on every machine
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('viz') / 'runs.db'}")
    runs = {}
    for mode, params in MODES.items():    # each at its drafter's parameters: every round drafts, to be drawn
        tracer = RecordingTracer(sink=store.record)
        engine.generate(CODE_PROMPT, mode, {"max_new_tokens": 12, "raw": True, **get_mode(mode).drafter_params,
                                            **params}, tracer=tracer)
        runs[mode] = tracer.run_id
    fixed = get_mode("linear_spec").drafter_params
    tracer = RecordingTracer(sink=store.record)   # with each position's top-3 alternatives
    engine.generate(CODE_PROMPT, "linear_spec", {"max_new_tokens": 12, "raw": True, "trace_topk": 3, **fixed},
                    tracer=tracer)
    runs["topk"] = tracer.run_id
    tracer = RecordingTracer(sink=store.record)   # a tree of three branches a round
    engine.generate(CODE_PROMPT, "linear_spec", {"max_new_tokens": 12, "raw": True, "branches": 3, "block_size": 6,
                                                 **fixed}, tracer=tracer)
    runs["tree"] = tracer.run_id
    tracer = RecordingTracer(sink=store.record)   # its last round accepts more than max_new_tokens leaves room for
    engine.generate(PROMPT, "linear_spec", {"max_new_tokens": 5, **fixed}, tracer=tracer)
    runs["cut"] = tracer.run_id
    together = [RecordingTracer(sink=store.record) for _ in range(2)]   # two runs that share their forwards,
    engine.scheduler.draft_tiers = [(1, None), (64, 0)]                  # under a tier of no drafts from 2 running
    engine.run([engine.new_request(PROMPT, mode, {"max_new_tokens": 6}, t)
                for mode, t in zip(("ar", "isd"), together, strict=True)])
    engine.scheduler.draft_tiers = []
    runs["shared"], runs["sharer"] = together[0].run_id, together[1].run_id
    port = free_port()
    app = create_app(engine, store, backend_url=f"ws://127.0.0.1:{port}", ui=mount_ui)
    with serving(app, port):
        yield {"url": f"http://127.0.0.1:{port}/", "runs": runs, "store": store, "engine": engine}


@pytest.fixture(scope="module")
def page(browser, errors) -> Iterator:
    page = new_page(browser, errors)
    yield page
    page.close()


def open_run(page, server, mode: str, round_: int | None = None, by_url: bool = False) -> None:
    """Open a stored run by URL (`/?run=…&round=…`), or within the page (the run box, then the slider)."""
    run_id = server["runs"].get(mode, mode)
    if by_url or not page.url.startswith(server["url"]):
        query = f"?run={run_id}" + (f"&round={round_}" if round_ is not None else "")
        page.goto(server["url"] + query)
    else:
        box = page.locator("#viz-run input")
        box.fill(run_id)
        box.press("Enter")
    page.wait_for_function("id => document.querySelector('#viz-summary')?.innerText.includes(id)", arg=run_id)
    page.wait_for_selector("#viz-grid .ss-round-head")
    if round_ is not None and not by_url:
        page.eval_on_selector("#viz-slider", "(e, k) => { e.value = k; e.dispatchEvent(new Event('input')); }",
                              round_)
        page.wait_for_function(f"k => {LABEL}.startsWith(`round ${{k}} of`)", arg=round_)


def label(page) -> str:
    return page.evaluate(LABEL)


def step_ms(page) -> float:
    """Click next, wait for the next frame: milliseconds from the click to the new round painted."""
    return page.evaluate("""async () => {
        const before = document.querySelector('#viz-label').innerText;
        const t0 = performance.now();
        document.querySelector('#viz-next').click();
        await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
        if (document.querySelector('#viz-label').innerText === before) throw new Error('the round did not change');
        return performance.now() - t0;
    }""")


@pytest.mark.extended
def test_step_latency_per_mode(page, server) -> None:
    """Every mode steps in the browser alone (no server round trip); the figure is printed for the README."""
    figures = {}
    for mode in MODES:
        open_run(page, server, mode)
        page.wait_for_selector("#viz-accepted .main-svg")
        times = [step_ms(page) for _ in range(min(5, int(page.eval_on_selector("#viz-slider", "e => e.max"))))]
        figures[mode] = sorted(times)[len(times) // 2]
    print("\nvisualizer step latency, median ms (click -> next frame): "
          + ", ".join(f"{m} {v:.1f}" for m, v in figures.items()))
    assert set(figures) == set(MODES)


def test_url_opens_the_round_and_follows_steps(page, server) -> None:
    open_run(page, server, "ar", 3, by_url=True)
    assert label(page).startswith("round 3 of")
    page.click("#viz-next")
    assert "round=4" in page.url and f"run={server['runs']['ar']}" in page.url
    open_run(page, server, "ar", 99999, by_url=True)  # past the end: the last round, no error
    last = page.eval_on_selector("#viz-slider", "e => e.max")
    assert label(page).startswith(f"round {last} of")


def test_a_shared_round_links_to_the_forwards_it_shared(page, server) -> None:
    """A round whose forward served other runs says the tier in force and links to the Scheduler's replay of the
    run's forwards, which names the run that shared them."""
    open_run(page, server, "shared", 2)
    assert "tier at 2 running: no drafting" in page.locator("#viz-grid .ss-round-head").inner_text()
    link = page.locator("#viz-grid .ssv-forwards")
    assert link.count() == 1 and link.get_attribute("href") == f"?forwards={server['runs']['shared']}"
    page.goto(server["url"] + link.get_attribute("href"))
    page.wait_for_selector("#sched-replayed >> text=shared with 1 other stored run")
    page.wait_for_selector(f"#sched-forwards >> text={server['runs']['sharer']}")
    open_run(page, server, "ar", 2, by_url=True)   # a run that ran alone: no such link
    assert page.locator("#viz-grid .ssv-forwards").count() == 0
    assert page.locator("#viz-summary .ss-tier-note").count() == 0
    open_run(page, server, "sharer", 1, by_url=True)   # isd under the tier: its header says what the tier cut
    note = page.locator("#viz-summary .ss-tier-note").inner_text()
    assert "load tier reduced drafting in" in note and "drafting off with 2 runs active" in note, note


def test_chart_click_jumps_and_token_history(page, server) -> None:
    open_run(page, server, "linear_spec")
    page.wait_for_selector("#viz-accepted .main-svg")
    page.evaluate("() => { const gd = document.querySelector('#viz-accepted');"
                  " gd.emit('plotly_click', {points: [{x: 2, customdata: [0, 0]}]}); }")
    assert label(page).startswith("round 2 of")
    page.locator("#viz-grid .ss-block .ss-tok").nth(1).click()
    page.wait_for_selector("#viz-history table")
    history = page.locator("#viz-history").inner_text()
    assert "history of position" in history and "accepted" in history
    page.locator("#viz-history tr[data-jump]").first.click()  # a row jumps to its round
    assert label(page).startswith("round ")
    step = page.locator("#viz-output .ssv-step").last  # the step map: a token jumps to the round revealing it
    revealed = step.get_attribute("data-jump-round")
    step.click()
    assert label(page).startswith(f"round {revealed} of")


def test_timelines_show_phases_and_kv_on_the_wall_clock_and_jump(page, server) -> None:
    """Every round's phases on a wall-clock axis, and KV slots held over time by how they ended."""
    open_run(page, server, "linear_spec")
    page.wait_for_selector("#viz-timeline .main-svg")
    page.wait_for_selector("#viz-kv-time .main-svg")
    lanes = page.evaluate("() => document.querySelector('#viz-timeline').data.map(t => t.name)")
    assert {"prefill", "draft", "verify"} <= set(lanes)
    title = page.evaluate("() => document.querySelector('#viz-timeline').layout.xaxis.title.text")
    assert title == "ms since the run began"
    held = page.evaluate("() => document.querySelector('#viz-kv-time').data.map(t => t.name)")
    assert "finished" in held
    page.evaluate("() => document.querySelector('#viz-timeline').emit('plotly_click', "
                  "{points: [{customdata: [3, 'block', 8, 'on', 1.0]}]})")
    assert label(page).startswith("round 3 of")
    page.evaluate("() => document.querySelector('#viz-kv-time').emit('plotly_click', {points: [{customdata: 1}]})")
    assert label(page).startswith("round 1 of")
    page.locator("#viz-timeline").screenshot(path=str(ARTIFACTS / "timeline.png"))


def chart_overflow(page) -> dict[str, float]:
    """Per visible run chart: how far its plot is wider than its box (px)."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.ssv-chart')]
        .filter(gd => !gd.hidden && gd.querySelector('.main-svg'))
        .map(gd => [gd.id, gd.querySelector('.main-svg').getBoundingClientRect().width - gd.clientWidth]))""")


def test_charts_fit_their_boxes_after_another_run_opens(page, server) -> None:
    """A run whose charts share their row differently (isd adds its case chart) is drawn at its own
    boxes' widths, not the previous run's; every chart's legend sits under its plot, clear of the title."""
    open_run(page, server, "linear_spec", 1)
    page.wait_for_selector("#viz-accepted .main-svg")
    open_run(page, server, "isd", 1)
    page.wait_for_selector("#viz-cases .main-svg")
    page.wait_for_function("""() => [...document.querySelectorAll('.ssv-chart')].every(gd => gd.hidden ||
        !gd.querySelector('.main-svg') || gd.querySelector('.main-svg').getBoundingClientRect().width
        <= gd.clientWidth + 1)""")
    assert all(over <= 1 for over in chart_overflow(page).values()), chart_overflow(page)
    legend = page.evaluate("() => document.querySelector('#viz-accepted').layout.legend")
    assert legend["y"] < 0


def test_token_history_shows_the_recorded_top_k(page, server) -> None:
    """A run with trace_topk = 3 shows, per round, each forward's three alternatives with entropy and
    margin; a run without says how to record them."""
    open_run(page, server, "topk", 1)
    page.locator("#viz-grid .ss-block .ss-tok").nth(1).click()
    page.wait_for_selector("#viz-history table")
    history = page.locator("#viz-history").inner_text()
    assert "draft:" in history and "verify:" in history and "entropy" in history and "margin" in history
    assert "not recorded" not in history
    page.locator("#viz-history").screenshot(path=str(ARTIFACTS / "topk.png"))
    page.select_option("#viz-colour", "entropy")   # cells and confidence bars coloured by their entropy
    page.wait_for_selector("#viz-grid .ssv-entropy-key")
    tinted = page.eval_on_selector_all("#viz-grid .ss-block .ss-tok", "cells => cells.map(c => c.style.background)")
    assert sum(t.startswith("hsl") or t.startswith("rgb") for t in tinted) >= 2 and len(set(tinted)) >= 2
    assert "entropy" in page.locator("#viz-grid .ss-block .ss-tok").nth(1).get_attribute("title")
    page.select_option("#viz-colour", "state")
    page.wait_for_function("() => !document.querySelector('#viz-grid .ssv-entropy-key')")
    open_run(page, server, "linear_spec", 1)
    page.locator("#viz-grid .ss-block .ss-tok").nth(1).click()
    page.wait_for_selector("#viz-history >> text=trace_topk")


def test_linear_spec_shows_its_replaced_draft_and_vllm_metrics(page, server) -> None:
    open_run(page, server, "linear_spec", 1)
    head = page.locator("#viz-grid .ss-round-head").inner_text()
    assert "rejected draft" in head and "correction" in head
    vllm = page.locator("#viz-vllm").inner_text()
    assert "mean acc. length (vLLM)" in vllm and "draft acc. rate (vLLM)" in vllm and "drafts accepted" in vllm
    hover = page.locator("#viz-vllm .ssv-metric", has_text="mean acc. length").get_attribute("title")
    assert "mean_acceptance_length" in hover and "bonus" in hover        # one definition, shown
    assert "accepted_len" in page.locator("#viz-summary .ssv-metric", has_text="tokens / round").get_attribute("title")
    page.wait_for_selector("#viz-positions .main-svg")
    assert "accepted" in page.locator("#viz-summary .ssv-explain").inner_text().lower()
    explained = page.locator("#viz-speedup").inner_text()    # TPF × row cost × forward share, on this machine
    assert "speedup explained" in explained and "TPF" in explained and "row cost" in explained


def counts(page) -> tuple[int, int]:
    """The shown round's header counts: (accepted, committed)."""
    return (int(page.locator('#viz-grid [data-count="accepted"] b').inner_text()),
            int(page.locator('#viz-grid [data-count="committed"] b').inner_text()))


def test_a_round_cut_by_max_new_tokens_draws_its_cut_cells(page, server) -> None:
    """The last round of a run that max_new_tokens cut short: what the mode accepted past the limit is drawn cut
    (and the legend says what that is), so its accepted and bonus cells are exactly the tokens the header says it
    committed."""
    open_run(page, server, "cut", 1)
    block = page.locator("#viz-grid .ss-block")
    assert block.locator(".ss-s-cut").count() > 0
    accepted, committed = counts(page)
    assert block.locator(".ss-s-accepted").count() == accepted
    assert block.locator(".ss-s-accepted, .ss-s-bonus").count() == committed
    assert committed == len(page.evaluate("() => document.querySelector('.ssv').ssViz.doc.rounds[1].committed"))
    assert "pos" in block.locator(".ss-s-cut").first.get_attribute("title")
    legend = page.locator("#viz-legend")
    legend.locator("button, .label-wrap").first.click()
    assert "max_new_tokens" in legend.locator(".ss-legend-item", has=page.locator(".ss-s-cut")).inner_text()
    page.locator("#viz-grid").screenshot(path=str(ARTIFACTS / "viz-cut.png"))


def test_rounds_show_accepted_and_committed_apart(page, server) -> None:
    """committed = accepted + the correction: a linear_spec round that rejected a draft shows one more committed
    than accepted, in its header (each count with its definition) and in the chart's two series."""
    open_run(page, server, "linear_spec", 0)
    shown = []
    for k in range(int(page.eval_on_selector("#viz-slider", "e => e.max")) + 1):
        page.evaluate("k => document.querySelector('.ssv').ssViz.go(k)", k)
        page.wait_for_function(f"k => {LABEL}.startsWith(`round ${{k}} of`)", arg=k)
        shown.append(counts(page))
        if page.locator("#viz-grid .ss-s-rejected").count():
            assert shown[-1][1] == shown[-1][0] + 1, shown[-1]
    assert any(a != c for a, c in shown), shown
    assert "correction" in page.locator('#viz-grid [data-count="committed"]').get_attribute("title")
    page.wait_for_selector("#viz-accepted .main-svg")
    series = page.evaluate("() => document.querySelector('#viz-accepted').data.map(t => [...t.y])")
    assert series[0] == [a for a, _ in shown] and series[1] == [c for _, c in shown]


def test_isd_shows_pq_acceptance_probability_and_why_none(page, server) -> None:
    open_run(page, server, "isd", 0)
    assert "prefill" in page.locator("#viz-isd").inner_text()
    rounds = json.loads(page.evaluate("() => JSON.stringify(document.querySelector('.ssv').ssViz.doc.rounds"
                                      ".map(r => [r.round, r.case, (r.pq || []).length]))"))
    cold = next(r for r, case, _ in rounds if case == "C" and r > 0)
    open_run(page, server, "isd", cold)
    assert "cold start" in page.locator("#viz-isd").inner_text()
    verified = next(r for r, _, n in rounds if n)
    open_run(page, server, "isd", verified)
    isd = page.locator("#viz-isd").inner_text()
    assert "min(1, p/(αq))" in isd and "u < min(1, p/(αq))" in isd  # T = 0.7
    with_conf = page.evaluate("() => document.querySelector('.ssv').ssViz.doc.rounds.findIndex(r => r.round > 0 && "
                              "(r.conf || []).some(c => c !== null))")
    open_run(page, server, "isd", with_conf)
    bars = page.eval_on_selector_all("#viz-conf rect.ssv-bar", "rs => rs.map(r => Number(r.getAttribute('width')))")
    slots = page.evaluate("k => document.querySelector('.ssv').ssViz.doc.rounds[k].tokens.length", with_conf)
    assert bars and all(w < 800 / slots for w in bars), "a bar is one position wide, not the whole chart"


@pytest.mark.parametrize("mode", ["spiffy", "specfold"])
def test_branches_show_masks_matches_and_cache_hits(page, server, mode) -> None:
    open_run(page, server, mode)
    doc_rounds = page.evaluate("() => document.querySelector('.ssv').ssViz.doc.rounds.map(r => "
                               "[r.round, (r.branches || []).filter(b => b.cache_hit).map(b => b.verified_round)])")
    hit_round, verified = next((r, v[0]) for r, v in doc_rounds if v)
    open_run(page, server, mode, verified)
    branches = page.locator("#viz-branches")
    assert f"matched the main state of round {hit_round}" in branches.inner_text()
    # a position still masked in a branch is a mask cell, never a yellow draft
    assert page.evaluate("() => [...document.querySelectorAll('#viz-branches .ss-s-draft .ss-txt')]"
                         ".every(e => e.innerText !== '[M]')")
    assert branches.locator(".ss-s-mask").count() > 0
    open_run(page, server, mode, hit_round)
    assert f"verified in round {verified}" in page.locator("#viz-grid .ss-round-head").inner_text()
    summary = page.locator("#viz-summary").inner_text()
    assert "forwards saved" in summary and "draft hit rate" in summary
    if mode == "specfold":
        open_run(page, server, mode, verified)
        fold = page.locator("#viz-fold").inner_text()
        assert "QKV folded" in fold and "FFN folded" in fold and "run overall" in fold
        shot(page, "viz-specfold")


def test_a_tree_round_draws_its_branches_at_the_same_positions_in_the_grid_and_the_chart(page, server) -> None:
    """A linear_spec round of three branches: each branch's drafts lie at their own positions, the same in the grid
    and the confidence chart, one token of a branch a position (the figures: tests/test_browser_grid.py)."""
    open_run(page, server, "tree")
    branched = page.evaluate("() => document.querySelector('.ssv').ssViz.doc.rounds.map(r => "
                             "(r.lanes || []).some(lane => lane > 0))")   # a tree round with drafts off its path
    k = branched.index(True)
    page.evaluate("k => document.querySelector('.ssv').ssViz.go(k)", k)
    page.wait_for_selector("#viz-grid .ss-block.ss-tree .ss-lane")
    grid, conf = (sorted(page.eval_on_selector_all(sel, "es => es.map(e => [Number(e.dataset.branch), "
                                                   "Number(e.dataset.pos), Number(e.dataset.token)])"))
                  for sel in ("#viz-grid .ss-block .ss-tok[data-branch]", "#viz-conf rect.ssv-bar[data-branch]"))
    assert grid and grid == conf    # each draft's cell and bar: one branch, one position, one token
    assert len({(b, pos) for b, pos, _ in grid}) == len(grid), "a position holds two tokens of one branch"
    assert len({b for b, _, _ in grid}) == 3
    page.locator("#viz-grid").screenshot(path=str(ARTIFACTS / "viz-tree.png"))


def test_autoplay_reaches_the_end(page, server) -> None:
    open_run(page, server, "ar", 0)
    page.select_option("#viz-speed", "20")
    last = int(page.eval_on_selector("#viz-slider", "e => e.max"))
    start = time.monotonic()
    page.click("#viz-play")
    page.wait_for_function(f"() => {LABEL}.startsWith('round {last} of')")
    print(f"\nautoplay at 20 rounds/s: {last / (time.monotonic() - start):.1f} rounds/s")


def test_a_running_run_is_followed_until_it_ends(page, server) -> None:
    """A run still recording opens with its rounds so far, takes new rounds as they are stored and settles when
    its run_end arrives."""
    from specscope.backend.tracing import RecordingTracer

    events = []
    server["engine"].generate(CODE_PROMPT, "ar", {"max_new_tokens": 12, "raw": True},
                              tracer=RecordingTracer(sink=events.append))
    run_id = "r_live000000000001"
    events = [dict(e, run_id=run_id) for e in events]
    rounds_at = [i for i, e in enumerate(events) if e["type"] == "round"]
    head = rounds_at[2] + 1
    for event in events[:head]:
        server["store"].record(event)
    server["store"].flush()  # the store batches events; a live run's are flushed as they come
    server["runs"]["live"] = run_id
    open_run(page, server, "live")
    assert "live: following" in page.locator("#viz-summary").inner_text()
    assert label(page).startswith("round 2 of 2")

    def finish() -> None:
        for event in events[head:]:
            time.sleep(0.05)
            server["store"].record(event)
            server["store"].flush()

    writer = threading.Thread(target=finish)
    writer.start()
    page.wait_for_function("() => document.querySelector('#viz-summary').innerText.includes(' done ')",
                           timeout=60_000)
    writer.join()
    n = len(rounds_at) - 1
    assert label(page) == f"round {n} of {n}"  # it followed the end
    assert "live: following" not in page.locator("#viz-summary").inner_text()
    page.wait_for_selector("#viz-kv .main-svg")


def test_phone_layout_keeps_every_value_reachable(browser, server) -> None:
    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    phone.set_default_timeout(TIMEOUT_MS)
    open_run(phone, server, "specfold", 3)
    for chart in ("#viz-accepted", "#viz-kv"):
        box = phone.locator(chart).bounding_box()
        assert box and box["width"] >= 300, f"{chart} is squeezed: {box}"
    overflow = phone.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, "the page itself must not scroll sideways; wide tables scroll in their own box"
    # No Plotly tool bar over the charts' right edge on a phone; the legend sits above the run
    assert phone.locator("#viz-accepted .modebar").count() == 0
    legend, grid = phone.locator("#viz-legend").bounding_box(), phone.locator("#viz-grid").bounding_box()
    assert legend and grid and legend["y"] < grid["y"]
    painted(phone)
    phone.screenshot(path=str(ARTIFACTS / "viz-phone.png"), full_page=True)
    phone.close()


def test_no_console_errors(page, errors) -> None:
    assert [e for e in errors if not any(noise in e for noise in NAVIGATION_NOISE)] == []
