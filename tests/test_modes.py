"""Tests every registered mode gets from the registry alone: lossless equality with a working drafter, bad
parameters, and concurrency that never changes a run. A new mode needs no list edited here."""
import pytest
from support.modes import HELDOUT_GEN

from specscope.backend.engine.blocks import BlockMode
from specscope.backend.engine.lossless import Outcome, claim_of, verdict
from specscope.backend.engine.modes import REGISTRY, get_mode, mode_names
from specscope.backend.engine.params import ParamError
from specscope.backend.tracing import RecordingTracer

GEN = HELDOUT_GEN
LOSSLESS = [m for m in mode_names() if REGISTRY[m].lossless_vs]


def variants(mode: str) -> list[dict]:
    """The parameters each lossless mode is checked at beyond its claim's: every verify length
    (engine/verify_length.py), each with a tree draft where the mode drafts trees (engine/draft_tree.py)."""
    params = {p.name: p for p in REGISTRY[mode].params}
    if "verify" not in params:
        return [{}]
    out = [{"verify": v} for v in params["verify"].choices]
    return out + [{**o, "branches": 4} for o in out] if "branches" in params else out


VARIANTS = [pytest.param(m, v, id="-".join([m, *map(str, v.values())])) for m in LOSSLESS for v in variants(m)]


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "extra"), VARIANTS)
def test_lossless_mode_equals_its_reference_and_its_drafter_works(heldout_runs, mode, extra):
    """Greedy output == the reference mode's on every held-out prompt, at every verify length, and the drafting
    side does real work there (else equality would hold vacuously: a mode whose drafts are never used still
    equals ar). Each side is one batched run over the prompts, kept for the session (heldout_runs): a reference
    that is itself a lossless mode (spiffy for specfold) runs once, and the mode files check their own metrics on
    these same runs."""
    cls = REGISTRY[mode]
    prompts = heldout_runs.prompts
    assert len(prompts) >= 35
    claimed = {**GEN, **cls.lossless_params, **extra}
    refs = heldout_runs(cls.lossless_vs, GEN)
    runs = heldout_runs(mode, claimed)
    for prompt, ref, run in zip(prompts, refs, runs, strict=True):
        found = verdict(Outcome(mode, run.output_ids, claimed, run.status),
                        Outcome(ref.mode, ref.output_ids, GEN, ref.status), claim_of(mode))
        assert found.holds, (mode, prompt, found.blockers, run.text, ref.text)
    assert heldout_runs.engine.rt.pool.used == 0
    assert cls.drafter, f"{mode} claims lossless but declares no drafter metric to show its drafts work"
    metric, minimum = cls.drafter
    if any(extra.get(k, v) != v for k, v in cls.drafter_params.items()):
        return      # the drafter is shown at its own parameters (a fixed verify length)
    # the drafter at its parameters: on every 5th prompt where the lossless claim needs other ones
    drafting_params = {**GEN, **cls.drafter_params, **extra}
    drafting = runs if drafting_params == claimed else heldout_runs(mode, drafting_params, prompts[::5])
    drafted = [run.metrics[metric] or 0.0 for run in drafting]
    assert all(run.status == "done" for run in drafting)
    assert sum(drafted) / len(drafted) >= minimum, (mode, metric, sum(drafted) / len(drafted))


def bad_values(param):
    if param.type is str:
        return ["no-such-choice", 3]
    if param.type is bool:
        return ["yes", 1]
    values = ["x", None]
    if param.min is not None:
        values.append(param.min - 1)
    if param.max is not None:
        values.append(param.max + 1)
    if param.type is int:
        values.append(param.default + 0.5)
    return values


@pytest.mark.parametrize("mode", mode_names())
def test_every_bad_parameter_is_refused_by_name_and_nothing_runs(shared_engine, mode):
    params = get_mode(mode).params
    for param in params:
        for value in bad_values(param):
            with pytest.raises(ParamError, match=param.name):
                shared_engine.generate("Count from 3 to 9.", mode, {param.name: value})
    with pytest.raises(ParamError, match="bogus"):
        shared_engine.generate("Count from 3 to 9.", mode, {"bogus": 1})
    assert shared_engine.rt.pool.used == 0 and not shared_engine.scheduler.has_work


def variant(mode):
    """Other valid values than the defaults: every numeric mode parameter halfway to its minimum."""
    moved = {p.name: p.type((p.min + p.default) / 2) for p in get_mode(mode).params
             if p.type in (int, float) and p.min is not None and p.min != p.default}
    return moved or {"max_new_tokens": 12}


def rounds_of(tracer):
    return [(e["tokens"], e["states"], e["committed"], e["nfe"]) for e in tracer.events if e["type"] == "round"]


@pytest.mark.parametrize("mode", mode_names())
def test_concurrent_requests_with_other_parameters_run_as_they_do_alone(shared_engine, heldout_prompts, mode):
    prompts = heldout_prompts[3], heldout_prompts[10]
    params = ({"max_new_tokens": 24}, {"max_new_tokens": 24, **variant(mode)})
    solo = []
    for prompt, p in zip(prompts, params, strict=True):
        tracer = RecordingTracer()
        res = shared_engine.generate(prompt, mode, p, tracer=tracer)
        solo.append((res.output_ids, rounds_of(tracer)))
    tracers = [RecordingTracer(), RecordingTracer()]
    together = shared_engine.run([shared_engine.new_request(prompt, mode, p, t)
                                  for prompt, p, t in zip(prompts, params, tracers, strict=True)])
    assert [(r.output_ids, rounds_of(t)) for r, t in zip(together, tracers, strict=True)] == solo
    assert shared_engine.rt.pool.used == 0


@pytest.mark.parametrize("mode", mode_names())
def test_a_run_cancelled_before_its_prefill_ends_cleanly(shared_engine, mode):
    tracer = RecordingTracer()
    req = shared_engine.new_request("Count from 3 to 9.", mode, {"max_new_tokens": 8}, tracer)
    req.cancel.set()
    shared_engine.run([req])
    assert req.status == "cancelled" and tracer.events[-1]["type"] == "run_end"
    assert tracer.events[-1]["metrics"]["kv_leaked"] == 0 and shared_engine.rt.pool.used == 0


@pytest.mark.parametrize("mode", mode_names())
def test_the_rounds_text_deltas_spell_the_runs_text(shared_engine, heldout_prompts, mode):
    """What a live viewer shows (the rounds' deltas, in order) is exactly the text the run ends with."""
    for prompt in heldout_prompts[::9]:
        tracer = RecordingTracer()
        run = shared_engine.generate(prompt, mode, GEN, tracer=tracer)
        shown = "".join(e["text_delta"] for e in tracer.events if e["type"] == "round")
        assert shown == run.text == tracer.events[-1]["text"], (mode, prompt)



def cells(r):
    """(position, token, state) of a round's cells (quadratic lays several on one position: `extra.offsets`)."""
    offsets = (r.get("extra") or {}).get("offsets") or range(len(r["tokens"]))
    return [(r["block_start"] + off, t, s) for off, t, s in zip(offsets, r["tokens"], r["states"], strict=False)]


@pytest.mark.parametrize("mode", mode_names())
def test_rounds_cut_by_max_new_tokens_show_cut_cells_and_count_what_was_kept(shared_engine, mode):
    """A round's `accepted` is its accepted cells; what the mode kept past max_new_tokens is `cut` and nothing
    else is; outside the block modes (which commit a whole block at its refresh) the accepted and bonus cells are
    exactly the committed tokens; and short limits do cut a round of a mode that commits several tokens a round."""
    cut_seen = several = False
    for prompt in ("Count from 3 to 9.", "Reverse: q w e r t y u i"):
        for limit in (2, 3, 5):
            tracer = RecordingTracer()
            params = {"max_new_tokens": limit, **REGISTRY[mode].drafter_params}
            res = shared_engine.generate(prompt, mode, params, tracer=tracer)
            end = len(tracer.events[0]["prompt_ids"]) + limit
            rounds = [e for e in tracer.events if e["type"] == "round"]
            committed = [t for r in rounds for t in r["committed"]]
            assert committed[:len(res.output_ids)] == res.output_ids and len(committed) <= limit
            for r in rounds:
                for pos, _, s in cells(r):
                    assert (s == "cut") == (pos >= end and s in ("cut", "accepted", "committed", "bonus")), r
                assert r["accepted"] == r["states"].count("accepted")
                if not issubclass(REGISTRY[mode], BlockMode):
                    assert [t for _, t, s in sorted(cells(r)) if s in ("accepted", "bonus")] == r["committed"], r
                cut_seen = cut_seen or "cut" in r["states"]
                several = several or len(r["committed"]) > 1
    assert cut_seen or not several, mode
