"""The fused step's bf16 matmuls on AMX tiles (kernels/cpu_amx.c, `--matmul bf16`).

On a CPU with AMX: against the eager forward (within bfloat16 rounding), every row of a forward equal bit for bit
to a lone decode step at its position, whatever the rows (across the 16-row tile) and threads, the Q4_1 layout equal
to plain bfloat16 bit for bit, the adapter in bf16 dot products, and the engine's lossless modes equal to `ar` in this
precision with working drafters. Anywhere: asking for bf16 where it cannot run is a clear error, never a silent
float32 step.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support.plans import forward
from test_cpu_decode import (
    CONFIGS,
    SPLIT_CFG,
    assert_chunk_rows_are_lone_steps,
    batch,
    filled_cache,
    gguf_model,
    logits_at_1_and_2_threads,
    random_model,
    with_adapter,
)

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.lossless import Outcome, claim_of, verdict
from specscope.backend.engine.modes import REGISTRY, mode_names
from specscope.backend.forward import fused_step, weight_blocks
from specscope.backend.forward.fused_step import FusedDecode, MatmulUnavailable, fused_decode
from specscope.backend.model.transformer import KVContext, PagedKV
from specscope.backend.tracing import RecordingTracer
from specscope.kernels.native import library

LOSSLESS = [m for m in mode_names() if REGISTRY[m].lossless_vs]   # mode_names() loads every mode first

pytestmark = pytest.mark.usefixtures("one_thread")
CFG = CONFIGS["qwen3"]   # every output a multiple of 16 and every input of 32: the AMX formats' shapes


@pytest.fixture(scope="module")
def lib():
    built = library()
    if built is None or not built.amx_bf16_ready():
        pytest.skip("this CPU has no AMX bfloat16 tiles")
    return built


def test_bf16_tiles_are_the_eager_forward_within_bfloat16_rounding(lib):
    """Decode steps and a verify chunk, padded rows: the eager forward of the bfloat16-rounded weights, to within
    what rounding each linear's input to bfloat16 costs; the K/V written where asked."""
    model = random_model(CFG, torch.bfloat16)     # weights bfloat16 already: only the rows are rounded
    fused = FusedDecode(model, lib, matmul="bf16")
    assert (fused.format, fused.head_format) == ("amx_bf16", "amx_bf16")
    for lengths, queries in (([7], 1), ([12, 3, 0, 9], 1), ([9], 5), ([5, 8], 3)):
        ids, positions, prefix, valid, write = batch(lengths, queries, CFG.vocab_size)
        padded = valid if len(set(lengths)) > 1 else None
        eager_cache, fused_cache = filled_cache(CFG), filled_cache(CFG)
        with torch.inference_mode():
            want = model(ids, positions, kv=KVContext(eager_cache, prefix, padded, write))
            got = forward(fused, ids, positions, kv=KVContext(fused_cache, prefix, padded, write))
        scale = want.abs().max().item()
        assert 0 < (got - want).abs().max().item() <= 2e-2 * scale, (lengths, queries)
        written = write.view(-1)
        assert torch.allclose(fused_cache.k[:, written], eager_cache.k[:, written], rtol=0.05, atol=0.05)


@pytest.mark.parametrize("queries", [5, 16, 21, 40])
def test_a_chunk_row_is_the_decode_step_at_its_position(lib, queries):
    """A causal chunk of 5, 16, 21 or 40 rows (past one tile of 16; past the float32 step's MAX_CHUNK, as a prompt's
    prefill) gives, row for row, the numbers of lone 1-row steps bit for bit: what keeps the lossless modes equal to
    `ar` with bf16 matmuls."""
    fused = FusedDecode(with_adapter(random_model(CFG, torch.float32), rank=16), lib, matmul="bf16")
    assert_chunk_rows_are_lone_steps(fused, CFG, queries, adapted=True)


def test_threads_split_outputs_not_sums(lib):
    """Two threads split the tiles' outputs and the adapted rows: the same logits as one thread, bit for bit (a model
    whose head and FFN are big enough for amx_linear's parallel region)."""
    fused = FusedDecode(with_adapter(random_model(SPLIT_CFG, torch.float32), rank=16), lib, matmul="bf16")
    one, two = logits_at_1_and_2_threads(fused, [20, 31], 6, adapted_every=2)
    assert torch.equal(one, two)


def test_q4_1_blocks_widen_to_the_bfloat16_weights(lib, monkeypatch):
    """GGUF Q4_1 projections stream as blocks and widen in registers to the very bfloat16 values the plain layout
    holds: the same logits bit for bit, at 1 row and past a tile."""
    model = gguf_model(CFG)
    blocks = FusedDecode(model, lib, matmul="bf16")
    assert (blocks.format, blocks.head_format) == ("amx_q4_1", "amx_bf16")
    monkeypatch.setattr(weight_blocks, "PACKERS", {})
    plain = FusedDecode(model, lib, matmul="bf16")
    assert plain.format == "amx_bf16"
    for lengths, queries in (([7], 1), ([9], 18)):
        ids, positions, prefix, _, write = batch(lengths, queries, CFG.vocab_size)
        with torch.inference_mode():
            got = forward(blocks, ids, positions, kv=KVContext(filled_cache(CFG), prefix, None, write))
            want = forward(plain, ids, positions, kv=KVContext(filled_cache(CFG), prefix, None, write))
        assert torch.equal(got, want)


def test_adapter_rows_in_bf16(lib):
    """A rank-16 LoRA on at some rows: those rows are the eager adapted forward within bfloat16 rounding, and the
    others are the tiles' own numbers without the adapter, bit for bit."""
    model = with_adapter(random_model(CFG, torch.bfloat16), rank=16)
    fused = FusedDecode(model, lib, matmul="bf16")
    assert fused.lora is not None
    ids, positions, prefix, _, write = batch([7], 5, CFG.vocab_size)
    some = torch.tensor([[False, True, True, False, True]])
    with torch.inference_mode():
        want = model(ids, positions, kv=KVContext(filled_cache(CFG), prefix, None, write), lora=some)
        got = forward(fused, ids, positions, kv=KVContext(filled_cache(CFG), prefix, None, write), lora=some)
        plain = forward(fused, ids, positions, kv=KVContext(filled_cache(CFG), prefix, None, write))
    assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()
    assert torch.equal(got[0, 0], plain[0, 0])        # before any adapted row
    assert not torch.allclose(got[0, 1], plain[0, 1], atol=1e-3)


def test_lossless_modes_equal_ar_with_bf16_matmuls(lib, loaded, heldout_prompts):
    """On the tiny model with bf16 matmuls, every lossless mode gives its reference mode's tokens on held-out prompts
    (spiffy's 8 x 32-row branch forwards on tiles too), its drafter working, and its KV invariants hold."""
    engine = Engine(loaded, num_slots=4096, check_invariants=True, matmul="bf16")
    assert engine.rt.backend.format == "amx_bf16"
    exact = Engine(loaded, num_slots=4096)
    prompts = heldout_prompts[::4]
    ar = [engine.generate(p, "ar", {"max_new_tokens": 24}) for p in prompts]
    agree = sum(a.output_ids == b.output_ids for a, b in zip(ar, [exact.generate(p, "ar", {"max_new_tokens": 24})
                                                                for p in prompts], strict=True))
    assert agree >= len(prompts) - 1    # bfloat16 rounding may flip a near tie, rarely
    for mode in LOSSLESS:
        cls, claim = REGISTRY[mode], claim_of(mode)
        params = {"max_new_tokens": 24, **cls.lossless_params}
        runs = [engine.generate(p, mode, params) for p in prompts]
        ref = ar if cls.lossless_vs == "ar" else [engine.generate(p, cls.lossless_vs, {"max_new_tokens": 24})
                                                  for p in prompts]
        found = [verdict(Outcome(mode, r.output_ids, params), Outcome(b.mode, b.output_ids, {"max_new_tokens": 24}),
                         claim) for r, b in zip(runs, ref, strict=True)]
        assert all(v.holds for v in found), (mode, [v.blockers or v.first_difference for v in found])
        if not cls.lossless_params:
            metric, minimum = cls.drafter
            assert sum(r.metrics[metric] or 0.0 for r in runs) / len(runs) >= minimum, mode
    assert engine.rt.pool.free_count == engine.rt.pool.num_slots


def test_bf16_where_it_cannot_run_is_an_error(monkeypatch):
    """No AMX (or no C build): asking for bf16 matmuls raises with the reason instead of running float32."""
    model = random_model(CFG, torch.float32)
    cache = PagedKV.empty(CFG, 4, torch.float32, "cpu")
    monkeypatch.setattr(fused_step, "library", lambda: SimpleNamespace(amx_bf16_ready=lambda: 0))
    with pytest.raises(MatmulUnavailable, match="no AMX"):
        fused_decode(model, cache, matmul="bf16")
    with pytest.raises(MatmulUnavailable, match="expected one of"):
        fused_decode(model, cache, matmul="int4")
    odd = random_model(CONFIGS["odd-biased"], torch.float32)
    monkeypatch.setattr(fused_step, "library", lambda: SimpleNamespace(amx_bf16_ready=lambda: 1))
    with pytest.raises(MatmulUnavailable, match="multiple of 16"):
        fused_decode(odd, PagedKV.empty(CONFIGS["odd-biased"], 4, torch.float32, "cpu"), matmul="bf16")



def test_auto_takes_bf16_only_where_it_can_run(monkeypatch):
    """matmul="auto" (the command line's default) is bf16 where AMX tiles can run the model, else (for these weights,
    which are no GGUF blocks) float32, never an error; the fused step says which it took."""
    built = library()
    if built is None:
        pytest.skip("no C build")
    model, cache = random_model(CFG, torch.float32), PagedKV.empty(CFG, 4, torch.float32, "cpu")
    assert fused_decode(model, cache, matmul="auto").matmul == ("bf16" if built.amx_bf16_ready() else "float32")
    odd = random_model(CONFIGS["odd-biased"], torch.float32)
    step = fused_decode(odd, PagedKV.empty(CONFIGS["odd-biased"], 4, torch.float32, "cpu"), matmul="auto")
    assert step is not None and step.matmul == "float32"    # shapes the tiles cannot take
    monkeypatch.setattr(fused_step, "amx_unsupported", lambda model, lib: "no AMX here")
    assert fused_decode(model, cache, matmul="auto").matmul == "float32"


def test_a_run_records_its_matmul_precision(loaded):
    """run_start says which precision the run's matmuls had: its tokens depend on it."""
    engine = Engine(loaded, num_slots=256, matmul="auto")
    tracer = RecordingTracer()
    engine.generate("What is 12 + 30?", "ar", {"max_new_tokens": 2}, tracer)
    assert tracer.events[0]["matmul"] == engine.rt.matmul
    assert engine.rt.matmul == getattr(engine.rt.backend, "matmul", "float32")
    assert Engine(loaded, num_slots=256).rt.matmul == "float32"
