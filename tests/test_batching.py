"""Every mode's rounds share forwards with whatever else runs, and sharing changes no run: N = 1, 4 and 16
concurrent requests of every registered mode, with their default and other parameters, each give the tokens, NFE
and rounds it gives alone; speculative rounds really share (`batch_requests` > 1 in their phases); no KV slot is
left held. On both forward backends (`--forward fused`, the C step, and `--forward torch`, the batch-invariant
torch forward a GPU runs), on the tiny model, and on SmolLM2 with its adapter (its shipped draft graph covers
spiffy and specfold)."""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import get_mode, mode_names
from specscope.backend.tracing import RecordingTracer
from specscope.kernels.native import library

FORWARDS = ("fused", "torch")


@pytest.fixture(scope="module")
def _torch_engine(loaded) -> Engine:
    return Engine(loaded, num_slots=4096, check_invariants=True, forward="torch")


@pytest.fixture(params=FORWARDS)
def forward_engine(request, shared_engine, _torch_engine) -> Iterator[Engine]:
    """The tiny model's engine on each forward backend (each module-wide; each test leaves it as it found it)."""
    engine = shared_engine if request.param == "fused" else _torch_engine
    assert engine.rt.backend_name == request.param
    yield engine
    assert engine.rt.pool.used == 0 and not engine.scheduler.has_work


@pytest.fixture(scope="module")
def smollm_loaded():
    """The default model with its shipped adapter (and draft graph), as `specscope serve` loads it."""
    from specscope.backend.model.checkpoint import load_checkpoint
    from specscope.backend.model.source import resolve
    source = resolve(None)
    return load_checkpoint(source.folder, adapter=source.adapter, name=source.name)


@pytest.fixture(scope="module")
def smollm_engines() -> dict[str, Engine]:
    """An engine of the default model per forward backend, made when first asked for."""
    return {}


@pytest.fixture
def smollm_engine(smollm_engines, smollm_loaded, request) -> Engine:
    forward = getattr(request, "param", "fused")
    if forward not in smollm_engines:
        smollm_engines[forward] = Engine(smollm_loaded, num_slots=16384, check_invariants=True, forward=forward)
    return smollm_engines[forward]


def other_params(mode: str) -> dict:
    """Valid values other than the defaults: every numeric parameter halfway to its minimum."""
    return {p.name: p.type((p.min + p.default) / 2) for p in get_mode(mode).params
            if p.type in (int, float) and p.min is not None and p.min != p.default}


def mix(n: int, prompts: list[str], max_new_tokens: int) -> list[tuple[str, str, dict]]:
    """n requests that cycle through every mode at its defaults, then at other parameters, over the prompts."""
    kinds = [(m, {}) for m in mode_names()] + [(m, other_params(m)) for m in mode_names()]
    return [(prompts[i % len(prompts)], mode, {"max_new_tokens": max_new_tokens, **params})
            for i, (mode, params) in zip(range(n), itertools.cycle(kinds), strict=False)]


def story(result, tracer: RecordingTracer) -> tuple:
    """What must not depend on what shares the run's forwards: tokens, NFE, and every round's cells and commits."""
    rounds = [(e["tokens"], e["states"], e["committed"], e["nfe"]) for e in tracer.events if e["type"] == "round"]
    return result.status, result.output_ids, result.metrics["nfe"], rounds


def shared_phases(tracer: RecordingTracer) -> list[dict]:
    return [p for e in tracer.events if e["type"] == "round" for p in e["phases"] if p["batch_requests"] > 1]


def check_sharing(engine: Engine, requests: list[tuple[str, str, dict]]) -> list[dict]:
    """Each request alone, then all at once: the same story; returns the phases that shared a forward."""
    alone = []
    for prompt, mode, params in requests:
        tracer = RecordingTracer()
        alone.append(story(engine.generate(prompt, mode, params, tracer=tracer), tracer))
    tracers = [RecordingTracer() for _ in requests]
    together = engine.run([engine.new_request(prompt, mode, params, t)
                           for (prompt, mode, params), t in zip(requests, tracers, strict=True)])
    for (prompt, mode, params), solo, res, t in zip(requests, alone, together, tracers, strict=True):
        assert story(res, t) == solo, (mode, params, prompt)
        assert res.metrics["kv_leaked"] == 0
    assert engine.rt.pool.used == 0
    return [{**p, "mode": mode} for (_, mode, _), t in zip(requests, tracers, strict=True) for p in shared_phases(t)]


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 4, 16])
def test_concurrent_mixed_modes_run_as_they_do_alone_and_share_forwards(forward_engine, heldout_prompts, n):
    shared = check_sharing(forward_engine, mix(n, heldout_prompts, 20))
    if n == 1:
        assert shared == []
        return
    assert {p["mode"] for p in shared} >= ({"ar", "isd"} if n == 4 else {"ar", "isd", "linear_spec", "quadratic"})
    if n == 16 and forward_engine.rt.backend_name == "torch":
        # branched verifies join others' rows too (on the fused step spiffy's 8 branches of 32 rows run alone)
        assert "spiffy" in {p["mode"] for p in shared}
    for p in shared:
        assert p["batch_rows"] >= p["n_query"] + p["batch_requests"] - 1 and p["forward_id"] > 0


@pytest.fixture(scope="module")
def integer_engines(loaded) -> dict[str, Engine]:
    """The tiny model with integer matmuls (its float16 weights rounded to Q8_0 blocks, rows to 16-bit or int8
    blocks), an engine per precision, made when first asked for."""
    if library() is None:
        pytest.skip("no C build of the kernels")
    return {}


@pytest.mark.slow
@pytest.mark.parametrize(("matmul", "n"), [("int16", 1), ("int16", 4), ("int16", 16), ("int8", 1), ("int8", 4)])
def test_concurrent_mixed_modes_in_integer_matmuls_run_as_they_do_alone(integer_engines, loaded, heldout_prompts,
                                                                         matmul, n):
    """The same with integer matmuls: exact integer sums make a row's numbers those it has alone, whatever shares
    its forward (16 requests in int16, auto's integer precision; int8, whose kernel is the same, at 1 and 4)."""
    if matmul not in integer_engines:
        integer_engines[matmul] = Engine(loaded, num_slots=4096, check_invariants=True, matmul=matmul)
    shared = check_sharing(integer_engines[matmul], mix(n, heldout_prompts, 20))
    assert (n == 1) == (shared == [])


def test_the_phases_of_one_forward_share_its_id_and_its_counts(forward_engine, heldout_prompts):
    """A forward that served several requests is one forward in every one of their traces."""
    requests = [(heldout_prompts[i], "isd", {"max_new_tokens": 8}) for i in range(3)]
    tracers = [RecordingTracer() for _ in requests]
    forward_engine.run([forward_engine.new_request(p, m, q, t)
                        for (p, m, q), t in zip(requests, tracers, strict=True)])
    by_forward: dict[int, list[dict]] = {}
    for t in tracers:
        for e in t.events:
            for p in e.get("phases", []) if e["type"] == "round" else []:
                by_forward.setdefault(p["forward_id"], []).append(p)
    shared = [ps for ps in by_forward.values() if len(ps) > 1]
    assert shared, "three isd requests of one shape never shared a verify"
    for phases in shared:
        assert len(phases) == phases[0]["batch_requests"] >= 2
        assert phases[0]["batch_rows"] == sum(p["n_query"] for p in phases)


def test_causal_rows_and_blocks_of_other_widths_share_one_forward(forward_engine, heldout_prompts):
    """Attention switches inside a forward: ar's causal decode row and block_diffusion's bidirectional blocks of
    two widths run in one forward, and each run's tokens, NFE and rounds are those it gives alone."""
    requests = [(heldout_prompts[0], "ar", {"max_new_tokens": 12}),
                (heldout_prompts[1], "block_diffusion", {"max_new_tokens": 12, "block_size": 4}),
                (heldout_prompts[2], "block_diffusion", {"max_new_tokens": 12, "block_size": 8})]
    by_forward: dict[int, list[dict]] = {}
    for p in check_sharing(forward_engine, requests):
        by_forward.setdefault(p["forward_id"], []).append(p)
    mixed = [ps for ps in by_forward.values() if {p["attn"] for p in ps} == {"causal", "block"}]
    widths = [ps for ps in by_forward.values() if len({p["n_query"] for p in ps if p["attn"] == "block"}) == 2]
    assert mixed and widths, by_forward
    assert all(ps[0]["batch_rows"] == sum(p["n_query"] for p in ps) for ps in mixed + widths)


def test_branched_verifies_share_forwards_with_other_rows(forward_engine, heldout_prompts):
    """spiffy's branched verify (several states of a block over one prefix, a row group each) packs beside other
    runs' rows and beside another spiffy run's states, on the fused step where its states fit the step (blocks of 8
    here) as on the torch forward, and every run gives what it gives alone."""
    requests = [(heldout_prompts[3], "spiffy", {"max_new_tokens": 12, "block_size": 8, "branches": 2}),
                (heldout_prompts[4], "spiffy", {"max_new_tokens": 12, "block_size": 8, "branches": 1}),
                (heldout_prompts[5], "isd", {"max_new_tokens": 12})]
    shared = check_sharing(forward_engine, requests)
    with_spiffy = {p["forward_id"] for p in shared if p["mode"] == "spiffy" and p["kind"] == "verify"}
    assert with_spiffy
    assert {p["mode"] for p in shared if p["forward_id"] in with_spiffy} == {"spiffy", "isd"}


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize(("smollm_engine", "n"), [
    ("fused", 1), ("fused", 4), pytest.param("fused", 16, marks=pytest.mark.extended),
    *(pytest.param("torch", n, marks=pytest.mark.extended) for n in (1, 4, 16))], indirect=["smollm_engine"])
def test_concurrent_mixed_modes_on_the_default_model(smollm_engine, n):
    """16 requests on SmolLM2 take minutes on two cores, and the torch forward pays for whole tiles of rows: those
    are extended tests (`make test-all`)."""
    prompts = ["What is the capital of France?", "Write a haiku about rivers.", "List three fruits.",
               "Explain what a CPU does in one sentence."]
    shared = check_sharing(smollm_engine, mix(n, prompts, 12))
    assert (n == 1) == (shared == [])
