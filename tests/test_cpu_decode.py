"""The fused CPU decode step (kernels/cpu_decode.c) against the eager forward and against transformers.

Every weight format (float32, float16, bfloat16, GGUF Q4_1 / Q8_0 blocks) and every vector path (AVX-512,
AVX2 + F16C, plain C) is built and compared with the eager forward on random models: biases, no q/k-norm, odd
sizes that leave vector tails, llama-4 query scaling, rows with different prefix lengths, read-only forwards.
The HF families (qwen2/3, llama, mistral, ministral3 with YaRN) are compared with transformers' own logits in
test_hf_crosscheck.py. Here the engine is also checked to decode through it, with the tokens it would decode
eagerly.
"""
from __future__ import annotations

import platform
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support.plans import forward

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes.quadratic import interleaved_mask
from specscope.backend.forward import weight_blocks
from specscope.backend.forward.fused_step import MAX_CHUNK, FusedDecode, fused_decode, supported
from specscope.backend.forward.weight_blocks import pack
from specscope.backend.model.config import ModelConfig
from specscope.backend.model.rope import RopeSpec
from specscope.backend.model.transformer import KVContext, PagedKV, Transformer
from specscope.kernels import native
from specscope.kernels.native import FLAGS, NON_TEMPORAL, build, load, native_flags

pytestmark = pytest.mark.usefixtures("one_thread")

SLOTS = 96
VECTOR_PATHS = {"native": FLAGS, "native, non-temporal prefetch": FLAGS + NON_TEMPORAL,
                "plain-c": ("-O1", "-shared", "-fPIC")}
if platform.machine() == "x86_64":
    VECTOR_PATHS["avx2"] = ("-O3", "-march=x86-64-v3", "-shared", "-fPIC")

CONFIGS = {
    "qwen3": ModelConfig(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    # Llama-like with q/k/v/o biases, no q/k-norm, and sizes that are no multiple of the 16 vector lanes.
    "odd-biased": ModelConfig(vocab_size=101, hidden_size=40, intermediate_size=56, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=10, family="llama",
                              qkv_bias=True, o_bias=True, qk_norm=False, tie_word_embeddings=False),
    # Ministral3-like: llama-4 query scaling over YaRN, multi-query attention.
    "query-scaled": ModelConfig(vocab_size=128, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                num_attention_heads=3, num_key_value_heads=3, head_dim=16, family="ministral3",
                                rope=RopeSpec(rope_type="yarn", factor=4.0, original_max_position_embeddings=8,
                                              llama_4_scaling_beta=0.1)),
}


@pytest.fixture(scope="module", params=sorted(VECTOR_PATHS))
def lib(request):
    path = build("cc", VECTOR_PATHS[request.param])
    if path is None:
        pytest.fail(f"cc could not build cpu_decode.c with {VECTOR_PATHS[request.param]}")
    return load(path)


def random_model(cfg: ModelConfig, fmt: torch.dtype, seed: int = 0) -> Transformer:
    """Random weights (norms around 1, biases non-zero) that fmt holds exactly; bfloat16 ones with a row of
    tiny values (~1e-7) as real bfloat16 checkpoints have, which float16 cannot hold."""
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = 1 + 0.2 * torch.randn(p.shape) if "norm" in name else 0.15 * torch.randn(p.shape)
            if p.dim() == 2 and fmt == torch.bfloat16:
                value[0] *= 2 ** -20
            p.copy_(value.to(fmt).float() if p.dim() == 2 else value)
    return model


def filled_cache(cfg: ModelConfig, seed: int = 1) -> PagedKV:
    cache = PagedKV.empty(cfg, SLOTS, torch.float32, "cpu")
    g = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return cache


def batch(lengths: list[int], queries: int, vocab: int, seed: int = 2) -> tuple[torch.Tensor, ...]:
    """ids [R, Q], positions [R, Q], padded prefix slots [R, P], prefix_valid, write slots [R, Q]."""
    g = torch.Generator().manual_seed(seed)
    rows, width = len(lengths), max(lengths)
    fresh = rows * queries
    slots = torch.randperm(SLOTS - fresh, generator=g)[:rows * width].view(rows, width)
    valid = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    prefix = torch.where(valid, slots, 0)
    write = torch.arange(SLOTS - fresh, SLOTS).view(rows, queries)
    ids = torch.randint(0, vocab, (rows, queries), generator=g)
    positions = torch.tensor(lengths)[:, None] + torch.arange(queries)[None, :]
    return ids, positions, prefix, valid, write


@pytest.mark.parametrize("queries", [1, 5])
@pytest.mark.parametrize("fmt", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_fused_step_equals_eager(lib, config, fmt, queries):
    """Decode steps (1 row per request) and short causal chunks (5 rows per request) that write their K/V."""
    cfg = CONFIGS[config]
    model = random_model(cfg, fmt)
    fused = FusedDecode(model, lib)
    assert fused.format == {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[fmt]
    for lengths in ([0], [7], [12, 3, 0, 9]):
        ids, positions, prefix, valid, write = batch(lengths, queries, cfg.vocab_size)
        padded = valid if len(set(lengths)) > 1 else None
        eager_cache, fused_cache = filled_cache(cfg), filled_cache(cfg)
        with torch.inference_mode():
            want = model(ids, positions, kv=KVContext(eager_cache, prefix, padded, write))
            got = forward(fused, ids, positions, kv=KVContext(fused_cache, prefix, padded, write))
            if queries == 1:   # read-only: the same logits, the cache untouched
                untouched = filled_cache(cfg)
                assert torch.equal(forward(fused, ids, positions, kv=KVContext(untouched, prefix, padded, None)), got)
                assert torch.equal(untouched.k, filled_cache(cfg).k)
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= 1e-5 * max(scale, 1.0), (config, lengths)
        # The fused step wrote each row's K/V to its slot and nothing else.
        written = write.view(-1)
        assert torch.allclose(fused_cache.k[:, written], eager_cache.k[:, written], atol=1e-5)
        assert torch.allclose(fused_cache.v[:, written], eager_cache.v[:, written], atol=1e-5)
        others = torch.ones(SLOTS, dtype=torch.bool)
        others[written] = False
        assert torch.equal(fused_cache.k[:, others], eager_cache.k[:, others])
        assert torch.equal(fused_cache.v[:, others], eager_cache.v[:, others])


def random_mask(rows: int, lengths: list[int], width: int, seed: int = 3) -> torch.Tensor:
    """[R, 1, Q, P+Q]: each row sees a random part of its own prefix and of the other rows, and itself."""
    g = torch.Generator().manual_seed(seed)
    prefix = (torch.rand(len(lengths), 1, rows, width, generator=g) < 0.7) & (
        torch.arange(width)[None, None, None, :] < torch.tensor(lengths)[:, None, None, None])
    chunk = (torch.rand(len(lengths), 1, rows, rows, generator=g) < 0.5) | torch.eye(rows, dtype=torch.bool)
    return torch.cat([prefix, chunk], dim=-1)


@pytest.mark.parametrize("fmt", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_masked_chunk_equals_eager(lib, config, fmt):
    """A chunk that writes its K/V under a mask override (quadratic's verify: 3 groups of 1 spec + 2 masks at
    their own positions; and random masks in which each row sees itself and part of its prefix and of the other
    rows, later ones included) runs through the kernel with the eager forward's logits and K/V."""
    cfg = CONFIGS[config]
    model = random_model(cfg, fmt)
    fused = FusedDecode(model, lib)
    cases = []
    for lengths in ([0], [7]):
        ids, _, prefix, _, write = batch(lengths, 9, cfg.vocab_size)
        positions = torch.tensor([[lengths[0] + o for o in (0, 1, 2, 1, 2, 3, 2, 3, 4)]])
        cases.append((ids, positions, prefix, write, interleaved_mask(3, 2, lengths[0])))
    for lengths in ([10], [12, 3, 9]):
        ids, positions, prefix, _, write = batch(lengths, 6, cfg.vocab_size)
        cases.append((ids, positions, prefix, write, random_mask(6, lengths, max(lengths))))
    for ids, positions, prefix, write, mask in cases:
        eager_cache, fused_cache = filled_cache(cfg), filled_cache(cfg)
        with torch.inference_mode():
            want = model(ids, positions, "strict_causal", kv=KVContext(eager_cache, prefix, None, write), mask=mask)
            got = forward(fused, ids, positions, "strict_causal", kv=KVContext(fused_cache, prefix, None, write),
                          mask=mask)
        assert (got - want).abs().max().item() <= 1e-5 * max(want.abs().max().item(), 1.0), mask.shape
        assert torch.allclose(fused_cache.k, eager_cache.k, atol=1e-5)
        assert torch.allclose(fused_cache.v, eager_cache.v, atol=1e-5)


def with_adapter(model: Transformer, rank: int = 4, seed: int = 5) -> Transformer:
    """Every projection with a random rank-r LoRA (B non-zero, so it changes what it touches)."""
    torch.manual_seed(seed)
    for module in model.modules():
        if hasattr(module, "add_adapter"):
            module.add_adapter(rank, 8.0)
            with torch.no_grad():
                module.lora_B.normal_(std=0.2)
    return model


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_adapter_rows_equal_eager(lib, config):
    """A LoRA adapter on at some rows (the MASK rows of isd's and quadratic's drafts) or all of them (a draft
    pass): the kernel gives the eager forward's logits and K/V; rows with the adapter off are the fused step's
    own numbers without it, bit for bit."""
    cfg = CONFIGS[config]
    model = with_adapter(random_model(cfg, torch.float32))
    fused = FusedDecode(model, lib)
    assert fused.lora is not None
    ids, positions, prefix, valid, write = batch([7, 3], 5, cfg.vocab_size)
    some = torch.tensor([[False, True, True, False, True], [True, False, False, False, True]])
    for lora in (some, True):
        eager_cache, fused_cache = filled_cache(cfg), filled_cache(cfg)
        with torch.inference_mode():
            want = model(ids, positions, kv=KVContext(eager_cache, prefix, valid, write), lora=lora)
            got = forward(fused, ids, positions, kv=KVContext(fused_cache, prefix, valid, write), lora=lora)
            plain = forward(fused, ids, positions, kv=KVContext(filled_cache(cfg), prefix, valid, write))
        # relative to the logits' and K's scales: float32 sums in another order, and the eager LoRA's own GEMMs
        # (torch's, which differ by CPU: on a Sapphire Rapids Xeon the query-scaled model's logits differ by 1e-5)
        assert (got - want).abs().max().item() <= 1e-4 * max(want.abs().max().item(), 1.0)
        assert torch.allclose(fused_cache.k, eager_cache.k, atol=1e-4 * max(eager_cache.k.abs().max().item(), 1.0))
        assert not torch.allclose(got, plain, atol=1e-3)     # the adapter did something
        if lora is some:   # request 0's row 0 precedes its adapted rows: untouched by them
            assert torch.equal(got[0, 0], plain[0, 0])


def test_threads_split_work_not_numbers(lib):
    """Two threads split each linear's outputs and the attention heads: the same logits as one thread, bit for
    bit (the engine's lossless equalities hold whatever torch.set_num_threads says)."""
    fused = FusedDecode(with_adapter(random_model(SPLIT_CFG, torch.float32)), lib)
    one, two = logits_at_1_and_2_threads(fused, [38, 40], 8, adapted_every=3)
    assert torch.equal(one, two)


SPLIT_CFG = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=16)
"""Big enough for the kernels' parallel regions (the head and the FFN split across threads)."""


def logits_at_1_and_2_threads(fused: FusedDecode, lengths: list[int], queries: int,
                              adapted_every: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One SPLIT_CFG forward at 1 and at 2 threads (the adapter on at ids divisible by adapted_every)."""
    ids, positions, prefix, valid, write = batch(lengths, queries, SPLIT_CFG.vocab_size)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            outs.append(forward(fused, ids, positions, kv=KVContext(filled_cache(SPLIT_CFG), prefix, valid, write),
                                lora=ids % adapted_every == 0))
    torch.set_num_threads(1)
    return outs[0], outs[1]


def test_masks_the_kernel_cannot_follow_run_eagerly(lib):
    """A mask with a row that does not see itself is the model's own forward, bit for bit; so is a masked
    forward that writes nothing."""
    cfg = CONFIGS["qwen3"]
    model = random_model(cfg, torch.float32)
    fused = FusedDecode(model, lib)
    ids, positions, prefix, _, write = batch([5], 4, cfg.vocab_size)
    blind = random_mask(4, [5], 5)
    blind[0, 0, 2, 5 + 2] = False
    calls = []
    original = fused.lib.decode_step
    fused.lib = SimpleNamespace(decode_step=lambda *args: calls.append(args) or original(*args))
    for mask, writes in ((blind, write), (random_mask(4, [5], 5), None)):
        with torch.inference_mode():
            want = model(ids, positions, kv=KVContext(filled_cache(cfg), prefix, None, writes), mask=mask)
            got = forward(fused, ids, positions, kv=KVContext(filled_cache(cfg), prefix, None, writes), mask=mask)
        assert torch.equal(got, want)
    assert calls == []


@pytest.mark.parametrize("writes", [False, True], ids=["read-only", "writing"])
@pytest.mark.parametrize("fmt", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_block_chunks_equal_eager(lib, config, fmt, writes):
    """Bidirectional blocks (the block modes' draft, denoise and verify passes: each row sees its prefix and its
    whole block), alone, padded and batched, read-only or writing their K/V: the eager forward's logits, the
    cache written where asked and untouched elsewhere."""
    cfg = CONFIGS[config]
    model = random_model(cfg, fmt)
    fused = FusedDecode(model, lib)
    for lengths in ([0], [7], [12, 3, 0, 9]):
        ids, positions, prefix, valid, write = batch(lengths, 6, cfg.vocab_size)
        padded = valid if len(set(lengths)) > 1 else None
        slots = write if writes else None
        eager_cache, fused_cache = filled_cache(cfg), filled_cache(cfg)
        with torch.inference_mode():
            want = model(ids, positions, attn="block", kv=KVContext(eager_cache, prefix, padded, slots))
            got = forward(fused, ids, positions, attn="block", kv=KVContext(fused_cache, prefix, padded, slots))
        assert (got - want).abs().max().item() <= 1e-5 * max(want.abs().max().item(), 1.0), (config, lengths)
        assert torch.allclose(fused_cache.k, eager_cache.k, atol=1e-5)
        assert torch.allclose(fused_cache.v, eager_cache.v, atol=1e-5)
        if not writes:
            assert torch.equal(fused_cache.k, filled_cache(cfg).k) and torch.equal(fused_cache.v, filled_cache(cfg).v)


def assert_chunk_rows_are_lone_steps(fused: FusedDecode, cfg: ModelConfig, queries: int, adapted: bool) -> None:
    """A causal chunk of `queries` rows (the adapter on at every third id, if `adapted`) gives, row for row, the
    logits of lone 1-row steps at their positions bit for bit, and writes the same K/V."""
    ids, positions, prefix, _, write = batch([9], queries, cfg.vocab_size)
    lora = ids % 3 == 0 if adapted else torch.zeros_like(ids, dtype=torch.bool)
    chunk_cache, step_cache = filled_cache(cfg), filled_cache(cfg)
    with torch.inference_mode():
        chunk = forward(fused, ids, positions, kv=KVContext(chunk_cache, prefix, None, write), lora=lora)
        steps = [forward(fused, ids[:, m:m + 1], positions[:, m:m + 1],
                         kv=KVContext(step_cache, torch.cat([prefix, write[:, :m]], 1), None, write[:, m:m + 1]),
                         lora=lora[:, m:m + 1])
                 for m in range(queries)]
    assert torch.equal(chunk, torch.cat(steps, dim=1))
    assert torch.equal(chunk_cache.k, step_cache.k) and torch.equal(chunk_cache.v, step_cache.v)


def test_a_chunk_row_is_the_decode_step_at_its_position(lib):
    """A 5-row causal chunk (a verify) gives, row for row, the very numbers of five 1-row steps: what makes
    linear_spec and isd lossless against ar bit for bit, not only up to rounding."""
    cfg = CONFIGS["qwen3"]
    assert_chunk_rows_are_lone_steps(FusedDecode(random_model(cfg, torch.float16), lib), cfg, 5, adapted=False)


def test_the_prefetch_hint_changes_no_number():
    """AMD builds prefetch with the non-temporal hint, others into L1: the same logits and K/V, bit for bit."""
    cfg = CONFIGS["odd-biased"]
    model = random_model(cfg, torch.float16)
    ids, positions, prefix, _, write = batch([11], 3, cfg.vocab_size)
    out = []
    for flags in (FLAGS, FLAGS + NON_TEMPORAL):
        cache = filled_cache(cfg)
        with torch.inference_mode():
            fused = FusedDecode(model, load(build("cc", flags)))
            out.append((forward(fused, ids, positions, kv=KVContext(cache, prefix, None, write)), cache.k, cache.v))
    assert all(torch.equal(a, b) for a, b in zip(*out, strict=True))


def test_native_flags_ask_for_non_temporal_prefetch_on_amd_only(monkeypatch):
    for vendor, want in (("AuthenticAMD", FLAGS + NON_TEMPORAL), ("GenuineIntel", FLAGS), ("", FLAGS)):
        monkeypatch.setattr(native, "_cpuinfo", lambda field, v=vendor: v if field == "vendor_id" else "")
        assert native_flags() == want


def test_rope_table_grows_and_holds_the_eager_numbers(lib):
    """The kernel reads cos/sin and the query scale from a table by position: a step far past the table's first
    size grows it, and every entry is what the model's Rotary computes for that position alone."""
    cfg = CONFIGS["query-scaled"]
    model = random_model(cfg, torch.float32)
    fused = FusedDecode(model, lib)
    for start in (3, 200, 1000):
        ids, positions, prefix, _, write = batch([5], 1, cfg.vocab_size)
        positions = positions + start
        with torch.inference_mode():
            want = model(ids, positions, kv=KVContext(filled_cache(cfg), prefix, None, write))
            got = forward(fused, ids, positions, kv=KVContext(filled_cache(cfg), prefix, None, write))
        assert (got - want).abs().max().item() <= 1e-5 * max(want.abs().max().item(), 1.0), start
    table = fused.rope
    assert table.size == 1024 and table.q_scale is not None
    for at in (0, 7, 8, 205, 1005):
        cos, sin, q_scale = model.rotary(torch.tensor([[at]]))
        assert torch.equal(table.cos[at], cos.reshape(-1)) and torch.equal(table.sin[at], sin.reshape(-1))
        assert torch.equal(table.q_scale[at], q_scale.reshape(()))


def test_other_forwards_run_eagerly(lib):
    """Read-only multi-row causal chunks are the model's own forward, bit for bit (an adapter switched on and
    chunks past MAX_CHUNK are too: see accepts)."""
    cfg = CONFIGS["qwen3"]
    model = random_model(cfg, torch.float32)
    fused = FusedDecode(model, lib)
    ids = torch.randint(0, cfg.vocab_size, (2, 4), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(3, 7).expand(2, -1)
    prefix = torch.arange(6).view(2, 3)
    with torch.inference_mode():
        want = model(ids, positions, attn="causal", kv=KVContext(filled_cache(cfg), prefix))
        got = forward(fused, ids, positions, attn="causal", kv=KVContext(filled_cache(cfg), prefix))
    assert torch.equal(got, want)
    assert not FusedDecode.accepts(4, "causal", torch.ones(1, 1, 4, 4, dtype=torch.bool), False)
    assert FusedDecode.accepts(4, "block", torch.ones(1, 1, 4, 4, dtype=torch.bool), True)   # mask decides
    assert not FusedDecode.accepts(4, "causal", None, False)   # read-only chunks: rows need the cache
    assert not FusedDecode.accepts(MAX_CHUNK + 1, "causal", None, True)
    assert not FusedDecode.accepts(MAX_CHUNK + 1, "block", None, False)
    assert FusedDecode.accepts(MAX_CHUNK, "block", None, False)   # bidirectional rows: read-only too
    assert not FusedDecode.accepts(MAX_CHUNK, "block", None, False, requests=2)   # at most MAX_CHUNK in all
    assert FusedDecode.accepts(1, "causal", None, False)
    assert FusedDecode.accepts(MAX_CHUNK, "strict_causal", None, True)


def gguf_values(w: torch.Tensor, kind: str) -> torch.Tensor:
    """w quantized and dequantized by gguf-py (the GGUF reference code, not ours)."""
    from gguf import GGMLQuantizationType, quants
    kind_ = getattr(GGMLQuantizationType, kind)
    return torch.from_numpy(quants.dequantize(quants.quantize(w.numpy(), kind_), kind_)).float()


def unpack(packed: torch.Tensor, fmt: str) -> torch.Tensor:
    """Our block layouts read back in Python (cpu_decode.c's Q4_1 / Q8_0 structs)."""
    out = packed.shape[0]
    if fmt == "q4_1":
        b = packed.view(out, -1, 24)
        scale = b[..., :8].contiguous().view(torch.float32)
        codes = torch.cat([b[..., 8:] & 15, b[..., 8:] >> 4], -1).float()
        return (codes * scale[..., :1] + scale[..., 1:]).view(out, -1)
    b = packed.view(out, -1, 36)
    codes, scale = b[..., 4:].contiguous().view(torch.int8).float(), b[..., :4].contiguous().view(torch.float32)
    return (codes * scale).view(out, -1)


def test_weight_formats_are_exact():
    w = torch.randn(8, 64)
    tiny = w * 2 ** -20                  # below float16's normal range: bfloat16 keeps these, float16 does not
    assert pack([w]).format == "f32"
    assert pack([w.half().float()]).format == "f16"
    assert pack([w.bfloat16().float()]).format == "f16"   # 8 significant bits fit float16's 11
    assert pack([tiny.bfloat16().float()]).format == "bf16"
    assert pack([w.half().float(), w]).format == "f32"
    assert pack([torch.tensor([[2.0 ** 17]])]).format == "bf16"  # beyond float16's range
    for kind in ("Q4_1", "Q8_0"):
        values = gguf_values(w, kind)
        packed = pack([values])
        assert packed.format == kind.lower() and packed.odd_rows[0].numel() == 0
        assert torch.equal(unpack(packed.copies[0], packed.format), values)    # bit for bit
    odd = gguf_values(w, "Q4_1")
    odd[3] = torch.randn(64)             # one row no block holds: a trained MASK embedding
    assert pack([odd]).format == "f32"
    spared = pack([odd], spare_rows=1)
    assert spared.format == "q4_1" and spared.odd_rows[0].tolist() == [3]
    assert torch.equal(spared.odd_values[0], odd[3:4])
    assert pack([gguf_values(w, "Q4_1")[:, :40].contiguous()]).format == "f32"   # rows of no multiple of 32


def gguf_model(cfg: ModelConfig) -> Transformer:
    """A random model as the real default model comes from its GGUF: Q4_1 projections, a Q8_0 embedding (tied
    head) with one row replaced (an adapter's trained MASK row), float32 norms."""
    model = random_model(cfg, torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(gguf_values(p.detach().contiguous(), "Q8_0" if "embed" in name else "Q4_1"))
        model.embed_tokens.weight[5] = 0.15 * torch.randn(cfg.hidden_size)
    return model


def test_gguf_blocks_give_the_float32_steps_numbers(lib, monkeypatch):
    """The block formats are the float32 weights: steps that read the blocks (few rows) or widen them into float32
    tiles (TILE_ROWS rows and more, kernels/cpu_decode.c) give the float32 step's logits bit for bit, the odd head
    row included, and match the eager forward."""
    cfg = CONFIGS["qwen3"]
    model = gguf_model(cfg)
    fused = FusedDecode(model, lib)
    assert (fused.format, fused.head_format) == ("q4_1", "q8_0")
    assert fused.weights.head.odd_rows[0].tolist() == [5]
    monkeypatch.setattr(weight_blocks, "PACKERS", {})
    plain = FusedDecode(model, lib)
    assert (plain.format, plain.head_format) == ("f32", "f32")
    for lengths, queries in (([7], 1), ([9], 2), ([6], 3), ([12, 3], 1), ([4], 4), ([4], 5), ([5, 8], 4), ([3], 9)):
        ids, positions, prefix, valid, write = batch(lengths, queries, cfg.vocab_size)
        ids[0, 0] = 5
        padded = valid if len(set(lengths)) > 1 else None
        with torch.inference_mode():
            got = forward(fused, ids, positions, kv=KVContext(filled_cache(cfg), prefix, padded, write))
            want = forward(plain, ids, positions, kv=KVContext(filled_cache(cfg), prefix, padded, write))
            eager = model(ids, positions, kv=KVContext(filled_cache(cfg), prefix, padded, write))
        assert torch.equal(got, want), (lengths, queries)
        assert (got - eager).abs().max().item() <= 1e-5 * max(eager.abs().max().item(), 1.0)


def test_unsupported_models_and_missing_compiler_decode_eagerly():
    cfg = CONFIGS["qwen3"]
    half = random_model(cfg, torch.float16).half()
    assert supported(half, PagedKV.empty(cfg, 4, torch.float16, "cpu")) is not None
    assert fused_decode(half, PagedKV.empty(cfg, 4, torch.float16, "cpu")) is None
    assert build("/nonexistent/cc") is None
    assert build("cc", folder=Path("/nonexistent")) is None   # a wheel without the C sources: eager


def test_a_failed_build_runs_eagerly_after_one_warning(monkeypatch, tmp_path, caplog):
    """Without a working compiler the library is None, after one logged warning, and forwards run eagerly."""
    cfg = CONFIGS["qwen3"]
    model = random_model(cfg, torch.float32)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))   # no cached build to load instead
    native.library.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="specscope.kernels.native"):
            assert native.library() is None and fused_decode(model, filled_cache(cfg)) is None
        assert len([r for r in caplog.records if r.name == "specscope.kernels.native"]) == 1
    finally:
        native.library.cache_clear()
        monkeypatch.undo()
    assert fused_decode(model, filled_cache(cfg)) is not None   # built again with the real compiler


def test_calls_are_typed_by_the_header(lib):
    """api.h's prototypes type every call: an int32 table where the C reads int64 is refused, not misread."""
    from specscope.kernels.native import ptr

    rows, h = torch.zeros(2, dtype=torch.int32), torch.zeros(2, 4)
    with pytest.raises(TypeError, match="int64_t"):
        lib.norm_rows(ptr(h), ptr(rows), 2, 4, ptr(torch.ones(4)), 1e-5, ptr(torch.zeros(2, 4)))
    with pytest.raises(TypeError):
        lib.norm_rows(h.data_ptr(), ptr(rows.long()), 2, 4, ptr(torch.ones(4)), 1e-5, ptr(torch.zeros(2, 4)))
    with pytest.raises(ValueError, match="contiguous"):
        ptr(torch.zeros(4, 4).t())


@pytest.mark.slow   # several seconds: left out of make test-fast
def test_engine_decodes_through_the_fused_step(loaded, heldout_prompts):
    """The shipped (float16-stored) checkpoint decodes through the C step, streaming half the bytes, with the
    same tokens as the eager forward: alone, as a batch of requests of different lengths, linear_spec's drafts
    and verifies, quadratic's masked verifies and block_diffusion's bidirectional blocks."""
    fused_engine, eager_engine = Engine(loaded, num_slots=4096, check_invariants=True), Engine(loaded, 4096)
    step = fused_engine.rt.backend
    assert isinstance(step, FusedDecode) and step.format == "f16"
    eager_engine.rt.backend = eager_engine.rt.eager
    calls = []
    lib = step.lib

    def counting(*args):
        calls.append(args[9])   # rows
        return lib.decode_step(*args)

    step.lib = SimpleNamespace(decode_step=counting)
    try:
        prompts = heldout_prompts[::4]
        params = {"max_new_tokens": 24}
        alone = [fused_engine.generate(p, "ar", params).output_ids for p in prompts]
        together = fused_engine.run([fused_engine.new_request(p, "ar", params) for p in prompts])
        decode_rows = set(calls)
        calls.clear()
        verified = [fused_engine.generate(p, "linear_spec", params).output_ids for p in prompts]
        linear_rows = set(calls)
        calls.clear()
        quadratic = [fused_engine.generate(p, "quadratic", params).output_ids for p in prompts]
        quadratic_rows = set(calls)
        calls.clear()
        denoised = [fused_engine.generate(p, "block_diffusion", params).output_ids for p in prompts]
    finally:
        step.lib = lib
    eager = [eager_engine.generate(p, "ar", params).output_ids for p in prompts]
    assert alone == eager
    assert [r.output_ids for r in together] == eager
    assert verified == eager and quadratic == eager
    assert denoised == [eager_engine.generate(p, "block_diffusion", params).output_ids for p in prompts]
    assert 1 in decode_rows and max(decode_rows) > 1   # single rows and a batched decode both went through C
    assert 16 in linear_rows                            # linear_spec's 16-row drafts and verifies too
    assert 25 in quadratic_rows                         # quadratic's masked 25-row verifies (k=4)
    assert 32 in calls                                  # block_diffusion's 32-row bidirectional blocks


def test_the_runtime_has_one_eager_backend(engine):
    """Plans the fused step cannot take run on the runtime's own eager backend, not on a second copy."""
    rt = engine.rt
    assert rt.backend is not rt.eager and rt.backend.fallback is rt.eager
