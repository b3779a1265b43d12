"""Every SpecFold kernel against its PyTorch twin under TRITON_INTERPRET=1 (small shapes, few programs)."""
from __future__ import annotations

import pytest
import torch

from specscope.backend.model.transformer import rope_cos_sin
from specscope.kernels import attention, ffn, gate, invariant, qkv, sources

CHAIN = [-1, 0, 1, 2]            # depth-3 fold chain
TREE = [-1, 0, 0, 1, 1, 2, 3, 4]  # 8 branches
TOL = {torch.float32: 1e-4, torch.float16: 2e-2}


def branch_states(parents: list[int], n: int, d: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """h [R, N, D]: each branch copies its parent and perturbs some positions by widely varying amounts."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(len(parents), n, d, generator=g)
    for i in range(1, len(parents)):
        scale = torch.rand(n, 1, generator=g) * (torch.rand(n, 1, generator=g) < 0.5)
        h[i] = h[parents[i]] + scale * torch.randn(n, d, generator=g)
    return h.to(dtype)


def recompute_pattern(r: int, n: int, kind: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rec = {"random": torch.rand(r, n, generator=g) < 0.4, "empty": torch.zeros(r, n, dtype=torch.bool),
           "full": torch.ones(r, n, dtype=torch.bool)}[kind]
    rec[0] = True
    return rec


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("parents,n", [([-1], 8), (CHAIN, 13), (TREE, 32)])
@pytest.mark.parametrize("delta", [0.0, 0.3])
def test_gate_and_compaction_match_twin(dtype, parents, n, delta):
    h = branch_states(parents, n, 48, dtype)
    rows = gate.parent_rows(parents, h.device)
    got, want = gate.fold_gate_triton(h, rows, delta), gate.fold_gate_torch(h, rows, delta)
    assert torch.equal(got.recompute, want.recompute)
    assert got.total == want.total == int(want.recompute.sum())
    assert torch.equal(got.recomputed_rows.sort().values, want.recomputed_rows.sort().values)
    assert torch.equal(got.folded_rows.sort().values, want.folded_rows.sort().values)
    assert torch.equal(torch.cat([want.recomputed_rows, want.folded_rows]).sort().values,
                       torch.arange(want.rows.numel(), dtype=torch.int32))
    assert torch.equal(got.branch_counts, want.branch_counts)
    for i, c in enumerate(want.branch_counts.tolist()):
        assert torch.equal(got.branch_rows[i, :c].sort().values, want.branch_rows[i, :c])
    if delta == 0.0:   # δ = 0 folds exactly the positions equal to the parent's
        same = (h[1:] == h[torch.tensor(parents[1:], dtype=torch.long)]).all(-1)
        assert torch.equal(~want.recompute[1:], same)


@pytest.mark.parametrize("parents", [CHAIN, TREE])
@pytest.mark.parametrize("kind", ["random", "empty", "full"])
def test_sources_walk_fold_chains(parents, kind):
    n = 11
    rec = recompute_pattern(len(parents), n, kind)
    rows = gate.parent_rows(parents, rec.device)
    got, want = sources.resolve_sources_triton(rec, rows), sources.resolve_sources_torch(rec, rows)
    assert torch.equal(got, want)
    for i in range(len(parents)):        # the source recomputed the position and is an ancestor-or-self
        for pos in range(n):
            s = int(want[i, pos]) // n
            assert rec[s, pos] and int(want[i, pos]) % n == pos
            a = i
            while a != s:
                assert not rec[a, pos]
                a = parents[a]


def qkv_weights(d: int, heads: int, kv_heads: int, hd: int, dtype: torch.dtype, bias: bool, norm: bool,
                seed: int = 1) -> qkv.QKVWeights:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)
    return qkv.QKVWeights(1 + rnd(d), rnd(heads * hd, d), rnd(kv_heads * hd, d), rnd(kv_heads * hd, d),
                          rnd(heads * hd) if bias else None, rnd(kv_heads * hd) if bias else None,
                          rnd(kv_heads * hd) if bias else None, 1 + rnd(hd) if norm else None,
                          1 + rnd(hd) if norm else None)


def tables(rn: int, heads: int, kv_heads: int, hd: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return (torch.full((rn, heads, hd), 7.0, dtype=dtype), torch.full((rn, kv_heads, hd), 7.0, dtype=dtype),
            torch.full((rn, kv_heads, hd), 7.0, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias,norm", [(False, True), (True, False)])
@pytest.mark.parametrize("kind", ["random", "empty", "full"])
@pytest.mark.parametrize("r,n", [(1, 8), (3, 13), (8, 32)])
def test_packed_qkv_matches_twin_and_leaves_folded_slots(dtype, bias, norm, kind, r, n):
    d, heads, kv_heads, hd = 48, 4, 2, 32
    h = torch.randn(r * n, d).to(dtype)
    rows = recompute_pattern(r, n, kind).flatten().nonzero()[:, 0].int()
    w = qkv_weights(d, heads, kv_heads, hd, dtype, bias, norm)
    cos, sin = (t[0, :, 0] for t in rope_cos_sin(torch.arange(5, 5 + n)[None], hd, 10000.0))
    got, want = tables(r * n, heads, kv_heads, hd, dtype), tables(r * n, heads, kv_heads, hd, dtype)
    qkv.packed_qkv_triton(h, rows, w, cos, sin, *got)
    qkv.packed_qkv_torch(h, rows, w, cos, sin, *want)
    untouched = torch.ones(r * n, dtype=torch.bool)
    untouched[rows.long()] = False
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype], rtol=TOL[dtype])
        assert (a[untouched] == 7.0).all()


def test_packed_qkv_twin_equals_the_model_projection(loaded):
    layer = loaded.model.layers[0]
    cfg = loaded.model.cfg
    from specscope.backend.forward.folded import layer_weights
    w, _ = layer_weights(layer, cfg.rms_norm_eps)
    n = 9
    h = torch.randn(n, cfg.hidden_size)
    cos, sin = rope_cos_sin(torch.arange(n)[None], cfg.head_dim, cfg.rope_theta)
    want = layer.self_attn.qkv(layer.input_layernorm(h)[None], cos, sin, False)
    got = tables(n, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, torch.float32)
    with torch.no_grad():
        qkv.packed_qkv_torch(h, torch.arange(n, dtype=torch.int32), w, cos[0, :, 0], sin[0, :, 0], *got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b[0], atol=1e-5, rtol=1e-5)


def attention_case(parents, n, p, dtype, kind, seed=0, heads=4, kv_heads=2):
    r, hd, slots_total = len(parents), 32, 64
    g = torch.Generator().manual_seed(seed)
    rec = recompute_pattern(r, n, kind, seed)
    q, k, v = (torch.randn(r * n, hh, hd, generator=g).to(dtype) for hh in (heads, kv_heads, kv_heads))
    cache_k, cache_v = (torch.randn(slots_total, kv_heads, hd, generator=g).to(dtype) for _ in range(2))
    slots = torch.randperm(slots_total, generator=g)[:p].int()
    src = sources.resolve_sources_torch(rec, gate.parent_rows(parents, rec.device))
    rows = rec.flatten().nonzero()[:, 0].int()
    folded = (~rec).flatten().nonzero()[:, 0].int()
    return q, k, v, rows, folded, src, cache_k, cache_v, slots


CASES = [([-1], 8, 5), ([-1, 0], 8, 0), (CHAIN, 13, 37), (TREE, 32, 70)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("parents,n,p", CASES)
@pytest.mark.parametrize("kind", ["random", "full", "empty"])
def test_attention_and_folded_correction_match_twin(dtype, parents, n, p, kind):
    check_attention(dtype, parents, n, p, kind, 4, 2)


@pytest.mark.parametrize("parents,n,p", CASES)
@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4)])
def test_attention_head_layouts_match_twin(parents, n, p, heads, kv_heads):
    """A query-head group of 3 (padded to 4 in the tile) and plain multi-head attention."""
    check_attention(torch.float32, parents, n, p, "random", heads, kv_heads)


def check_attention(dtype, parents, n, p, kind, heads, kv_heads):
    q, k, v, rows, folded, src, cache_k, cache_v, slots = attention_case(parents, n, p, dtype, kind,
                                                                         heads=heads, kv_heads=kv_heads)
    rn, heads, hd = q.shape
    outs = []
    for prefix_op, fold_op in ((attention.prefix_block_attention_triton, attention.folded_correction_triton),
                               (attention.prefix_block_attention_torch, attention.folded_correction_torch)):
        out = torch.zeros(rn, heads, hd, dtype=dtype)
        state = attention.PrefixState.empty(rn, heads, hd, q.device)
        prefix_op(q, k, v, rows, src, cache_k, cache_v, slots, out, state)
        fold_op(q, k, v, folded, src, out, state)
        outs.append((out, state))
    (got, gs), (want, ws) = outs
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    r = rows.long()
    torch.testing.assert_close(gs.m[r], ws.m[r], atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(gs.z[r], ws.z[r], atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("kind", ["random", "empty"])
def test_folded_rows_equal_their_exact_attention(kind):
    """A folded row's output is the exact attention of its source's query over [prefix ‖ its own block]."""
    parents, n, p = CHAIN, 13, 37
    q, k, v, rows, folded, src, cache_k, cache_v, slots = attention_case(parents, n, p, torch.float32, kind)
    rn, heads, hd = q.shape
    out = torch.zeros(rn, heads, hd)
    state = attention.PrefixState.empty(rn, heads, hd, q.device)
    attention.prefix_block_attention_triton(q, k, v, rows, src, cache_k, cache_v, slots, out, state)
    attention.folded_correction_triton(q, k, v, folded, src, out, state)
    flat_src = src.flatten().long()
    for row in range(rn):
        own = src[row // n].long()
        keys = torch.cat([cache_k[slots.long()], k[own]]).repeat_interleave(2, dim=1)
        vals = torch.cat([cache_v[slots.long()], v[own]]).repeat_interleave(2, dim=1)
        w = torch.softmax(torch.einsum("hd,khd->hk", q[flat_src[row]], keys) * hd ** -0.5, dim=-1)
        torch.testing.assert_close(out[row], torch.einsum("hk,khd->hd", w, vals), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", ["random", "empty", "full"])
@pytest.mark.parametrize("parents,n", [([-1], 8), (CHAIN, 13), (TREE, 32)])
def test_packed_ffn_and_source_residual_match_twin(dtype, kind, parents, n):
    d, inter = 48, 80
    g = torch.Generator().manual_seed(3)
    rec = recompute_pattern(len(parents), n, kind)
    rows = rec.flatten().nonzero()[:, 0].int()
    w = ffn.FFNWeights(*(t.to(dtype) for t in (1 + 0.2 * torch.randn(d, generator=g),
                                               0.2 * torch.randn(inter, d, generator=g),
                                               0.2 * torch.randn(inter, d, generator=g),
                                               0.2 * torch.randn(d, inter, generator=g))))
    h = torch.randn(len(parents) * n, d, generator=g).to(dtype)
    src = sources.resolve_sources_torch(rec, gate.parent_rows(parents, rec.device))
    results = []
    for ffn_op, add_op in ((ffn.packed_ffn_triton, ffn.add_from_sources_triton),
                           (ffn.packed_ffn_torch, ffn.add_from_sources_torch)):
        table = torch.full_like(h, 7.0)
        ffn_op(h, rows, w, table)
        out = h.clone()
        add_op(out, table, src)
        results.append((table, out))
    (t1, o1), (t2, o2) = results
    r = rows.long()
    torch.testing.assert_close(t1[r].float(), t2[r].float(), atol=TOL[dtype] * 5, rtol=TOL[dtype])
    torch.testing.assert_close(o1.float(), o2.float(), atol=TOL[dtype] * 5, rtol=TOL[dtype])


def test_kernel_bench_runs_the_tiny_config_on_cpu(tmp_path):
    """`specscope bench-kernels --tiny`: the GPU script's code path, on CPU with the twins."""
    from specscope.lab import kernel_bench as bench
    result = bench.bench(bench.TINY, "cpu", tiny=True)
    rows = result["rows"]
    assert len(rows) == len(bench.TINY.branches) * len(bench.TINY.prefixes) * len(bench.TINY.folds)
    for row in rows:
        assert row["dense_ms"] > 0 and row["folded_ms"] > 0
        if row["target_fold"] == 0:
            assert row["fold_qkv"] == 0 and row["layer0_max_diff"] < 1e-4
        else:
            assert 0 < row["fold_qkv"] <= 1 and 0 <= row["fold_ffn"] <= 1
    assert "speedup" in bench.table(result)


@pytest.mark.slow   # several seconds: left out of make test-fast
def test_every_kernel_compiles_for_an_h200_without_one(tmp_path):
    """The GPU compiler (not the interpreter) accepts every kernel for sm_90a, with no register spills."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "tools.compile_check", "--arch", "90"], capture_output=True,
                         text=True, env=env, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 14 and all(line.startswith("ok ") for line in lines), out.stdout
    assert all("spill stores 0 B" in line for line in lines), out.stdout


@pytest.mark.parametrize("op", ["torch", "torch-input-major", pytest.param("triton", marks=pytest.mark.slow)])
def test_a_batch_invariant_linear_gives_a_row_alone_what_it_gives_among_others(op):
    """kernels/invariant.py's linear: a row alone, and the same row at every position among 2 to 16 random rows
    (across the twin's tiles; the kernel's blocks), bitwise the same."""
    g = torch.Generator().manual_seed(len(op))
    k, n = (72, 40) if op == "triton" else (256, 768)     # the kernel's K and N tails masked
    w = torch.randn(n, k, generator=g) * 0.05
    if op == "torch-input-major":
        w = w.t().contiguous().t()   # Transformer.store_weights_input_major's layout
    linear = invariant.linear_triton if op == "triton" else invariant.linear_torch
    row = torch.randn(1, k, generator=g)
    alone = linear(row, w)[0]
    torch.testing.assert_close(alone, (row @ w.t())[0], atol=1e-5, rtol=1e-5)
    for m in (2, 7, 16) if op == "triton" else range(2, 17):     # the interpreter runs a program at a time
        others = torch.randn(m, k, generator=g)
        for at in range(m):
            x = others.clone()
            x[at] = row[0]
            assert torch.equal(linear(x, w)[at], alone), (m, at)


@pytest.mark.parametrize("width", [768, 256, 100])
def test_row_wise_ops_give_a_row_alone_what_they_give_among_others(width):
    """kernels/invariant.py's by_rows (a norm, SiLU): a row in a tile of its own, and at every position among
    others in several tiles, bitwise the same; a width no multiple of the vector step goes a row per call (a plain
    SiLU rounds a row's scalar tail otherwise than its vector body)."""
    from specscope.backend.model.transformer import RMSNorm
    g = torch.Generator().manual_seed(width)
    norm = RMSNorm(width, 1e-6)
    norm.weight.data = torch.randn(width, generator=g)
    tile = invariant.ROW_TILE
    row = torch.randn(width, generator=g) * 4
    for op in (invariant.silu, lambda x: invariant.by_rows(norm, x)):
        alone = op(torch.cat([row[None], torch.zeros(tile - 1, width)]))[0]
        for at in range(0, 3 * tile, 5):
            x = torch.randn(3 * tile, width, generator=g) * 4
            x[at] = row
            assert torch.equal(op(x)[at], alone), at
    with pytest.raises(ValueError, match="multiple"):
        invariant.by_rows(norm, torch.zeros(tile + 1, 768))
