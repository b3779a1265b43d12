"""Draft tiers: under load the drafting modes shrink their drafts (down to plain decode steps) as the tier in force
says, each round records the tier, a lone request keeps its own parameters, and the tokens never change."""
import pytest

from specscope.backend.engine.cost_curve import CostCurve
from specscope.backend.engine.draft_tiers import (
    auto_tiers,
    budget,
    fitted_length,
    tier_cut,
    tier_note,
)
from specscope.backend.engine.modes import REGISTRY, get_mode, mode_names
from specscope.backend.tracing import RecordingTracer

AVX2 = CostCurve({1: 1.0, 2: 1.15, 4: 1.72, 8: 2.63, 16: 3.88})   # a float32 verify on AVX2: each row its share
AMX = CostCurve({1: 1.0, 2: 1.02, 4: 1.05, 8: 1.15, 16: 1.42})    # bf16 on AMX tiles: rows nearly free


TIERED = [m for m in mode_names() if REGISTRY[m].draft_param]
"""The modes a draft tier shrinks: those that declare which parameter sets their draft (Mode.draft_param)."""


def test_each_mode_fits_its_draft_to_the_rows_allowed() -> None:
    isd, quadratic, linear = (get_mode(m).draft_length for m in ("isd", "quadratic", "linear_spec"))
    assert isd(4, None) == 4 and isd(4, 2) == 2 and isd(4, 100) == 4 and isd(4, 1) is None
    assert quadratic(4, None) == 4 and quadratic(4, 3) == 1 and quadratic(4, 8) == 2 and quadratic(4, 2) is None
    assert linear(16, None) == 16 and linear(16, 3) == 2 and linear(16, 2) is None


@pytest.mark.parametrize("mode", TIERED)
def test_a_draft_length_is_the_longest_whose_rows_fit(mode) -> None:
    """Any mode's length under a budget follows from the rows it declares a round of each length runs: the longest
    that fits, never past its own, None (a decode step) where not even its shortest does."""
    m = get_mode(mode)
    own = next(p.default for p in m.params if p.name == m.draft_param)
    assert m.tier_rows({m.draft_param: own}) == m.draft_rows(own)
    for rows in range(0, m.draft_rows(own) + 3):
        fit = m.draft_length(own, rows)
        if fit is None:
            assert m.draft_rows(m.min_draft) > rows
        else:
            assert m.min_draft <= fit <= own and m.draft_rows(fit) <= rows
            assert fit == own or m.draft_rows(fit + 1) > rows
    assert fitted_length(5, None, m.draft_rows, m.min_draft) == 5


def test_auto_tiers_follow_the_cost_of_rows() -> None:
    cheap, dear = auto_tiers(AMX), auto_tiers(AVX2)
    assert budget(cheap, 1) is None and budget(dear, 1) is None            # a lone request as it asked
    assert budget(dear, 4) == 0 and budget(dear, 16) == 0                  # float32 on AVX2: no drafts under load
    assert budget(cheap, 2) > 0 and budget(cheap, 2) >= budget(cheap, 64)  # cheap rows: drafts shrink slowly
    assert [r for r, _ in cheap][-1] >= 64


@pytest.mark.parametrize("mode", TIERED)
def test_a_tier_of_no_drafts_turns_rounds_into_decode_steps_and_keeps_the_tokens(shared_engine, heldout_prompts,
                                                                               mode) -> None:
    prompts = heldout_prompts[:3]
    alone = [shared_engine.generate(p, mode, {"max_new_tokens": 12}).output_ids for p in prompts]
    shared_engine.scheduler.draft_tiers = [(1, None), (64, 0)]
    try:
        tracers = [RecordingTracer() for _ in prompts]
        together = shared_engine.run([shared_engine.new_request(p, mode, {"max_new_tokens": 12}, t)
                                      for p, t in zip(prompts, tracers, strict=True)])
    finally:
        shared_engine.scheduler.draft_tiers = []
    assert [r.output_ids for r in together] == alone
    rounds = [e for t in tracers for e in t.events if e["type"] == "round" and e["round"] > 0]
    tiered = [e for e in rounds if e["extra"]["tier"]["running"] > 1]
    assert tiered and all(e["extra"]["tier"]["extra_rows"] == 0 for e in tiered)
    assert all([p["kind"] for p in e["phases"]] == ["decode"] for e in tiered)
    assert any(p["batch_requests"] > 1 for e in tiered for p in e["phases"])   # decode steps shared, as ar's are
    starts = [e for t in tracers for e in t.events if e["type"] == "run_start"]
    assert all(s["draft_tiers"] == [[1, None], [64, 0]] for s in starts)


def test_the_rounds_a_tier_cut_are_counted_with_why() -> None:
    off = {"running": 2, "block_size": None, "extra_rows": 0, "own_rows": 6}
    fewer = {"running": 3, "block_size": None, "extra_rows": 2, "own_rows": 6}
    roomy = {"running": 2, "block_size": None, "extra_rows": 8, "own_rows": 6}
    smaller = {"running": 4, "block_size": 8, "extra_rows": None, "own_rows": 0}
    cut = tier_cut([off, None, off, fewer, roomy, smaller], {"block_size": 16})
    assert cut == {"rounds": 4, "why": {"drafting off with 2 runs active": 2,
                                        "draft rows cut to 2 of 6 with 3 runs active": 1,
                                        "block size 8 instead of 16 with 4 runs active": 1}}
    assert tier_note(cut).startswith("load tier reduced drafting in 4 rounds: drafting off with 2 runs active (2); ")
    ar = {"running": 2, "block_size": None, "extra_rows": 0, "own_rows": 0}   # a mode that never drafts
    assert tier_cut([ar, roomy, None], {}) is None and tier_note(None) == ""


def test_a_run_with_tiers_off_drafts_as_it_would_alone_under_load(shared_engine, heldout_prompts) -> None:
    """Two isd runs at once under a tier of no drafts: the one that turned tiers off drafts and records no tier;
    the other runs decode steps and its metrics say why."""
    shared_engine.scheduler.draft_tiers = [(1, None), (64, 0)]
    try:
        tracers = [RecordingTracer() for _ in range(2)]
        params = {"max_new_tokens": 12, "verify": "fixed"}
        done = shared_engine.run([shared_engine.new_request(heldout_prompts[2], "isd", {**params, "tiers": tiers}, t)
                                  for tiers, t in zip((False, True), tracers, strict=True)])
    finally:
        shared_engine.scheduler.draft_tiers = []
    alone, served = done
    assert alone.output_ids == served.output_ids
    assert alone.metrics["tpf"] > 1 and "tier_cut" not in alone.metrics
    assert all("tier" not in (e.get("extra") or {}) for e in tracers[0].events if e["type"] == "round")
    assert tracers[0].events[0]["draft_tiers"] == [] and tracers[1].events[0]["draft_tiers"] == [[1, None], [64, 0]]
    assert served.metrics["tier_cut"]["why"]["drafting off with 2 runs active"] > 0
