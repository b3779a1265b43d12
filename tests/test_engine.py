"""Engine behaviour on the shipped model: lossless modes, KV lifecycle, tracing, scheduler, bad input."""
import threading

import pytest
from support.modes import every_mode
from support.traces import replay_kv

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import mode_names
from specscope.backend.engine.params import ParamError
from specscope.backend.engine.scheduler import parse_tiers
from specscope.backend.tracing import RecordingTracer, unfold

MODES = mode_names()


@pytest.mark.parametrize("mode", every_mode(slow={"block_diffusion", "spiffy", "specfold"}))
def test_kv_lifecycle_in_trace_and_pool(shared_engine, heldout_prompts, mode):
    """Every round was checked by the engine (check_invariants); the trace tells the same story."""
    for prompt in heldout_prompts[::6]:
        tracer = RecordingTracer()
        res = shared_engine.generate(prompt, mode, {"max_new_tokens": 40}, tracer=tracer)
        assert res.status == "done" and res.metrics["kv_leaked"] == 0
        held, committed = replay_kv(tracer.events)
        assert not held and not committed
        unfolded = unfold(tracer.events)   # a record's KV operations take the seqs before its own
        assert [e["seq"] for e in unfolded] == list(range(len(unfolded)))
        assert all(e["type"] != "kv" for e in tracer.events)   # one record per round: KV operations folded in
        assert tracer.events[0]["type"] == "run_start" and tracer.events[-1]["type"] == "run_end"
        rounds = [e for e in tracer.events if e["type"] == "round"]
        assert sum(len(r["committed"]) for r in rounds) >= len(res.output_ids)
        assert sum(r["nfe"] for r in rounds) == res.metrics["nfe"]
    assert shared_engine.rt.pool.used == 0


def test_committed_kv_matches_committed_tokens_every_round(shared_engine, heldout_prompts):
    """Replaying kv events up to each round: committed slots == tokens with KV (emitted minus the seed)."""
    for mode in MODES:
        tracer = RecordingTracer()
        shared_engine.generate(heldout_prompts[3], mode, {"max_new_tokens": 48}, tracer=tracer)
        prompt_len = len(tracer.events[0]["prompt_ids"])
        emitted, done = 0, []
        for i, e in enumerate(tracer.events):
            if e["type"] == "round":
                emitted += len(e["committed"])
                _, committed = replay_kv(tracer.events[:i + 1])
                done.append((prompt_len + emitted) - len(committed))
        assert set(done[:-1]) <= {0, 1}, (mode, done)


@pytest.mark.slow
def test_runs_ending_at_eos_mid_block_free_everything(shared_engine, heldout_prompts):
    ends = []
    for prompt in heldout_prompts[:12]:
        res = shared_engine.generate(prompt, "block_diffusion", {"max_new_tokens": 64, "block_size": 32})
        ends.append(len(res.output_ids) < 64)
        assert res.metrics["kv_leaked"] == 0
    assert any(ends), "no run stopped at EOS before max_new_tokens"
    assert shared_engine.rt.pool.used == 0


@pytest.mark.parametrize("mode", MODES)
def test_cancel_between_rounds_frees_the_pool(shared_engine, mode):
    events, cancel = [], threading.Event()
    code = "import os\n\n\ndef main(argv):\n    "              # raw code: a long answer, no early EOS
    for e in shared_engine.stream(code, mode, {"max_new_tokens": 200, "raw": True}, cancel=cancel):
        events.append(e)
        if e["type"] == "round" and e["round"] == 2:
            cancel.set()
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "cancelled"
    frees = [e for e in unfold(events) if e["type"] == "kv" and e["op"] == "free"]
    assert frees and frees[-1]["reason"] == "cancelled"
    assert replay_kv(events) == (set(), [])
    assert shared_engine.rt.pool.used == 0


@pytest.mark.parametrize("mode", MODES)
def test_tracing_does_not_change_tokens(shared_engine, heldout_prompts, mode):
    for prompt in heldout_prompts[:4]:
        off = shared_engine.generate(prompt, mode, {"max_new_tokens": 32})
        on = shared_engine.generate(prompt, mode, {"max_new_tokens": 32}, tracer=RecordingTracer())
        assert off.output_ids == on.output_ids


def test_a_tracer_that_does_not_keep_hands_on_the_same_events(shared_engine, heldout_prompts):
    """keep=False (the server's and the engine process's tracers): the sink sees every event, densely numbered,
    as a keeping tracer records them; nothing is held in the tracer, and it knows when the run has ended."""
    kept, seen = RecordingTracer(), []
    loose = RecordingTracer(sink=seen.append, keep=False)
    for tracer in (kept, loose):
        shared_engine.generate(heldout_prompts[0], "ar", {"max_new_tokens": 24}, tracer=tracer)
    assert loose.events == [] and loose.ended and loose.seq == len(unfold(seen))
    assert [e["seq"] for e in unfold(seen)] == list(range(len(unfold(seen))))
    drop = ("run_id", "t_ms", "phases", "metrics", "slots")   # the pool hands the second run other slots
    assert [{k: v for k, v in e.items() if k not in drop} for e in unfold(seen)] == \
        [{k: v for k, v in e.items() if k not in drop} for e in unfold(kept.events)]


@pytest.mark.parametrize("mode", MODES)
def test_events_held_for_a_whole_run_equal_events_made_at_once(loaded, heldout_prompts, mode):
    """A recording tracer makes rounds and KV operations in batches from what it took when they happened: what it
    took must not change in between (a mode reusing a list it handed over would show here)."""
    def events(hold_s: float) -> list[dict]:
        tracer = RecordingTracer(hold_s=hold_s)
        Engine(loaded, num_slots=1024).generate(heldout_prompts[1], mode, {"max_new_tokens": 40, "raw": True},
                                                 tracer=tracer)
        return [{k: v for k, v in e.items() if k not in ("run_id", "t_ms", "metrics", "engine")}
                | {"phases": [{k: v for k, v in p.items() if k != "ms"} for p in e.get("phases", [])]}
                for e in unfold(tracer.events)]

    at_once, held = events(0.0), events(float("inf"))
    assert sum(e["type"] == "round" for e in at_once) > 2
    assert held == at_once


def test_concurrent_requests_in_mixed_modes_match_solo_runs(shared_engine, heldout_prompts):
    jobs = [(heldout_prompts[i], m) for i, m in enumerate(["ar", "block_diffusion", "linear_spec", "ar"])]
    params = {"max_new_tokens": 40}
    solo = [shared_engine.generate(p, m, params).output_ids for p, m in jobs]
    reqs = [shared_engine.new_request(p, m, params) for p, m in jobs]
    together = shared_engine.run(reqs)
    assert [r.output_ids for r in together] == solo
    assert shared_engine.rt.pool.used == 0


def test_block_size_tiers_follow_running_count(loaded, heldout_prompts):
    eng = Engine(loaded, num_slots=4096, tiers=[(1, 16), (64, 8)], check_invariants=True)
    tracer = RecordingTracer()
    eng.generate(heldout_prompts[0], "block_diffusion", {"max_new_tokens": 24}, tracer=tracer)
    assert tracer.events[0]["block_size_tiers"] == [[1, 16], [64, 8]]
    rounds = [e for e in tracer.events if e["type"] == "round" and e["round"] > 0]
    assert {e["block_size"] for e in rounds} == {16}
    assert all(len(e["tokens"]) - (e["states"][-1] == "bonus") <= 16 for e in rounds)
    tracers = [RecordingTracer() for _ in range(3)]
    eng.run([eng.new_request(p, "block_diffusion", {"max_new_tokens": 24}, t)
             for p, t in zip(heldout_prompts, tracers, strict=False)])
    sizes = {e["block_size"] for t in tracers for e in t.events if e["type"] == "round" and e["round"] > 0}
    assert 8 in sizes


def test_kv_is_sized_for_the_largest_tier(loaded, heldout_prompts):
    """A request's own block_size is smaller than the tier it gets: admission reserves the tier's block."""
    eng = Engine(loaded, num_slots=4096, tiers=[(9999, 32)], check_invariants=True)
    tracers = [RecordingTracer() for _ in range(4)]
    results = eng.run([eng.new_request(p, "linear_spec", {"max_new_tokens": 40, "block_size": 4,
                                                                  "verify": "fixed"}, t)
                       for p, t in zip(heldout_prompts, tracers, strict=False)])
    assert all(r.status == "done" for r in results), [r.error for r in results]
    assert {e["block_size"] for t in tracers for e in t.events if e["type"] == "round" and e["round"] > 0} == {32}
    assert eng.rt.pool.used == 0


@pytest.mark.parametrize("tiers,needle", [
    ([(1, 32), (4, 16)], "catch-all"),
    ([(4, 32), (4, 16), (9999, 8)], "distinct"),
    ([(1, 1), (9999, 8)], "block sizes"),
])
def test_bad_tier_tables_are_refused(loaded, tiers, needle):
    with pytest.raises(ParamError, match=needle):
        Engine(loaded, num_slots=64, tiers=tiers)


def test_tier_strings_parse_and_validate():
    assert parse_tiers("1:32, 4:16,9999:8") == [(1, 32), (4, 16), (9999, 8)]
    with pytest.raises(ParamError, match="1:32,4:16"):
        parse_tiers("1-32")
    with pytest.raises(ParamError, match="catch-all"):
        parse_tiers("1:32")


@pytest.mark.parametrize("mode", MODES)
def test_sampling_is_seeded(shared_engine, heldout_prompts, mode):
    p = {"max_new_tokens": 24, "temperature": 0.8, "seed": 7}
    a = shared_engine.generate(heldout_prompts[1], mode, p)
    b = shared_engine.generate(heldout_prompts[1], mode, p)
    assert a.status == "done" and a.output_ids == b.output_ids


@pytest.mark.parametrize("mode", MODES)
def test_a_temperature_near_zero_runs(shared_engine, heldout_prompts, mode):
    """T = 1.2e-38 (logits / T overflow float32): no NaN probabilities, a done run of the asked length; `ar`'s draw
    is the argmax, so its tokens are greedy's."""
    p = {"max_new_tokens": 12, "temperature": 1.2e-38}
    tiny = shared_engine.generate(heldout_prompts[2], mode, p)
    assert tiny.status == "done" and tiny.error is None and tiny.output_ids, tiny.error
    if mode == "ar":
        assert tiny.output_ids == shared_engine.generate(heldout_prompts[2], mode, {"max_new_tokens": 12}).output_ids


@pytest.mark.parametrize("mode,params,needle", [
    ("nope", {}, "unknown mode 'nope'"),
    ("block_diffusion", {"block_size": 0}, "block_size"),
    ("block_diffusion", {"block_size": 5000}, "block_size"),
    ("block_diffusion", {"threshold": 1.5}, "threshold"),
    ("block_diffusion", {"threshold": -0.1}, "threshold"),
    ("linear_spec", {"max_new_tokens": 0}, "max_new_tokens"),
    ("linear_spec", {"max_new_tokens": 1000}, "max_new_tokens"),
    ("ar", {"temperature": "hot"}, "temperature"),
    ("ar", {"bogus": 1}, "bogus"),
    ("block_diffusion", {"block_size": 32, "sub_block": 5}, "sub_block"),
    ("specfold", {"backend": "cuda"}, "backend must be one of \\['torch', 'triton'\\]"),
    ("specfold", {"backend": 1}, "backend"),
])
def test_bad_parameters_name_the_parameter(shared_engine, mode, params, needle):
    with pytest.raises(ParamError, match=needle):
        shared_engine.generate("What is 1 + 2?", mode, params)
    assert shared_engine.rt.pool.used == 0 and not shared_engine.scheduler.has_work


def test_bad_prompts(shared_engine):
    with pytest.raises(ParamError, match="prompt is empty"):
        shared_engine.generate("   ", "ar")
    with pytest.raises(ParamError, match="context"):
        shared_engine.generate("word " * 2000, "ar")
    assert shared_engine.rt.pool.used == 0


def test_a_model_without_a_chat_template_reads_one_message_as_text(shared_engine, monkeypatch):
    """A model folder with no chat template (a base model): a one-message conversation is its text, as a prompt
    string is; a longer conversation gets a clear error, and raw=true still wants a string."""
    monkeypatch.setattr(shared_engine.rt.tokenizer, "chat_template", None)
    one = [{"role": "user", "content": "Reverse: a b c"}]
    as_text = shared_engine.render("Reverse: a b c", raw=False)
    assert shared_engine.render(one, raw=False) == as_text == one[0]["content"]
    with pytest.raises(ParamError, match="no chat template"):
        shared_engine.render([*one, {"role": "assistant", "content": "c b a"}, *one], raw=False)
    with pytest.raises(ParamError, match="no chat template"):
        shared_engine.render(one, raw=True)
