"""Cross-check our decoder against HF transformers on tiny random Qwen2 / Qwen3 / Llama / Mistral / Ministral3.

Each family is built with transformers, saved with save_pretrained and loaded back with our load_model;
logits must match HF's (eager attention, fp32) for full-sequence causal, incremental paged-KV decoding,
block attention against a cached prefix, padded (prefix_valid) batches, and the fused C decode step
(kernels/cpu_decode.c) that ar's decode forwards take on a CPU. The RoPE variants ride along:
Ministral3 with YaRN and llama-4 query scaling (original_max_position_embeddings = 4, so most of the
14 positions lie beyond it and the query scale steps 1, 1.07, 1.11, 1.14), Llama 3 and linear scaling.
"""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from support.hf_tiny import TINY, VOCAB, YARN, randomize  # noqa: E402
from support.plans import forward  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    Ministral3Config,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from specscope.backend.forward.fused_step import fused_decode  # noqa: E402
from specscope.backend.model.checkpoint import load_model  # noqa: E402
from specscope.backend.model.transformer import KVContext, PagedKV, Transformer  # noqa: E402

ATOL = 1e-4
SEQ = 14
NUM_SLOTS = 64

FAMILIES = {
    # Qwen2: q/k/v biases, no o bias; tied embeddings.
    "qwen2": (Qwen2Config, dict(tie_word_embeddings=True, rope_theta=1_000_000.0)),
    # Qwen2 untied, to cover the other embedding layout on a biased family.
    "qwen2-untied": (Qwen2Config, dict(tie_word_embeddings=False)),
    # Qwen3: q/k RMSNorm, explicit head_dim (here 16 = 64 / 4, HF's default would be 128).
    "qwen3": (Qwen3Config, dict(head_dim=16, tie_word_embeddings=True)),
    # Llama: untied embeddings.
    "llama": (LlamaConfig, dict(tie_word_embeddings=False)),
    # Llama with attention_bias: q/k/v and o biases.
    "llama-bias": (LlamaConfig, dict(tie_word_embeddings=False, attention_bias=True)),
    # Mistral: untied; sliding window off (our decoder has none; sequences here are short anyway).
    "mistral": (MistralConfig, dict(tie_word_embeddings=False, sliding_window=None)),
    # Ministral3 as transformers' default config has it: YaRN (mscale = mscale_all_dim) + llama-4 query scaling.
    "ministral3": (Ministral3Config, dict(head_dim=16, rope_parameters=YARN)),
    # As Nemotron-Labs-Diffusion's config.json has it (no mscale keys: cos/sin scaled by 0.1 ln 16 + 1), with
    # original_max 64 so that YaRN's ramp between interpolated and extrapolated frequencies is not degenerate.
    "ministral3-nld": (Ministral3Config, dict(head_dim=16, rope_parameters={
        k: v for k, v in YARN.items() if not k.startswith("mscale")} | {"original_max_position_embeddings": 64})),
    "llama-llama3": (LlamaConfig, dict(rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))),
    "llama-linear": (LlamaConfig, dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory):
    """(family, HF eager model, our model, folder) with identical weights, via save_pretrained -> load_model."""
    family = request.param
    config_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    hf_cfg = config_cls(**TINY, **extra)
    model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
    randomize(model, seed=1)
    folder = tmp_path_factory.mktemp(family)
    model.save_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    ours = load_model(folder, dtype=torch.float32)
    return family, hf, ours, folder


def _ids(batch: int = 2, seq: int = SEQ, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _positions(batch: int, start: int, stop: int) -> torch.Tensor:
    return torch.arange(start, stop).expand(batch, -1)


def _hf_logits(hf, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask).logits.float()


def _shuffled_slots(batch: int, seq: int, seed: int = 5) -> torch.Tensor:
    """Distinct, non-contiguous, shuffled slot ids [batch, seq] out of NUM_SLOTS."""
    perm = torch.randperm(NUM_SLOTS, generator=torch.Generator().manual_seed(seed))
    return perm[: batch * seq].view(batch, seq)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    err = (a - b).abs().max().item()
    assert err < ATOL, f"max abs logit difference {err:.3g}"


# ----------------------------------------------------------------------------------- structure


def test_loaded_structure(pair):
    family, hf, ours, folder = pair
    cfg = ours.cfg
    assert cfg.family == family.split("-")[0]
    tied = json.loads((folder / "config.json").read_text())["tie_word_embeddings"]
    assert (ours.lm_head is None) == tied
    attn = ours.layers[0].self_attn
    if family.startswith("qwen2"):
        assert attn.q_proj.bias is not None and attn.o_proj.bias is None
        torch.testing.assert_close(attn.q_proj.bias, hf.model.layers[0].self_attn.q_proj.bias, rtol=0, atol=0)
    elif family == "llama-bias":
        assert attn.q_proj.bias is not None and attn.o_proj.bias is not None
    else:
        assert attn.q_proj.bias is None and attn.o_proj.bias is None
    assert hasattr(attn, "q_norm") == (family == "qwen3")
    if not tied:
        assert not torch.equal(ours.lm_head.weight, ours.embed_tokens.weight)
        torch.testing.assert_close(ours.lm_head.weight, hf.lm_head.weight, rtol=0, atol=0)


# ----------------------------------------------------------------------------------- (a) full causal


def test_full_sequence_causal(pair):
    _, hf, ours, _ = pair
    ids = _ids()
    with torch.no_grad():
        got = ours(ids, _positions(2, 0, SEQ))
    _close(got, _hf_logits(hf, ids))


# ----------------------------------------------------------------------------------- (b) incremental


def test_incremental_paged_decoding(pair):
    _, hf, ours, _ = pair
    ids = _ids()
    want = _hf_logits(hf, ids)
    b = ids.shape[0]
    slots = _shuffled_slots(b, SEQ)
    cache = PagedKV.empty(ours.cfg, NUM_SLOTS, torch.float32, "cpu")
    # Chunks: prefill 5, four single tokens, one causal chunk of 4, then one more single token.
    bounds = [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 13), (13, 14)]
    with torch.no_grad():
        for start, stop in bounds:
            kv = KVContext(cache, prefix_slots=slots[:, :start], write_slots=slots[:, start:stop])
            got = ours(ids[:, start:stop], _positions(b, start, stop), attn="causal", kv=kv)
            _close(got, want[:, start:stop])
    # Only the slots we wrote are non-zero: the paged addressing touched nothing else.
    untouched = torch.ones(NUM_SLOTS, dtype=torch.bool)
    untouched[slots.reshape(-1)] = False
    assert cache.k[:, untouched].abs().sum() == 0 and cache.v[:, untouched].abs().sum() == 0
    assert (cache.k[:, slots.reshape(-1)].abs().sum(dim=(-1, -2)) > 0).all()


def test_fused_cpu_decode_step(pair):
    """The fused C decode step (kernels/cpu_decode.c) against HF: single tokens over an eager prefill, two rows
    of different prefix lengths decoding together."""
    _, hf, ours, _ = pair
    step = fused_decode(ours, PagedKV.empty(ours.cfg, 1, torch.float32, "cpu"))
    assert step is not None
    lens = [9, 4]
    ids = _ids(batch=2, seq=SEQ, seed=13)
    want = [_hf_logits(hf, ids[row:row + 1])[0] for row in range(2)]
    cache = PagedKV.empty(ours.cfg, NUM_SLOTS, torch.float32, "cpu")
    slots = _shuffled_slots(2, SEQ, seed=17)
    with torch.no_grad():
        for row, n in enumerate(lens):
            ours(ids[row:row + 1, :n], _positions(1, 0, n), kv=KVContext(cache, slots[row:row + 1, :0],
                                                                        write_slots=slots[row:row + 1, :n]))
        for step_index in range(SEQ - max(lens)):
            at = [n + step_index for n in lens]
            width = max(at)
            prefix = torch.stack([torch.cat([slots[r, :at[r]], slots[r, :width - at[r]]]) for r in range(2)])
            valid = torch.arange(width)[None, :] < torch.tensor(at)[:, None]
            write = torch.stack([slots[r, at[r]:at[r] + 1] for r in range(2)])
            nxt = torch.stack([ids[r, at[r]:at[r] + 1] for r in range(2)])
            got = forward(step, nxt, torch.tensor(at)[:, None], kv=KVContext(cache, prefix, valid, write))
            for r in range(2):
                _close(got[r], want[r][at[r]:at[r] + 1])


def test_padded_prefix_valid(pair):
    """Rows with different prefix lengths in one batch: padding entries point at garbage slots."""
    _, hf, ours, _ = pair
    lens = [9, 5]
    ids = _ids(batch=2, seq=10, seed=7)
    cache = PagedKV.empty(ours.cfg, NUM_SLOTS, torch.float32, "cpu")
    slots = _shuffled_slots(2, 10, seed=11)
    with torch.no_grad():
        for row, n in enumerate(lens):  # prefill each row on its own
            kv = KVContext(cache, prefix_slots=slots[row:row + 1, :0], write_slots=slots[row:row + 1, :n])
            ours(ids[row:row + 1, :n], _positions(1, 0, n), kv=kv)
        cache.k[:, slots[1, 5:]] = 7.0  # garbage the padding entries of row 1 will point at
        cache.v[:, slots[1, 5:]] = -7.0
        p = max(lens)
        prefix = torch.stack([slots[0, :p], torch.cat([slots[1, :5], slots[1, 5:9]])])
        valid = torch.arange(p)[None, :] < torch.tensor(lens)[:, None]
        nxt = torch.stack([ids[0, 9:10], ids[1, 5:6]])
        positions = torch.tensor(lens)[:, None]
        got = ours(nxt, positions, kv=KVContext(cache, prefix, valid, write_slots=None))
    _close(got[0], _hf_logits(hf, ids[:1, :10])[0, 9:10])
    _close(got[1], _hf_logits(hf, ids[1:, :6])[0, 5:6])


# ----------------------------------------------------------------------------------- (c) block


def _block_mask(seq: int, block: int, batch: int) -> torch.Tensor:
    blk = torch.arange(seq) // block
    allowed = blk[None, :] <= blk[:, None]  # bidirectional within a block, causal across blocks
    return allowed[None, None].expand(batch, 1, seq, seq)


# HF's eager attention adds a 4D mask to the scores, so a bool mask must be additive float there (a bool
# mask would be added as 0/1 and mask nothing); SDPA takes a bool 4D mask as is.
@pytest.mark.parametrize("impl,mask_kind", [("eager", "float"), ("sdpa", "bool"), ("sdpa", "float")])
def test_block_attention_against_cached_prefix(pair, impl, mask_kind):
    _, hf, ours, folder = pair
    if impl != "eager":
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=impl).eval()
    block, nblocks = 4, 3
    seq = block * nblocks
    ids = _ids(seq=seq, seed=13)
    b = ids.shape[0]
    mask = _block_mask(seq, block, b)
    if mask_kind == "float":
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    want = _hf_logits(hf, ids, mask)
    # Sanity: the block mask really differs from causal, so this test cannot pass by accident.
    assert (want[:, :block] - _hf_logits(hf, ids)[:, :block]).abs().max() > 1e-3
    slots = _shuffled_slots(b, seq, seed=17)
    cache = PagedKV.empty(ours.cfg, NUM_SLOTS, torch.float32, "cpu")
    with torch.no_grad():
        for i in range(nblocks):
            s, e = i * block, (i + 1) * block
            kv = KVContext(cache, prefix_slots=slots[:, :s], write_slots=slots[:, s:e])
            got = ours(ids[:, s:e], _positions(b, s, e), attn="block", kv=kv)
            _close(got, want[:, s:e])
        # The whole sequence in one block-masked forward via the mask override gives the same.
        full = ours(ids, _positions(b, 0, seq), mask=_block_mask(seq, block, b))
    _close(full, want)


# ----------------------------------------------------------------------------------- (d) read-only


@pytest.mark.parametrize("attn", ["causal", "block"])
def test_read_only_forward_leaves_cache_untouched(pair, attn):
    _, hf, ours, _ = pair
    ids = _ids(seed=19)
    b = ids.shape[0]
    slots = _shuffled_slots(b, SEQ, seed=23)
    cache = PagedKV.empty(ours.cfg, NUM_SLOTS, torch.float32, "cpu")
    p = 8
    with torch.no_grad():
        ours(ids[:, :p], _positions(b, 0, p), kv=KVContext(cache, slots[:, :p], write_slots=None))
        assert cache.k.abs().sum() == 0 and cache.v.abs().sum() == 0  # read-only on an empty cache
        ours(ids[:, :p], _positions(b, 0, p), kv=KVContext(cache, slots[:, :0], write_slots=slots[:, :p]))
        k0, v0 = cache.k.clone(), cache.v.clone()
        got = ours(ids[:, p:], _positions(b, p, SEQ), attn=attn,
                   kv=KVContext(cache, slots[:, :p], write_slots=None))
    assert torch.equal(cache.k, k0) and torch.equal(cache.v, v0)
    if attn == "causal":
        _close(got, _hf_logits(hf, ids)[:, p:])


# ----------------------------------------------------------------------------------- config defaults


def test_missing_tie_word_embeddings_follows_hf_default(tmp_path):
    """HF's default for these families is untied: a config.json without the key must load lm_head."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**TINY, tie_word_embeddings=False), dtype=torch.float32)
    randomize(model, seed=29)
    model.save_pretrained(tmp_path)
    cfg_path = tmp_path / "config.json"
    d = json.loads(cfg_path.read_text())
    d.pop("tie_word_embeddings")
    cfg_path.write_text(json.dumps(d))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    assert hf.config.tie_word_embeddings is False
    ours = load_model(tmp_path)
    assert ours.lm_head is not None
    ids = _ids(seed=31)
    with torch.no_grad():
        _close(ours(ids, _positions(2, 0, SEQ)), _hf_logits(hf, ids))


def test_our_config_round_trips_through_hf(tmp_path):
    """A config.json we write is read by transformers as the same architecture."""
    from safetensors.torch import save_file

    from specscope.backend.model.config import ModelConfig

    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, family="qwen3")
    torch.manual_seed(0)
    ours = Transformer(cfg).eval()
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    save_file({f"model.{k}": v.contiguous() for k, v in ours.state_dict().items()}, str(tmp_path / "model.safetensors"))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    ids = _ids(seed=37)
    with torch.no_grad():
        _close(ours(ids, _positions(2, 0, SEQ)), _hf_logits(hf, ids))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_is_hfs_rotate_half_bit_for_bit(dtype) -> None:
    """Our roll-and-sign RoPE gives exactly the products of transformers' rotate_half formula (in fp32 for both,
    as HF's Qwen/Llama do for fp32; for fp16 against the same formula evaluated in fp32 and cast back)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from specscope.backend.model.transformer import apply_rope, rope_cos_sin
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 7, heads, 64, generator=g).to(dtype) for heads in (4, 2))
    cos, sin = rope_cos_sin(torch.arange(3, 10).repeat(2, 1), 64, 10000.0)   # [B, Q, 1, hd]
    hf_q, hf_k = apply_rotary_pos_emb(q.float().transpose(1, 2), k.float().transpose(1, 2), cos[:, :, 0],
                                      sin[:, :, 0])
    assert torch.equal(apply_rope(q, cos, sin), hf_q.transpose(1, 2).to(dtype))
    assert torch.equal(apply_rope(k, cos, sin), hf_k.transpose(1, 2).to(dtype))
