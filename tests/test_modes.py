"""Tests every registered mode gets from the registry alone: lossless equality with a working drafter, bad
parameters, and concurrency that never changes a run. A new mode needs no list edited here."""
import pytest

from backend.engine.modes import REGISTRY, get_mode, mode_names
from backend.engine.params import ParamError
from backend.tracing import RecordingTracer

GEN = {"max_new_tokens": 32}
LOSSLESS = [m for m in mode_names() if REGISTRY[m].lossless_vs]


@pytest.mark.parametrize("mode", LOSSLESS)
def test_lossless_mode_equals_its_reference_and_its_drafter_works(engine, heldout_prompts, mode):
    """Greedy output == the reference mode's on every held-out prompt, and the drafting side does real
    work there (else equality would hold vacuously: a mode whose drafts are never used still equals ar)."""
    cls = REGISTRY[mode]
    assert len(heldout_prompts) >= 35
    drafter = []
    for i, prompt in enumerate(heldout_prompts):
        ref = engine.generate(prompt, cls.lossless_vs, GEN)
        run = engine.generate(prompt, mode, {**GEN, **cls.lossless_params})
        assert run.status == "done" and run.output_ids == ref.output_ids, (mode, prompt, run.text, ref.text)
        if cls.drafter and cls.lossless_params and i % 5 == 0:   # the drafter at its default parameters
            run = engine.generate(prompt, mode, GEN)
        if cls.drafter and (not cls.lossless_params or i % 5 == 0):
            drafter.append(run.metrics[cls.drafter[0]] or 0.0)
    assert cls.drafter, f"{mode} claims lossless but declares no drafter metric to show its drafts work"
    metric, minimum = cls.drafter
    assert sum(drafter) / len(drafter) >= minimum, (mode, metric, sum(drafter) / len(drafter))
    assert engine.rt.pool.used == 0


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
def test_every_bad_parameter_is_refused_by_name_and_nothing_runs(engine, mode):
    params = get_mode(mode).params
    for param in params:
        for value in bad_values(param):
            with pytest.raises(ParamError, match=param.name):
                engine.generate("Count from 3 to 9.", mode, {param.name: value})
    with pytest.raises(ParamError, match="bogus"):
        engine.generate("Count from 3 to 9.", mode, {"bogus": 1})
    assert engine.rt.pool.used == 0 and not engine.scheduler.has_work


def variant(mode):
    """Other valid values than the defaults: every numeric mode parameter halfway to its minimum."""
    moved = {p.name: p.type((p.min + p.default) / 2) for p in get_mode(mode).params
             if p.type in (int, float) and p.min is not None and p.min != p.default}
    return moved or {"max_new_tokens": 12}


def rounds_of(tracer):
    return [(e["tokens"], e["states"], e["committed"], e["nfe"]) for e in tracer.events if e["type"] == "round"]


@pytest.mark.parametrize("mode", mode_names())
def test_concurrent_requests_with_other_parameters_run_as_they_do_alone(engine, heldout_prompts, mode):
    prompts = heldout_prompts[3], heldout_prompts[10]
    params = ({"max_new_tokens": 24}, {"max_new_tokens": 24, **variant(mode)})
    solo = []
    for prompt, p in zip(prompts, params, strict=True):
        tracer = RecordingTracer()
        res = engine.generate(prompt, mode, p, tracer=tracer)
        solo.append((res.output_ids, rounds_of(tracer)))
    tracers = [RecordingTracer(), RecordingTracer()]
    together = engine.run([engine.new_request(prompt, mode, p, t)
                           for prompt, p, t in zip(prompts, params, tracers, strict=True)])
    assert [(r.output_ids, rounds_of(t)) for r, t in zip(together, tracers, strict=True)] == solo
    assert engine.rt.pool.used == 0


@pytest.mark.parametrize("mode", mode_names())
def test_a_run_cancelled_before_its_prefill_ends_cleanly(engine, mode):
    tracer = RecordingTracer()
    req = engine.new_request("Count from 3 to 9.", mode, {"max_new_tokens": 8}, tracer)
    req.cancel.set()
    engine.run([req])
    assert req.status == "cancelled" and tracer.events[-1]["type"] == "run_end"
    assert tracer.events[-1]["metrics"]["kv_leaked"] == 0 and engine.rt.pool.used == 0


@pytest.mark.parametrize("mode", mode_names())
def test_the_rounds_text_deltas_spell_the_runs_text(engine, heldout_prompts, mode):
    """What a live viewer shows (the rounds' deltas, in order) is exactly the text the run ends with."""
    for prompt in heldout_prompts[::9]:
        tracer = RecordingTracer()
        run = engine.generate(prompt, mode, GEN, tracer=tracer)
        shown = "".join(e["text_delta"] for e in tracer.events if e["type"] == "round")
        assert shown == run.text == tracer.events[-1]["text"], (mode, prompt)
