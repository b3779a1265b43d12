"""The I-DLM fused verify kernel against its twin (TRITON_INTERPRET=1): same decisions for fixed seeds."""
from __future__ import annotations

import pytest
import torch

from specscope.kernels.isd_verify import isd_verify_torch, isd_verify_triton

BANNED = 5


def case(k: int, v: int, agree: int, seed: int, sharp: float, spread: float = 1.5):
    """Clean/draft logits (draft = clean + noise of scale `spread`) whose first `agree` specs are the clean
    argmax; the rest drawn from the draft."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randn(k, v, generator=g) * sharp
    draft = clean + torch.randn(k, v, generator=g) * spread
    specs = torch.multinomial(torch.softmax(draft, -1), 1, generator=g)[:, 0]
    masked = clean.clone()
    masked[:, BANNED] = float("-inf")
    specs[:agree] = masked[:agree].argmax(-1)
    u = torch.rand(k, generator=g)
    gumbel = -torch.log(-torch.log(torch.rand(k, v, generator=g).clamp_min(1e-20)))
    return clean, draft, specs, u, gumbel


@pytest.mark.parametrize("k,v", [(3, 2048), (7, 300)])
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_verify_matches_twin(k, v, temperature, dtype):
    outcomes = set()
    for seed in range(6):
        clean, draft, specs, u, gumbel = case(k, v, agree=seed % (k + 1) if seed < 4 else k, seed=seed, sharp=3.0,
                                              spread=1.5 if seed < 4 else 0.01)
        clean, draft = clean.to(dtype), draft.to(dtype)
        noise = (None, None) if temperature == 0 else (u, gumbel)
        got = isd_verify_triton(clean, draft, specs, temperature, 1.0, BANNED, *noise)
        want = isd_verify_torch(clean, draft, specs, temperature, 1.0, BANNED, *noise)
        assert (got.accepted, got.correction) == (want.accepted, want.correction), seed
        torch.testing.assert_close(torch.tensor(got.p), torch.tensor(want.p), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(got.q), torch.tensor(want.q), atol=1e-5, rtol=1e-4)
        assert got.correction != BANNED
        outcomes.add(got.correction is None)
        if temperature == 0:                  # without the trace's p and q: the same verdict, no probabilities
            bare = isd_verify_torch(clean, draft, specs, temperature, 1.0, BANNED, *noise, probabilities=False)
            assert (bare.accepted, bare.correction, bare.p, bare.q) == (want.accepted, want.correction, [], [])
    assert outcomes == {True, False}          # both all-accepted and rejected cases were exercised


def test_greedy_accepts_exactly_the_argmax_prefix():
    clean, draft, specs, _, _ = case(5, 400, agree=2, seed=3, sharp=3.0)
    specs[2] = (specs[2] + 1) % 400 if specs[2] + 1 != BANNED else 0
    verdict = isd_verify_triton(clean, draft, specs, 0.0, 1.0, BANNED, None, None)
    masked = clean.clone()
    masked[:, BANNED] = float("-inf")
    assert verdict.accepted == 2 and verdict.correction == int(masked[2].argmax())
    assert len(verdict.p) == 3


def test_sampled_corrections_follow_the_residual_distribution():
    """Over many noise draws the correction at a forced reject is distributed as norm(max(0, p - q))."""
    v = 7                                            # token 6 is banned (the MASK)
    clean = torch.log(torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05, 3.0]]))
    draft = torch.log(torch.tensor([[0.1, 0.5, 0.1, 0.1, 0.1, 0.1, 3.0]]))
    specs = torch.tensor([1])                       # p/q = 0.4: rejected when u >= 0.4
    residual = (clean.exp() - draft.exp()).clamp(min=0)[0, :6]
    want = residual / residual.sum()
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(v)
    for _ in range(400):
        gumbel = -torch.log(-torch.log(torch.rand(1, v, generator=g)))
        verdict = isd_verify_torch(clean, draft, specs, 1.0, 1.0, 6, torch.ones(1), gumbel)
        counts[verdict.correction] += 1
    assert counts[6] == 0 and counts[:6][want == 0].sum() == 0
    assert (counts[:6] / counts.sum() - want).abs().max() < 0.08
