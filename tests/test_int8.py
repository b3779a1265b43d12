"""The fused step's integer matmuls (kernels/cpu_int8.c, `--matmul int8` and `--matmul int16`).

Each vector ISA the CPU has (the others skip with the reason), rows in int8 (one plane of codes) and in 16-bit codes
(two int8 planes): the linear is the product of the rounded rows with the GGUF weights (checked against PyTorch's
float64 product of the same rounded values, and against gguf-py's own Q8_0 rounding of the rows), every ISA gives the
same numbers bit for bit, and a row's numbers are the same alone or among up to 16 other rows, at 1 or 2 threads.
Through the whole step: within rounding of the float32 step, a chunk row equal to the lone decode step at its
position, and the engine's lossless modes equal to `ar` in each precision with working drafters. Asking for an
integer precision where it cannot run is a clear error.
"""
from __future__ import annotations

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
    gguf_values,
    random_model,
    with_adapter,
)

from specscope.backend.engine.engine import Engine, run_matmul
from specscope.backend.engine.lossless import Outcome, claim_of, verdict
from specscope.backend.engine.modes import REGISTRY, mode_names
from specscope.backend.forward import fused_step
from specscope.backend.forward.fused_step import (
    INT8_ISAS,
    INTEGER_MATMULS,
    FusedDecode,
    MatmulUnavailable,
    fused_decode,
)
from specscope.backend.forward.weight_blocks import FORMATS, pack_int8
from specscope.backend.model.transformer import KVContext, PagedKV
from specscope.backend.tracing import RecordingTracer
from specscope.kernels.native import library, ptr

pytestmark = pytest.mark.usefixtures("one_thread")
CFG = CONFIGS["qwen3"]    # inputs a multiple of 32; outputs of 96 and 160, one and a half groups of 16 past 64


def built():
    lib = library()
    if lib is None:
        pytest.skip("no C build of the kernels")
    return lib


@pytest.fixture(scope="module", params=INT8_ISAS)
def isa(request) -> str:
    """Each int8 ISA, skipped where this CPU lacks it."""
    if not built().int8_isa_ready(INT8_ISAS.index(request.param)):
        pytest.skip(f"this CPU has no {request.param} (the path is compiled, not run)")
    return request.param


def int8_linear(lib, isa: str, weight: torch.Tensor, x: torch.Tensor, planes: int = 1) -> torch.Tensor:
    """y = x w^T through cpu_int8.c's int8_linear, the weight packed by pack_int8, the rows in `planes` planes."""
    packed = pack_int8([weight])
    rows, out, inn = x.shape[0], weight.shape[0], weight.shape[1]
    y = torch.full((rows, out), float("nan"))
    scratch = torch.empty(2 * rows * inn + rows * inn // 32 * 12 + 64, dtype=torch.uint8)
    lib.int8_linear(INT8_ISAS.index(isa), planes, ptr(packed.copies[0]), FORMATS.index(packed.format), out, inn,
                    ptr(x.contiguous()), inn, ptr(y), out, rows, ptr(scratch))
    return y


LARGEST_CODE = {1: 127, 2: 32258}
"""The largest code of a row's block, by planes: int8, or 16-bit codes 254 * high + low."""


def rounded_rows(x: torch.Tensor, planes: int = 1) -> torch.Tensor:
    """x rounded as the kernel rounds each block of 32: codes round(x * L / max|x|), scale max|x| / L."""
    largest = LARGEST_CODE[planes]
    blocks = x.reshape(x.shape[0], -1, 32)
    top = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(top > 0, largest / torch.where(top > 0, top, 1), 0)
    return (torch.round(blocks * inv).clamp(-largest, largest) * (top / largest)).reshape(x.shape)


@pytest.mark.parametrize("planes", [1, 2])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_linear_is_the_product_of_the_rounded_rows(isa, kind, planes):
    """Outputs past a group of 16 (40), rows past a tile (11), a row with an outlier: the float64 product of the
    rows as the kernel rounds them (in int8: gguf-py's Q8_0 rounding of the rows but for float16 scales) and the
    GGUF weight, to float32 rounding; every ISA equal to plain C bit for bit; 16-bit rows far closer to float32."""
    lib = built()
    torch.manual_seed(0)
    weight, x = gguf_values(0.1 * torch.randn(40, 96), kind), torch.randn(11, 96)
    x[3, 7] = 40.0
    got = int8_linear(lib, isa, weight, x, planes)
    want = rounded_rows(x, planes).double() @ weight.double().t()
    assert (got.double() - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    if planes == 1:
        close_to_gguf = rounded_rows(x) - gguf_values(x, "Q8_0")
        assert close_to_gguf.abs().max().item() <= 2e-3 * x.abs().max().item()
    assert torch.equal(got, int8_linear(lib, "scalar", weight, x, planes))
    float32 = x @ weight.t()
    error = (got - float32).abs().max().item() / float32.abs().max().item()
    assert 0 < error <= (2e-2 if planes == 1 else 2e-4)


@pytest.mark.parametrize("planes", [1, 2])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_a_row_is_the_same_alone_or_among_others(isa, kind, planes):
    """A row's outputs alone, and as row k of batches of 2 to 16 other random rows (at 1 and 2 threads): bitwise."""
    lib = built()
    torch.manual_seed(1)
    weight = gguf_values(0.1 * torch.randn(1536, 576), kind)   # the default model's FFN: a parallel region
    row = torch.randn(1, 576)
    alone = int8_linear(lib, isa, weight, row, planes)
    g = torch.Generator().manual_seed(2)
    for rows in (2, 3, 5, 8, 9, 16):
        at = int(torch.randint(0, rows, (1,), generator=g))
        others = 3 * torch.randn(rows, 576, generator=g)
        others[at] = row[0]
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(int8_linear(lib, isa, weight, others, planes)[at], alone[0]), (rows, at, threads)
    torch.set_num_threads(1)


@pytest.mark.parametrize("matmul", INTEGER_MATMULS)
def test_the_whole_step_is_the_same_on_every_isa_and_within_rounding_of_float32(matmul):
    """A GGUF-like model (Q4_1 projections, a Q8_0 tied head with an odd MASK row): integer steps of 1 and 5 rows
    give the same logits on every ISA this CPU has, within the precision's rounding of the float32 step's."""
    lib = built()
    model = gguf_model(CFG)
    exact = FusedDecode(model, lib)
    steps = {isa: FusedDecode(model, lib, matmul=matmul, isa=isa) for isa in INT8_ISAS
             if lib.int8_isa_ready(INT8_ISAS.index(isa))}
    assert {(s.format, s.head_format) for s in steps.values()} == {("i8_q4_1", "i8_q8_0")}
    for lengths, queries in (([7], 1), ([9], 5), ([12, 3], 1)):
        ids, positions, prefix, valid, write = batch(lengths, queries, CFG.vocab_size)
        ids[0, 0] = 5       # the odd head row's token
        padded = valid if len(set(lengths)) > 1 else None
        with torch.inference_mode():
            want = forward(exact, ids, positions, kv=KVContext(filled_cache(CFG), prefix, padded, write))
            got = {isa: forward(s, ids, positions, kv=KVContext(filled_cache(CFG), prefix, padded, write))
                   for isa, s in steps.items()}
        for isa, logits in got.items():
            assert torch.equal(logits, got["scalar"]), isa
        scale = want.abs().max().item()
        assert 0 < (got["scalar"] - want).abs().max().item() <= (5e-2 if matmul == "int8" else 1e-3) * scale


@pytest.mark.parametrize("matmul", INTEGER_MATMULS)
@pytest.mark.parametrize("queries", [5, 16, 40])
def test_a_chunk_row_is_the_decode_step_at_its_position(isa, queries, matmul):
    """A causal chunk of 5, 16 or 40 rows (past the float32 step's MAX_CHUNK, as a prefill) gives, row for row, the
    numbers of lone 1-row steps bit for bit, the adapter on at some rows: what keeps the lossless modes equal to
    `ar` in int8. On a model of float32 weights, which the int8 precision rounds to Q8_0."""
    fused = FusedDecode(with_adapter(random_model(CFG, torch.float32), rank=4), built(), matmul=matmul, isa=isa)
    assert fused.format == "i8_q8_0"
    assert_chunk_rows_are_lone_steps(fused, CFG, queries, adapted=True)


@pytest.mark.parametrize("matmul", INTEGER_MATMULS)
def test_threads_split_outputs_not_sums(isa, matmul):
    """Two threads: the same logits as one, bit for bit (a model big enough for the parallel regions)."""
    fused = FusedDecode(random_model(SPLIT_CFG, torch.float32), built(), matmul=matmul, isa=isa)
    ids, positions, prefix, valid, write = batch([20, 31], 6, SPLIT_CFG.vocab_size)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            outs.append(forward(fused, ids, positions, kv=KVContext(filled_cache(SPLIT_CFG), prefix, valid, write)))
    torch.set_num_threads(1)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("matmul", INTEGER_MATMULS)
def test_lossless_modes_equal_ar_in_each_integer_precision(loaded, heldout_prompts, matmul):
    """On the tiny model in int8 and int16, every lossless mode gives its reference mode's tokens on held-out
    prompts, its drafter working, its KV invariants held; `ar` agrees with float32's on most prompts."""
    built()
    engine = Engine(loaded, num_slots=4096, check_invariants=True, matmul=matmul)
    assert engine.rt.matmul == matmul and engine.rt.backend.format == "i8_q8_0"
    exact = Engine(loaded, num_slots=4096)
    prompts = heldout_prompts[::4]
    ar = [engine.generate(p, "ar", {"max_new_tokens": 24}) for p in prompts]
    agree = sum(a.output_ids == b.output_ids for a, b in zip(ar, [exact.generate(p, "ar", {"max_new_tokens": 24})
                                                                for p in prompts], strict=True))
    assert agree >= len(prompts) - 2    # int8 rounding may flip a near tie
    for mode in [m for m in mode_names() if REGISTRY[m].lossless_vs]:
        cls, claim = REGISTRY[mode], claim_of(mode)
        params = {"max_new_tokens": 24, **cls.lossless_params}
        runs = [engine.generate(p, mode, params) for p in prompts]
        ref = ar if cls.lossless_vs == "ar" else [engine.generate(p, cls.lossless_vs, {"max_new_tokens": 24})
                                                  for p in prompts]
        found = [verdict(Outcome(mode, r.output_ids, params, matmul=run_matmul(matmul, cls)),
                         Outcome(b.mode, b.output_ids, {"max_new_tokens": 24}, matmul=matmul), claim)
                 for r, b in zip(runs, ref, strict=True)]
        if cls.verify_matmul not in (None, matmul):     # a verify path of its own precision: no verdict across
            assert all(v.blockers == (f"{matmul} matmuls, not {matmul}, verify {cls.verify_matmul}",) for v in found)
            continue
        assert all(v.holds for v in found), (mode, [v.blockers or v.first_difference for v in found])
        metric, minimum = cls.drafter    # at the drafter's own parameters (a fixed verify length), as in float32
        drafting = {**params, **cls.drafter_params}
        drafted = runs if drafting == params else [engine.generate(p, mode, drafting) for p in prompts]
        assert sum(r.metrics[metric] or 0.0 for r in drafted) / len(drafted) >= minimum, mode
    assert engine.rt.pool.free_count == engine.rt.pool.num_slots


def test_int8_where_it_cannot_run_is_an_error(monkeypatch):
    """Inputs of no multiple of 32, or no C build: asking for int8 or int16 raises with the reason; auto takes
    float32."""
    odd_cfg = CONFIGS["odd-biased"]
    odd = random_model(odd_cfg, torch.float32)
    for matmul in INTEGER_MATMULS:
        with pytest.raises(MatmulUnavailable, match=f"--matmul {matmul}: .*multiple of 32"):
            fused_decode(odd, PagedKV.empty(odd_cfg, 4, torch.float32, "cpu"), matmul=matmul)
    step = fused_decode(odd, PagedKV.empty(odd_cfg, 4, torch.float32, "cpu"), matmul="auto")
    assert step is not None and step.matmul == "float32"
    monkeypatch.setattr(fused_step, "ENABLED", False)
    model = random_model(CFG, torch.float32)
    with pytest.raises(MatmulUnavailable, match="SPECSCOPE_FUSED_DECODE=0"):
        fused_decode(model, PagedKV.empty(CFG, 4, torch.float32, "cpu"), matmul="int8")


def test_auto_takes_int16_only_on_the_isas_it_was_measured_on_and_gguf_weights(monkeypatch):
    """auto: bf16 where AMX tiles run, else int16 where the CPU has an ISA of INT8_AUTO and the weights are GGUF
    blocks (held exactly), else float32: never a model whose weights the integer formats would round."""
    lib = built()
    cache = PagedKV.empty(CFG, 4, torch.float32, "cpu")
    monkeypatch.setattr(fused_step, "amx_unsupported", lambda model, lib: "no AMX here")
    measured = any(lib.int8_isa_ready(INT8_ISAS.index(isa)) for isa in fused_step.INT8_AUTO)
    step = fused_decode(gguf_model(CFG), cache, matmul="auto")
    assert step is not None and step.matmul == ("int16" if measured else "float32")
    assert fused_decode(random_model(CFG, torch.float32), cache, matmul="auto").matmul == "float32"
    assert FusedDecode(random_model(CFG, torch.float32), lib, matmul="int16").rounds_weights
    monkeypatch.setattr(fused_step, "INT8_AUTO", ())
    assert fused_decode(gguf_model(CFG), cache, matmul="auto").matmul == "float32"


def test_a_run_records_int8(loaded):
    """run_start says the run's matmuls were int8: its tokens depend on it."""
    built()
    engine = Engine(loaded, num_slots=256, matmul="int8")
    tracer = RecordingTracer()
    engine.generate("What is 12 + 30?", "ar", {"max_new_tokens": 2}, tracer)
    assert tracer.events[0]["matmul"] == "int8"
    for mode in mode_names():       # a mode whose verify has a path of its own records both precisions
        verify = REGISTRY[mode].verify_matmul
        if verify not in (None, "int8"):
            tracer = RecordingTracer()
            engine.generate("What is 12 + 30?", mode, {"max_new_tokens": 2}, tracer)
            assert tracer.events[0]["matmul"] == f"int8, verify {verify}"


def test_a_long_prompt_prefills_in_int8_chunks(loaded, monkeypatch):
    """A prompt past the step's widest chunk prefills in chunks on the int8 step, never on the float32 eager
    backend, and gives the tokens its chunks give when the step takes fewer rows at a time."""
    built()
    engine = Engine(loaded, num_slots=2048, matmul="int8")
    prompt = " ".join(["one two three four five six seven eight nine ten"] * 40)
    assert len(engine.encode_prompt(prompt, True)) > engine.rt.backend.max_chunk

    def float32_forward(plan):
        raise AssertionError("a prefill row ran on the float32 eager backend")
    monkeypatch.setattr(engine.rt.eager, "run", float32_forward)
    wide = engine.generate(prompt, "ar", {"max_new_tokens": 6, "raw": True}).output_ids
    monkeypatch.setattr(engine.rt.backend, "max_chunk", 100)
    assert engine.generate(prompt, "ar", {"max_new_tokens": 6, "raw": True}).output_ids == wide
