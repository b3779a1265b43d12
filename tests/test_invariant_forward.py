"""The batch-invariant torch forward (backend/forward/invariant.py, `--forward torch`): several plans in one forward
give each plan, bit for bit, what it gives alone (logits, hidden states, the K/V it writes), in any order and
company; and they are the model's numbers (the eager forward's, to float32 rounding)."""
from __future__ import annotations

import itertools

import pytest
import torch

from specscope.backend.engine.draft_tree import tree_mask
from specscope.backend.forward.choice import ForwardUnavailable, forward_backend
from specscope.backend.forward.fused_step import MatmulUnavailable
from specscope.backend.forward.invariant import InvariantForward, PositionTable
from specscope.backend.forward.plan import Eager, Fold, ForwardPlan
from specscope.backend.model.config import ModelConfig
from specscope.backend.model.rope import RopeSpec
from specscope.backend.model.transformer import KVContext, PagedKV, Transformer

CONFIGS = {
    # q/k-norm, a LoRA on q, v and gate, an FFN width no multiple of the vector step (SiLU a row per call)
    "qwen3-lora": ModelConfig(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, lora_rank=4,
                              lora_targets=["q_proj", "v_proj", "gate_proj"]),
    # biases, no q/k-norm, odd sizes, llama-4 query scaling over YaRN, an untied head
    "odd-scaled": ModelConfig(vocab_size=101, hidden_size=40, intermediate_size=56, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=10, family="ministral3",
                              qkv_bias=True, o_bias=True, qk_norm=False, tie_word_embeddings=False,
                              rope=RopeSpec(rope_type="yarn", factor=4.0, original_max_position_embeddings=8,
                                            llama_4_scaling_beta=0.1)),
}
SLOTS = 256


def random_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn(p.shape) if "norm" in name else 0.15 * torch.randn(p.shape))
    return model


def filled_cache(cfg: ModelConfig) -> PagedKV:
    cache = PagedKV.empty(cfg, SLOTS, torch.float32, "cpu")
    g = torch.Generator().manual_seed(1)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return cache


def plans(cfg: ModelConfig, cache: PagedKV) -> list[ForwardPlan]:
    """One plan of each kind a round asks for, over disjoint slots: a decode step, a verify with the adapter at
    some rows, a read-only bidirectional block with it everywhere, a tree-masked verify, three branch states over
    one shared prefix, a prompt's first chunk (no prefix), and two requests of other prefix lengths (padded)."""
    g = torch.Generator().manual_seed(2)
    fresh = iter(torch.randperm(SLOTS, generator=g).tolist())

    def take(n: int) -> list[int]:
        return [next(fresh) for _ in range(n)]

    def ids(r: int, q: int) -> torch.Tensor:
        return torch.randint(3, cfg.vocab_size, (r, q), generator=g)

    def at(starts: list[int], q: int) -> torch.Tensor:
        return torch.tensor([[s + j for j in range(q)] for s in starts])

    def causal(prefix: int, q: int, **kw) -> ForwardPlan:
        kv = KVContext(cache, torch.tensor([take(prefix)], dtype=torch.long), write_slots=torch.tensor([take(q)]))
        return ForwardPlan(ids(1, q), at([prefix], q), "causal", kv, **kw)

    shared = torch.tensor([take(9)]).expand(3, -1)
    padded = torch.tensor([take(6), take(4) + [0, 0]])
    lora = torch.tensor([[False, True, True, False, True]])
    return [
        causal(7, 1, hidden=True),
        causal(11, 5, adapter=lora),
        ForwardPlan(ids(1, 4), at([3], 4), "block", KVContext(cache, torch.tensor([take(3)])), adapter=True),
        causal(5, 6, mask=tree_mask([-1, 0, 0, 1, 1, 2], 5)),
        ForwardPlan(ids(3, 4), at([9] * 3, 4), "block", KVContext(cache, shared, shared=True), hidden=True),
        causal(0, 3),
        ForwardPlan(ids(2, 2), at([6, 4], 2), "causal",
                    KVContext(cache, padded, torch.tensor([[True] * 6, [True] * 4 + [False] * 2]),
                              torch.tensor([take(2), take(2)]))),
    ]


@pytest.fixture(params=sorted(CONFIGS))
def setup(request, one_thread):
    cfg = CONFIGS[request.param]
    model = random_model(cfg)
    for m in model.modules():      # a trained adapter: B nonzero
        if getattr(m, "lora_B", None) is not None:
            torch.nn.init.normal_(m.lora_B, std=0.1)
    return model, filled_cache(cfg)


def outcome(backend, planned: list[ForwardPlan], cache: PagedKV, before: tuple) -> tuple[list, tuple]:
    """The plans' results in one forward, and the K/V it left (from the cache as it was before)."""
    cache.k.copy_(before[0])
    cache.v.copy_(before[1])
    with torch.inference_mode():
        results = backend.run_ragged(planned)
    return results, (cache.k.clone(), cache.v.clone())


def test_plans_give_together_what_they_give_alone(setup):
    model, cache = setup
    backend, eager = InvariantForward(model, tile=4), Eager(model)
    planned = plans(model.cfg, cache)
    before = (cache.k.clone(), cache.v.clone())
    alone = [outcome(backend, [p], cache, before)[0][0] for p in planned]
    for p, a in zip(planned, alone, strict=True):   # the model's numbers
        cache.k.copy_(before[0])
        cache.v.copy_(before[1])
        with torch.inference_mode():
            want = eager.run(p)
        torch.testing.assert_close(a.logits, want.logits, atol=2e-5, rtol=1e-5)
        assert (a.hidden is None) == (not p.hidden)
    written = outcome(backend, planned, cache, before)[1]
    for order in [range(len(planned)), reversed(range(len(planned))), (3, 0, 6, 1), (4, 2), (5,) * 1]:
        order = list(order)
        results, cache_after = outcome(backend, [planned[i] for i in order], cache, before)
        for i, got in zip(order, results, strict=True):
            assert torch.equal(got.logits, alone[i].logits), (order, i)
            assert got.hidden is None or torch.equal(got.hidden, alone[i].hidden)
        if len(order) == len(planned):
            assert torch.equal(cache_after[0], written[0]) and torch.equal(cache_after[1], written[1])


def test_a_plan_among_copies_of_others_at_every_offset(setup):
    """The decode row at every offset of a tile (behind 0..7 rows of other plans), bitwise the same."""
    model, cache = setup
    backend = InvariantForward(model, tile=4)
    planned = plans(model.cfg, cache)
    decode, fillers = planned[0], [planned[5], planned[2]]     # 3 and 4 read-only-safe rows ahead of it
    with torch.inference_mode():
        alone = backend.run(decode).logits
        for ahead in itertools.chain.from_iterable(itertools.combinations(fillers, k) for k in range(3)):
            got = backend.run_ragged([*ahead, decode])[-1].logits
            assert torch.equal(got, alone), len(ahead)


def test_rope_table_grows_without_changing_a_position(one_thread):
    model = random_model(CONFIGS["odd-scaled"])
    table = PositionTable(model, torch.device("cpu"))
    table.cover(10)
    cos, q = table.cos.clone(), table.q_scale.clone()
    table.cover(700)
    assert table.cos.shape[0] == 1024 and torch.equal(table.cos[:64], cos) and torch.equal(table.q_scale[:64], q)
    want_cos, _, want_q = model.rotary(torch.arange(1024)[None])
    torch.testing.assert_close(table.cos, want_cos.reshape(1024, -1))
    torch.testing.assert_close(table.q_scale, want_q.reshape(1024))


def test_folds_are_refused_and_the_choice_of_backend(one_thread):
    model = random_model(CONFIGS["qwen3-lora"])
    cache = filled_cache(model.cfg)
    with pytest.raises(ValueError, match="does not fold"):
        InvariantForward(model).run(ForwardPlan(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), "block",
                                                None, fold=Fold((-1, 0), 0.1)))
    eager = Eager(model)
    assert forward_backend(model, cache, eager, "auto", "torch")[0] == "torch"
    assert forward_backend(model, cache, eager, "float32", "auto")[0] in ("fused", "torch")
    with pytest.raises(MatmulUnavailable, match="fused CPU step"):
        forward_backend(model, cache, eager, "bf16", "torch")
    with pytest.raises(ForwardUnavailable, match="expected one of"):
        forward_backend(model, cache, eager, "auto", "eager")
    half = random_model(CONFIGS["qwen3-lora"]).half()
    half_cache = PagedKV.empty(half.cfg, 4, torch.float16, "cpu")
    assert forward_backend(half, half_cache, Eager(half), "auto", "auto")[0] == "torch"   # auto: no fused step
    with pytest.raises(ForwardUnavailable, match="--forward fused: float32 on the CPU only"):
        forward_backend(half, half_cache, Eager(half), "auto", "fused")
