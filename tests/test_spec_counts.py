"""A run's vLLM-named draft counts (engine/spec_counts.py) and its acceptance alarm (engine/spec_alarm.py): the pure
rules on constructed drafts and token sequences, then real runs of the tiny model, whose run_end metrics carry both."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specscope.backend.engine.spec_alarm import (
    GARBLED_MIN_DRAFTS,
    HeldOut,
    alarm,
    card_figure,
    cycle,
    leading,
    loop,
)
from specscope.backend.engine.spec_counts import SPEC_KEYS, DraftStep, spec_counts, stored_counts

CHECKPOINTS = Path(__file__).parents[1] / "specscope/backend/model/checkpoints"
LOOPING = "import os\nimport os\nimport os\n"      # the tiny model repeats it to the end (raw)
VARIED = "def fibonacci(n):"                       # it rambles on, without a cycle
FIXED = {"verify": "fixed", "raw": True, "max_new_tokens": 48}


def card_with(block8: float) -> dict:
    """A card whose shipped adapter scores `block8` tokens per linear_spec round at block 8."""
    return {"adapter": {"heldout": {"shipped, 140 answers": {"block8_tokens_per_round": block8, "answers": 140}}}}


def check_counts(metrics: dict) -> None:
    """vLLM's invariants: accepted <= drafted, the per-position list never increases and sums to the accepted."""
    per_pos = metrics["num_accepted_tokens_per_pos"]
    assert metrics["num_accepted_tokens"] <= metrics["num_draft_tokens"]
    assert sum(per_pos) == metrics["num_accepted_tokens"]
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    assert not per_pos or per_pos[0] <= metrics["num_drafts"]


# -- the rules -------------------------------------------------------------------------------------------------

def test_counts_follow_vllms_definitions():
    steps = [DraftStep(3, 3, 3), DraftStep(3, 3, 1), DraftStep(3, 3, 0), DraftStep(5, 2, 2)]
    counts = spec_counts(steps)
    assert counts == {"num_drafts": 4, "num_draft_tokens": 14, "num_accepted_tokens": 6,
                      "num_accepted_tokens_per_pos": [3, 2, 1]}
    assert spec_counts([]) == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                               "num_accepted_tokens_per_pos": []}
    assert stored_counts({**counts, "nfe": 3}) == counts and stored_counts({"nfe": 3}) is None


def test_a_draft_cut_short_keeps_only_what_was_emitted():
    assert DraftStep(4, 4, 4).kept(2) == DraftStep(4, 4, 2)
    assert DraftStep(4, 4, 1).kept(3) == DraftStep(4, 4, 1)


@pytest.mark.parametrize("ids, period, flagged", [
    (list(range(10)) + [7, 8, 9] * 10, 3, True),               # a 3-token cycle over 30 of 40 tokens
    ([5] * 20, 1, True),                                       # one token over and over
    (list(range(40)), None, False),                            # nothing repeats
    (list(range(30)) + [1, 2] * 4, 2, False),                  # a cycle, but over a fifth of the output
    ([1, 2] * 6, 2, False),                                    # too short an output to judge
])
def test_loop_flags_an_output_ending_in_a_cycle(ids, period, flagged):
    check = loop(ids)
    assert (check["flagged"], check["period"]) == (flagged, period)
    assert "50%" in check["threshold"] and "rule of thumb" in check["source"]


def test_cycle_finds_the_longest_repeating_tail():
    assert cycle([9, 1, 2, 3, 1, 2, 3, 1, 2, 3]) == (3, 9)
    assert cycle([1, 2, 1, 2, 1, 2, 1, 2]) == (2, 8)         # not 4: the shortest period of the longest span
    assert cycle([]) == (0, 0)


def test_a_figures_rate_reproduces_it():
    figure = HeldOut(2.676, 7, "card")
    assert leading(figure.rate, 7) == pytest.approx(1.676, abs=1e-6)
    assert figure.expected([DraftStep(7, 7), DraftStep(3, 3)]) == pytest.approx(1.676 + leading(figure.rate, 3))


def test_garbled_drafts_are_far_below_the_cards_figure():
    figure = HeldOut(2.676, 7, "model_card.json adapter.heldout['shipped']: block8_tokens_per_round 2.676")
    bad = [DraftStep(7, 7, 0)] * GARBLED_MIN_DRAFTS
    good = [DraftStep(7, 7, 2)] * GARBLED_MIN_DRAFTS
    flagged = alarm(bad, [1, 2, 3], figure)
    assert flagged["flag"] == "garbled drafts" and "predicts" in flagged["why"]
    assert flagged["garbled_drafts"]["source"].startswith(figure.source)
    assert flagged["garbled_drafts"]["expected"] == pytest.approx(GARBLED_MIN_DRAFTS * 1.676, abs=0.01)
    assert alarm(good, [1, 2, 3], figure)["flag"] is None
    assert alarm(bad[:-1], [1, 2, 3], figure)["flag"] is None       # too few drafts to judge
    assert alarm(bad, [1, 2, 3], None)["garbled_drafts"]["source"].startswith("none")


def test_the_card_figure_is_the_lowest_shipped_one_of_the_modes_layout():
    card = json.loads((CHECKPOINTS / "smollm2-135m-selfspec/model_card.json").read_text())
    block, causal = card_figure(card, "block"), card_figure(card, "causal")
    assert block is not None and (block.tokens_per_round, block.drafts) == (2.676, 7)
    assert causal is not None and (causal.tokens_per_round, causal.drafts) == (1.713, 4)
    assert "shipped" in block.source and "block8_tokens_per_round 2.676" in block.source
    assert card_figure(card, None) is None
    assert card_figure(json.loads((CHECKPOINTS / "tiny/model_card.json").read_text()), "block") is None


# -- real runs -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, params", [("isd", {}), ("linear_spec", {"block_size": 6}), ("quadratic", {"k": 3}),
                                          ("linear_spec", {"branches": 3, "block_size": 6})])
def test_a_drafting_runs_counts(shared_engine, mode, params):
    result = shared_engine.generate(VARIED, mode, {**FIXED, **params})
    m = result.metrics
    check_counts(m)
    assert m["num_drafts"] > 0 and m["num_accepted_tokens"] > 0
    assert m["tpf"] == pytest.approx(m["tokens"] / m["nfe"])
    # each round emits its accepted drafts and one more token (not a cut round's, nor an EOS)
    assert m["tokens"] - m["num_accepted_tokens"] in (m["rounds"], m["rounds"] - 1, m["rounds"] - 2)


def test_a_run_that_drafts_nothing_counts_nothing(shared_engine):
    m = shared_engine.generate(VARIED, "ar", {"max_new_tokens": 16, "raw": True}).metrics
    assert {k: m[k] for k in SPEC_KEYS} == spec_counts([])


def test_a_cut_draft_is_not_counted_accepted(shared_engine):
    """max_new_tokens cuts the last round inside its accepted drafts (n = 5, 6) or after them (7, 9): every round
    but a cut one emits one token besides its accepted drafts, so the counts still add up to the output."""
    for n in (5, 6, 7, 9):
        m = shared_engine.generate(LOOPING, "linear_spec", {**FIXED, "block_size": 8, "max_new_tokens": n}).metrics
        check_counts(m)
        assert m["tokens"] == n
        assert m["tokens"] - m["num_accepted_tokens"] in (m["rounds"] - 1, m["rounds"])


def test_spiffys_accepted_drafts_are_its_cache_hits(spiffy_engine):
    m = spiffy_engine.generate(VARIED, "spiffy", {"max_new_tokens": 48, "raw": True}).metrics
    check_counts(m)
    assert m["num_accepted_tokens"] == m["cache_hits"] > 0
    assert m["num_draft_tokens"] == m["drafts_verified"] and m["num_drafts"] <= m["verify_forwards"]


def test_a_looping_run_is_flagged_and_a_varied_one_is_not(shared_engine):
    looping = shared_engine.generate(LOOPING, "linear_spec", FIXED).metrics["alarm"]
    assert looping["flag"] == "loop" and looping["loop"]["span"] >= 24
    varied = shared_engine.generate(VARIED, "linear_spec", FIXED).metrics["alarm"]
    assert varied["loop"]["tokens"] == 48 and varied["flag"] is None


def test_a_run_far_below_the_cards_figure_is_garbled(shared_engine, monkeypatch):
    recorder = shared_engine.scheduler.recorder
    monkeypatch.setattr(recorder, "card", card_with(7.5))        # a card claiming nearly every draft is accepted
    garbled = shared_engine.generate(VARIED, "linear_spec", {**FIXED, "block_size": 8}).metrics["alarm"]
    assert garbled["flag"] == "garbled drafts"
    assert "block8_tokens_per_round 7.5" in garbled["garbled_drafts"]["source"]
    monkeypatch.setattr(recorder, "card", card_with(2.0))
    fair = shared_engine.generate(VARIED, "linear_spec", {**FIXED, "block_size": 8}).metrics["alarm"]
    assert fair["flag"] is None and fair["garbled_drafts"]["expected"] > 0
    ar = shared_engine.generate(VARIED, "ar", {"max_new_tokens": 48, "raw": True}).metrics["alarm"]
    assert ar["garbled_drafts"]["expected"] is None                # ar drafts nothing: no figure applies
