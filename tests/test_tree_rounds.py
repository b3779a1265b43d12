"""Tree rounds (linear_spec with branches > 1) are drawn as trees at their true positions: app/figures.py:tree_lanes
gives each cell the row that the token grid and the confidence chart (app/static/viz.js) both place it on, at
block_start + its offset, one cell a position in every row; the visualizer's document and the chat's latest round
carry it. (tests/test_browser_grid.py checks the drawn grid and chart against each other.)"""
from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from support.events import TREE_START, piece, tree_run_events

from specscope.app.figures import live_round, tree_lanes
from specscope.app.trace import RunTrace
from specscope.app.vizdoc import viz_document


def check_tree(r: dict[str, Any]) -> dict[int, dict[int, int]]:
    """Assert that a tree round's lanes put every cell at its true position, one cell a position in each lane, the
    seed, the accepted path and the bonus on lane 0 and each rejected draft on a lane of its branch alone; each
    branch's drafts as {position: token}."""
    lanes = tree_lanes(r)
    n = len(r["tokens"])
    assert lanes is not None and len(lanes) == n
    extra, start = r["extra"], r["block_start"]
    tree = extra["tree"]
    positions = [start + o for o in extra["offsets"][:n]]     # a round cut after an end token keeps its first cells
    seen: dict[int, set[int]] = defaultdict(set)
    for lane, pos in zip(lanes, positions, strict=True):
        assert pos not in seen[lane], f"lane {lane} holds two cells at position {pos}"
        seen[lane].add(pos)
    nodes = min(len(tree["branches"]), n - 1)
    path = [node for node in tree["path"] if node < nodes]
    bonus = [n - 1] if n - 1 > nodes else []
    line = [i for i, lane in enumerate(lanes) if lane == 0]
    assert line == [0, *(node + 1 for node in path), *bonus]     # the seed, the accepted path, the bonus
    assert [positions[i] for i in line] == list(range(start, start + len(line)))   # one after another
    branch_of_lane: dict[int, int] = {}
    drafts: dict[int, dict[int, int]] = defaultdict(dict)
    for node in range(nodes):
        branch, depth, i = tree["branches"][node], extra["offsets"][node + 1], node + 1
        assert positions[i] == start + depth
        assert drafts[branch].setdefault(positions[i], r["tokens"][i]) == r["tokens"][i], "two drafts of a branch"
        if node not in path:
            assert lanes[i] > 0 and branch_of_lane.setdefault(lanes[i], branch) == branch, "a lane of two branches"
    return drafts


def test_a_tree_rounds_branches_lie_at_their_true_positions() -> None:
    """The losing branch of a round that accepted all of branch 0 lies at 36-39, under the winning path, not past
    the bonus at 40; a branch's rejected tail lies beside the bonus on a lane of its own."""
    trace = RunTrace.from_events(tree_run_events())
    full, partial = trace.rounds[1], trace.rounds[2]
    drafts = check_tree(full)
    assert sorted(drafts[1]) == [TREE_START + d for d in range(1, 5)] == sorted(drafts[0])
    bonus = TREE_START + 5
    assert tree_lanes(full)[-1] == 0 and full["states"][-1] == "bonus" and bonus not in drafts[1]
    drafts = check_tree(partial)
    start = partial["block_start"]
    lanes = tree_lanes(partial)
    tail = [i for i in range(1, 5) if partial["states"][i] == "rejected"]    # branch 0's drafts past the path
    assert [start + partial["extra"]["offsets"][i] for i in tail] == [start + 3, start + 4]
    assert {lanes[i] for i in tail} == {1} and lanes[-1] == 0                # the bonus at start + 3 on lane 0
    assert set(lanes[5:9]) == {2}


def test_rounds_that_are_no_tree_have_no_lanes() -> None:
    trace = RunTrace.from_events(tree_run_events())
    assert tree_lanes(trace.rounds[0]) is None
    interleaved = {"block_start": 4, "tokens": [1, 9, 2, 9], "states": ["pending", "mask", "draft", "mask"],
                   "extra": {"layout": "interleaved", "offsets": [0, 1, 1, 2]}}
    assert tree_lanes(interleaved) is None


def test_the_document_and_the_live_round_carry_the_lanes() -> None:
    trace = RunTrace.from_events(tree_run_events())
    doc = viz_document(trace, piece)
    assert [r.get("lanes") for r in doc["rounds"]] == [None, *(tree_lanes(r) for r in trace.rounds[1:])]
    live = json.loads(live_round(trace.rounds[1], piece, trace.context(1)))
    assert live["round"]["lanes"] == tree_lanes(trace.rounds[1])


@pytest.mark.slow
def test_recorded_tree_rounds_draw_one_token_per_position(engine) -> None:
    """Every tree round linear_spec records (three branches, each drafted to the block's end) keeps the layout."""
    from specscope.backend.tracing import RecordingTracer

    tracer = RecordingTracer()
    engine.generate("Reverse: q w e r t y u i", "linear_spec",
                    {"max_new_tokens": 16, "branches": 3, "block_size": 6, "verify": "fixed"}, tracer=tracer)
    trees = [e for e in tracer.events if e["type"] == "round" and (e.get("extra") or {}).get("layout") == "tree"]
    assert trees
    assert any(len(check_tree(r)) == 3 for r in trees)
    for r in trees:
        check_tree(r)
