"""The one token-grid renderer (app/static/viz.js) in Chromium, on the chat's latest-round data (app/figures.py:
live_round) of synthetic rounds: every piece escaped, states coloured, the context dimmed before the block, hover
titles with round, position, token, confidence and p/q, masked cells, cut and skipped context counted."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.browser import NEEDS_BROWSER, new_page
from support.events import piece, rnd, run_events

from specscope.app.figures import live_round
from specscope.app.trace import RunTrace
from specscope.app.ui import STATIC

pytest_plugins = ["support.browser"]  # the browser fixture
pytestmark = [pytest.mark.browser, *NEEDS_BROWSER]


@pytest.fixture(scope="module")
def page(browser) -> Iterator[Any]:
    """A blank page with viz.js loaded, as the UI loads it into the head."""
    page = new_page(browser)
    page.set_content("<html><body><div id='grid'></div></body></html>")
    page.add_script_tag(content=(STATIC / "viz.js").read_text())
    yield page
    page.close()


def draw(page, live: str) -> dict[str, Any]:
    """Draw live_round's JSON into #grid as the chat's panel does; what the page shows."""
    return page.evaluate("""(value) => {
        const grid = document.getElementById("grid");
        window.specscopeViz.live(grid, value);
        const cells = [...grid.querySelectorAll(".ss-tok")];
        return {html: grid.innerHTML, text: grid.innerText, scripts: grid.querySelectorAll("script, img").length,
                cells: cells.map((c) => ({cls: c.className, text: c.querySelector(".ss-txt").textContent,
                                          title: c.title, block: !!c.closest(".ss-block")}))};
    }""", live)


@pytest.fixture(scope="module")
def trace() -> RunTrace:
    return RunTrace.from_events(run_events())


def test_every_piece_is_text(page, trace: RunTrace) -> None:
    shown = draw(page, live_round(trace.rounds[1], piece, trace.context(1)))
    assert shown["scripts"] == 0 and "<script>" in [c["text"] for c in shown["cells"]]
    entity = draw(page, live_round(trace.rounds[2], piece, trace.context(2)))
    assert "&amp;" in [c["text"] for c in entity["cells"]], "an entity is shown as text"


def test_states_coloured_and_context_before_the_block(page, trace: RunTrace) -> None:
    cells = draw(page, live_round(trace.rounds[1], piece, trace.context(1)))["cells"]
    states = [c["cls"].split("ss-s-")[1] for c in cells]
    assert states == ["prompt", "prompt", "committed", "accepted", "bonus", "rejected"]
    assert [c["block"] for c in cells] == [False, False, True, True, True, True]


def test_hover_title_has_round_position_token_confidence(page, trace: RunTrace) -> None:
    cells = draw(page, live_round(trace.rounds[1], piece, trace.context(1)))["cells"]
    accepted = next(c["title"] for c in cells if "accepted" in c["cls"])
    assert "pos 3 · accepted" in accepted and "round 1" in accepted and "confidence 0.950" in accepted
    assert 'token "<script>" (id 2)' in accepted


def test_pq_in_title_small_probabilities_never_zero(page) -> None:
    r = rnd(4, 10, [7, 8, 9], ["pending", "accepted", "rejected"], [8],
            pq=[{"i": 0, "p": 0.8, "q": 0.6, "accepted": True}, {"i": 1, "p": 3e-5, "q": 0.9, "accepted": False}])
    titles = [c["title"] for c in draw(page, live_round(r, piece))["cells"]]
    assert "p 0.800 · q 0.600 · accepted" in titles[1] and "p 3.00e-5 · q 0.900 · rejected" in titles[2]


def test_masked_cells_show_mask_label_and_guess(page) -> None:
    r = rnd(1, 0, [1, 9, 9], ["committed", "mask", "padding"], [], extra={"guess": [2, 3]})
    cells = draw(page, live_round(r, piece))["cells"]
    assert [c["text"] for c in cells] == ["Hi", "[M]", "[M]"]
    assert 'guess "<script>"' in cells[1]["title"] and 'guess " there"' in cells[2]["title"]


def test_cut_and_skipped_context_is_counted(page, trace: RunTrace) -> None:
    context = [(i, 1, "prompt") for i in range(100)]
    shown = draw(page, live_round(rnd(0, 100, [1], ["accepted"], [1]), piece, context, max_context=10))
    assert "… 90 earlier" in shown["text"] and sum("ss-s-prompt" in c["cls"] for c in shown["cells"]) == 10
    skipped = RunTrace.from_events([e for e in run_events() if e.get("round") != 1])
    assert "… 1 position not streamed" in draw(page, live_round(skipped.rounds[1], piece, skipped.context(1)))["text"]


def test_nothing_streamed_yet_and_hostile_numbers(page) -> None:
    assert "latest round of a streaming run" in draw(page, "")["text"]
    hostile = json.loads(live_round(rnd(0, 0, [1], ["accepted"], [1]), piece))
    hostile["round"]["block_start"] = "<img src=x onerror=window.__xss=1>"
    hostile["context"] = [["<img src=x>", 1, "<b>prompt</b>"]]
    shown = draw(page, json.dumps(hostile))
    assert shown["scripts"] == 0 and page.evaluate("() => window.__xss") is None


@pytest.fixture(scope="module")
def viz_page(browser) -> Iterator[Any]:
    """A page at an http origin (the visualizer writes its round into the URL) with viz.js and an empty root."""
    page = new_page(browser)
    script = (STATIC / "viz.js").read_text()
    html = f"<html><body><div id='viz' class='ssv'></div><script>{script}</script></body></html>"
    page.route("http://viz.test/**", lambda route: route.fulfill(body=html, content_type="text/html"))
    page.goto("http://viz.test/")
    yield page
    page.close()


def drawn_tree(page, k: int) -> dict[str, list[list[Any]]]:
    """The visualizer's round k of the mounted run: [lane, branch (-1: none), position, token] of the grid's cells
    and of the confidence chart's bars."""
    page.evaluate("k => document.querySelector('#viz').ssViz.go(k)", k)
    page.wait_for_function("k => document.querySelector('#viz-label').innerText.startsWith(`round ${k} of`)", arg=k)
    return page.evaluate("""() => Object.fromEntries([['grid', '#viz-grid .ss-block .ss-tok'],
                                                      ['conf', '#viz-conf rect.ssv-bar']].map(([name, sel]) =>
        [name, [...document.querySelectorAll(sel)].map(e => [Number(e.dataset.lane), Number(e.dataset.branch ?? -1),
                                                             Number(e.dataset.pos), Number(e.dataset.token)])]))""")


def test_a_tree_round_draws_each_branch_at_its_positions_in_the_grid_and_the_chart(viz_page) -> None:
    """A tree round (support.events.tree_run_events) draws as a tree: the seed, the accepted path and the bonus on
    one row, each branch's rejected drafts on a row of their own at their true positions (the losing branch at 36-39,
    not past the bonus at 40), the same in the grid and the confidence chart, one token of a branch a position."""
    from support.events import TREE_START, tree_run_events

    from specscope.app.vizdoc import document_json, viz_document

    doc = viz_document(RunTrace.from_events(tree_run_events()), piece)
    viz_page.evaluate("v => window.specscopeViz.mount(document.querySelector('#viz'), v)", document_json(doc))
    for k, r in ((1, doc["rounds"][1]), (2, doc["rounds"][2])):
        shown = drawn_tree(viz_page, k)
        grid, conf = shown["grid"], shown["conf"]
        positions = [r["block_start"] + o for o in r["extra"]["offsets"]]
        branches = [-1, *r["extra"]["tree"]["branches"], -1]     # the seed's, each node's, the bonus's
        assert sorted(grid) == sorted([lane, branch, pos, token] for lane, branch, pos, token in
                                      zip(r["lanes"], branches, positions, r["tokens"], strict=True))  # where it lies
        drafts = [cell for cell in grid if cell[1] >= 0]
        assert sorted(conf) == sorted(drafts)   # each draft's bar at the same lane and position as its cell
        by_branch = [(branch, pos) for _, branch, pos, _ in drafts]
        assert len(set(by_branch)) == len(by_branch), "a position holds two tokens of one branch"
        assert len({(lane, pos) for lane, _, pos, _ in grid}) == len(grid), "two cells of a row at one position"
    losing = sorted(pos for _, branch, pos, _ in drawn_tree(viz_page, 1)["conf"] if branch == 1)
    assert losing == [TREE_START + d for d in range(1, 5)]
    assert viz_page.locator("#viz-grid .ss-block.ss-tree .ss-lane").all_inner_texts() == ["b1"]


def test_the_chats_latest_round_draws_a_tree_as_the_visualizer_does(page) -> None:
    """The chat's live panel draws a tree round with the visualizer's rows: every cell on its lane at its position."""
    from support.events import tree_run_events

    from specscope.app.figures import tree_lanes

    trace = RunTrace.from_events(tree_run_events())
    r = trace.rounds[2]
    draw(page, live_round(r, piece, trace.context(2)))
    shown = page.eval_on_selector_all("#grid .ss-block.ss-tree .ss-tok",
                                      "cs => cs.map(c => [Number(c.dataset.lane), Number(c.dataset.pos)])")
    assert shown == [[lane, r["block_start"] + o] for lane, o in zip(tree_lanes(r), r["extra"]["offsets"], strict=True)]
