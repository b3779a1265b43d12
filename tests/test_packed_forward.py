"""The packed float32 CPU folded verify (kernels/packed_forward.py) against the float64 reference and dense."""
import pytest
import torch
from test_specfold import BRANCH_CASES, CHAIN, TREE, random_branches, reference_attention
from test_spiffy import engine_with_graph, graph_json

from backend.engine.modes.spiffy import DenseVerify
from kernels.folded_forward import make_folded_forward
from kernels.packed_forward import Packing, ancestor_table, attention_lse, attention_lse_plain, folded_attention
from kernels.reference import resolve_sources


@pytest.fixture(scope="module")
def spiffy_engine(loaded, tmp_path_factory):
    return engine_with_graph(loaded, tmp_path_factory.mktemp("graph"), graph_json())


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


@pytest.mark.parametrize("ffn_gate", ["paper", "strict"])
def test_packed_forward_equals_float64_reference_on_the_shipped_model(spiffy_engine, heldout_prompts, monkeypatch,
                                                                      ffn_gate):
    """Same recompute counts per layer and branch, logits within 1e-4, on real verify steps at two δ."""
    dense = DenseVerify.__call__
    compared = []

    def verify_compare(self, req, rt, start, ids, parents):
        logits = dense(self, req, rt, start, ids, parents)
        r = ids.shape[0]
        if r > 1:
            for delta in (0.05, 0.2):
                outs = []
                for backend in ("reference", "torch"):
                    f = make_folded_forward(rt.model, parents, delta, ffn_gate=ffn_gate, backend=backend)
                    outs.append((rt.forward([req] * r, ids, [start] * r, "block", kind="verify", model=f), f))
                (want, ref), (got, fast) = outs
                assert fast.recomputed == ref.recomputed and fast.ffn_recomputed == ref.ffn_recomputed
                torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
                draft_rows = (r - 1) * ids.shape[1] * len(ref.recomputed)
                compared.append(sum(sum(layer[1:]) for layer in ref.recomputed) / draft_rows)
        return logits

    monkeypatch.setattr(DenseVerify, "__call__", verify_compare)
    for prompt in heldout_prompts[::4]:
        spiffy_engine.generate(prompt, "spiffy", {"max_new_tokens": 16})
        if len(compared) >= 8:
            break
    assert len(compared) >= 8
    assert min(compared) < 0.5 and max(compared) > 0      # both folded and recomputed draft rows were exercised


def test_factory_rejects_unknown_backend_and_gate(loaded):
    with pytest.raises(ValueError, match="backend 'cuda'"):
        make_folded_forward(loaded.model, [-1, 0], 0.1, backend="cuda")
    for backend in ("torch", "reference", "triton"):
        with pytest.raises(ValueError, match="ffn_gate 'both'"):
            make_folded_forward(loaded.model, [-1, 0], 0.1, ffn_gate="both", backend=backend)
