"""The packed float32 CPU folded verify (backend/forward/packed.py) against the float64 reference and dense."""
import pytest
import torch
from support.branches import BRANCH_CASES, CHAIN, TREE, random_branches, reference_attention
from support.fold_oracle import fold_backend, resolve_sources
from support.spiffy import branch_logits

from specscope.backend.engine.modes.spiffy import DenseVerify
from specscope.backend.forward.folded import folded_backend
from specscope.backend.forward.packed import (
    BlockRope,
    Packing,
    ancestor_table,
    attention_lse,
    attention_lse_plain,
    folded_attention,
    norm_packed,
    packed_qkv,
)
from specscope.backend.forward.plan import Fold, ForwardPlan
from specscope.backend.model.config import ModelConfig
from specscope.backend.model.rope import RopeSpec
from specscope.backend.model.transformer import Transformer
from specscope.kernels import cpu_fold
from specscope.kernels.gate import parent_rows, recompute_flags
from specscope.kernels.native import FLAGS, build, load


@pytest.mark.parametrize("parents", [CHAIN, TREE])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_packing_sources_follow_fold_chains(parents, density):
    g = torch.Generator().manual_seed(int(density * 10) + len(parents))
    rec = torch.rand(len(parents), 9, generator=g) < density
    rec[0] = True
    pack = Packing.of(rec, ancestor_table(parents, rec.device))
    assert torch.equal(pack.rows, rec.flatten().nonzero()[:, 0])
    want = resolve_sources(rec, parents) * rec.shape[1] + torch.arange(rec.shape[1])
    assert torch.equal(pack.rows[pack.source], want)


def branch_states(parents: list[int], n: int, d: int, seed: int) -> torch.Tensor:
    """Layer inputs [R, N, D]: each branch its parent's plus noise of a scale drawn per position (0 to 0.4)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(len(parents), n, d, generator=g)
    for i, p in enumerate(parents[1:], 1):
        scale = torch.rand(n, 1, generator=g) * 0.4 * (torch.rand(n, 1, generator=g) < 0.7)
        h[i] = h[p] + scale * torch.randn(n, d, generator=g)
    return h


@pytest.mark.parametrize("flags", [FLAGS, ("-O1", "-shared", "-fPIC")], ids=["native", "plain-c"])
@pytest.mark.parametrize("parents", [CHAIN, TREE, [-1]])
@pytest.mark.parametrize("d", [256, 40, 7])
def test_c_gate_packs_as_the_tensor_gate(monkeypatch, flags, parents, d):
    """cpu_fold.c's gate and packing (vector lanes and their tail) give the tensor ops' rows, sources and counts,
    but where a residual sits within float32 rounding of the threshold (its sums run in another order)."""
    path = build("cc", flags)
    assert path is not None
    monkeypatch.setattr(cpu_fold, "library", lambda: load(path))
    ancestors = ancestor_table(parents, torch.device("cpu"))
    parent_index = parent_rows(parents, torch.device("cpu")).long()
    for seed, delta in enumerate((0.0, 0.05, 0.1, 0.3, 1.0)):
        h = branch_states(parents, 13, d, seed)
        assert cpu_fold.fold_gate(h, parent_index, ancestors, delta) is not None   # the C gate, not the fallback
        got = Packing.gate(h, parent_index, ancestors, delta)
        narrow = Packing.gate(h, parent_index.int(), ancestors.int(), delta)       # int32 indices are widened
        assert torch.equal(narrow.rows, got.rows) and torch.equal(narrow.source, got.source)
        rec = recompute_flags(h, parent_index, delta)
        y = h.double()[parent_index]
        margin = ((h.double() - y).pow(2).sum(-1) - delta * delta * y.pow(2).sum(-1)).abs() / y.pow(2).sum(-1)
        flips = (got.rows.new_zeros(rec.numel(), dtype=torch.bool).index_fill_(0, got.rows, True).view_as(rec) != rec)
        assert not flips[margin > 1e-5].any()
        if not flips.any():
            want = Packing.of(rec, ancestors)
            assert torch.equal(got.rows, want.rows) and torch.equal(got.source, want.source)
            assert torch.equal(got.counts, want.counts)
        assert 0 < rec.sum() < rec.numel() or len(parents) == 1 or delta in (0.0, 1.0)


@pytest.fixture(params=[FLAGS, ("-O1", "-shared", "-fPIC"), None], ids=["native", "plain-c", "tensor-ops"])
def fold_lib(request, monkeypatch):
    """cpu_fold.c built with these flags, or no library (the tensor ops); whether there is one."""
    path = request.param and build("cc", request.param)
    assert path is not None or request.param is None
    monkeypatch.setattr(cpu_fold, "library", lambda: path and load(path))
    return bool(path)


@pytest.mark.parametrize("cfg", [
    ModelConfig(vocab_size=64, hidden_size=40, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=10),
    ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=48, num_hidden_layers=1, num_attention_heads=3,
                num_key_value_heads=1, head_dim=32, family="ministral3", qk_norm=False, qkv_bias=True,
                rope=RopeSpec(rope_type="yarn", factor=4.0, original_max_position_embeddings=4,
                              llama_4_scaling_beta=0.1))], ids=["qk-norm", "yarn-query-scale-bias"])
def test_c_norms_and_rope_on_packed_rows_equal_the_models_own(cfg, fold_lib):
    """cpu_fold.c's input RMSNorm of the packed rows and their q/k-norm, RoPE and query scale against the
    model's modules (Attention.qkv), on rows at scattered block positions and a block past the scale's start."""
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    layer = model.layers[0]
    for module in (layer.input_layernorm, *((layer.self_attn.q_norm, layer.self_attn.k_norm) if cfg.qk_norm else ())):
        module.weight.data = 1 + 0.3 * torch.randn_like(module.weight)
    n = 11
    h = torch.randn(3 * n, cfg.hidden_size) * 2
    rows = torch.tensor([0, 3, 4, 12, 20, 21, 32])
    positions = torch.arange(5, 5 + n)[None]
    rope = BlockRope.of(*model.rotary(positions))
    assert (rope.q_scale is not None) == (cfg.family == "ministral3")
    with torch.no_grad():
        x = norm_packed(layer.input_layernorm, h, rows)
        torch.testing.assert_close(x, layer.input_layernorm(h[rows]), atol=1e-6, rtol=1e-5)
        pos = rows % n
        got = packed_qkv(layer.self_attn, x, rope, pos, False)
        cos, sin, scale = model.rotary(positions[:, pos])
        want = layer.self_attn.qkv(x[None], cos, sin, False, scale)
    assert (cpu_fold.native(x) is not None) == fold_lib
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w[0], atol=1e-5, rtol=1e-5)


def test_the_gate_runs_as_tensor_ops_where_c_does_not_apply(monkeypatch):
    parents = TREE
    h = branch_states(parents, 9, 16, 0)
    ancestors, parent_index = ancestor_table(parents, h.device), parent_rows(parents, h.device).long()
    assert cpu_fold.fold_gate(h.double(), parent_index, ancestors, 0.1) is None
    monkeypatch.setattr(cpu_fold, "library", lambda: None)
    assert cpu_fold.fold_gate(h, parent_index, ancestors, 0.1) is None
    got, want = Packing.gate(h, parent_index, ancestors, 0.1), Packing.of(recompute_flags(h, parent_index, 0.1),
                                                                          ancestors)
    assert torch.equal(got.rows, want.rows) and torch.equal(got.source, want.source)


@BRANCH_CASES
def test_folded_attention_equals_exact_attention_over_own_kv(parents, heads, kv_heads, prefix, density):
    q, k, v, pk, pv, rec = random_branches(parents, heads, kv_heads, prefix, density)
    pack = Packing.of(rec, ancestor_table(parents, rec.device))
    n = rec.shape[1]
    rows = (pack.rows // n, pack.rows % n)
    got = folded_attention(q[rows], k[rows], v[rows], pack.source, pk, pv)
    want, _ = reference_attention(q, k, v, rec, parents, pk, pv)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want.flatten(2), atol=1e-5, rtol=1e-5)


def test_fused_cpu_attention_state_equals_plain_ops():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, 2, length, 16, generator=g) * 3 for length in (10, 7, 7))
    for got, want in zip(attention_lse(q, k, v), attention_lse_plain(q, k, v), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("ffn_gate", ["paper", "strict"])
def test_packed_forward_equals_float64_reference_on_the_shipped_model(spiffy_engine, heldout_prompts, monkeypatch,
                                                                      ffn_gate):
    """Same recompute counts per layer and branch, logits within 1e-4, on real verify steps at two δ."""
    dense = DenseVerify.__call__
    compared = []

    def verify_compare(self, req, rt, start, states, parents):
        scores = yield from dense(self, req, rt, start, states, parents)
        r = len(states)
        if r > 1:
            for delta in (0.05, 0.2):
                outs = []
                for backend in ("reference", "torch"):
                    outs.append(branch_logits(rt, req, start, states, fold_backend(rt.model, backend),
                                              Fold(tuple(parents), delta, ffn_gate)))
                (want, ref), (got, fast) = outs
                assert fast == ref
                torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
                draft_rows = (r - 1) * len(states[0]) * len(ref.qkv)
                compared.append(sum(sum(layer[1:]) for layer in ref.qkv) / draft_rows)
        return scores

    monkeypatch.setattr(DenseVerify, "__call__", verify_compare)
    for prompt in heldout_prompts[::4]:
        spiffy_engine.generate(prompt, "spiffy", {"max_new_tokens": 16})
        if len(compared) >= 8:
            break
    assert len(compared) >= 8
    assert min(compared) < 0.5 and max(compared) > 0      # both folded and recomputed draft rows were exercised


def test_factory_and_plans_reject_what_they_cannot_run(loaded):
    with pytest.raises(ValueError, match="backend 'cuda'"):
        folded_backend(loaded.model, "cuda")
    with pytest.raises(ValueError, match="ffn_gate 'both'"):
        Fold((-1, 0), 0.1, "both")
    ids, positions = torch.zeros(2, 3, dtype=torch.long), torch.arange(3).expand(2, 3)
    for backend in ("torch", "reference", "triton"):
        folded = fold_backend(loaded.model, backend)
        with pytest.raises(ValueError, match="a fold, block attention"):
            folded.run(ForwardPlan(ids, positions, "block", None))
        with pytest.raises(ValueError, match="3 branches for 2 rows"):
            folded.run(ForwardPlan(ids, positions, "block", None, fold=Fold((-1, 0, 0), 0.1)))
