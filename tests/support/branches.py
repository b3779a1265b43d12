"""Random draft branches for the folded-attention tests (tests/test_specfold.py, tests/test_packed_forward.py)
and the exact attention they must equal."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

CHAIN = [-1, 0, 1, 2, 3]             # depth 4: at density 0 every fold chain runs back to the main row
TREE = [-1, 0, 0, 1, 3, 2, 5, 0]     # siblings, and chains of depth 3

BRANCH_CASES = pytest.mark.parametrize("parents,heads,kv_heads,prefix,density", [
    (parents, heads, kv_heads, prefix, density) for parents in (CHAIN, TREE)
    for heads, kv_heads in ((4, 4), (4, 2), (6, 1)) for prefix in (0, 9) for density in (0.0, 0.3, 1.0)])


def reference_attention(q, k, v, recompute, parents, prefix_k, prefix_v):
    """Per branch, per position: SDPA of the inherited query over [prefix ‖ the branch's own block K/V],
    where every slot takes q/k/v from the nearest ancestor-or-self that recomputed it."""
    r, n = recompute.shape
    src = torch.empty(r, n, dtype=torch.long)
    for i in range(r):
        for p in range(n):
            j = i
            while not recompute[j, p]:
                j = parents[j]
            src[i, p] = j
    pos = torch.arange(n)
    own_q, own_k, own_v = q[src, pos], k[src, pos], v[src, pos]
    keys = torch.cat([prefix_k.expand(r, *prefix_k.shape), own_k], dim=1)
    values = torch.cat([prefix_v.expand(r, *prefix_v.shape), own_v], dim=1)
    out = F.scaled_dot_product_attention(own_q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                         enable_gqa=True)
    return out.transpose(1, 2), src


def random_branches(parents, heads, kv_heads, prefix, density):
    """q [R, N, H, hd], k, v [R, N, Hkv, hd], the prefix K/V [P, Hkv, hd] and recompute flags [R, N] (the main
    row always recomputes; below density 1, row 2 recomputes nothing: an empty set mid-chain)."""
    g = torch.Generator().manual_seed(hash((len(parents), heads, kv_heads, prefix, density)) % 2**31)
    r, n, hd = len(parents), 7, 16
    q = torch.randn(r, n, heads, hd, generator=g) * 2
    k = torch.randn(r, n, kv_heads, hd, generator=g) * 2
    v = torch.randn(r, n, kv_heads, hd, generator=g)
    pk, pv = torch.randn(prefix, kv_heads, hd, generator=g), torch.randn(prefix, kv_heads, hd, generator=g)
    recompute = torch.rand(r, n, generator=g) < density
    recompute[0] = True
    if density < 1:
        recompute[2] = False
    return q, k, v, pk, pv, recompute
