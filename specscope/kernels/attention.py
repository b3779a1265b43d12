"""Kernels 4 and 5: attention of the branch rows of one folded verification.

Every (branch i, position n) row attends `block`-wise to the shared prefix and to its own branch's block,
whose key/value at position k lives at flat row src[i, k] of the K/V tables (its nearest recomputing
ancestor). The prefix is read in place from the paged KV cache through its slot list (one zero-copy view for
all branches).

4. `prefix_block_attention`, recomputed rows: a streaming (FlashAttention-style) pass over the prefix tiles
   that saves the prefix-only state (m, Z, O) per row and head, then the row's own block, then O.
5. `folded_correction`, folded rows: start from the source row's prefix state and add this branch's block
   keys. A folded row's query equals its source's, so this equals swapping in the keys that differ, exactly.
   Deviation from the float64 oracle (tests/support/fold_oracle.py), which removes the source's differing
   block keys from its full state: that subtraction cancels badly in float32 when the removed keys dominate,
   while re-adding all N ≤ 32 block keys to the stored prefix state costs the same order and never subtracts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specscope.kernels import next_pow2, tile


@dataclass
class PrefixState:
    """Per flat row and head: the softmax state over the shared prefix alone (written for recomputed rows)."""
    m: Tensor      # [R*N, H] running max (-inf with no prefix)
    z: Tensor      # [R*N, H] denominator
    o: Tensor      # [R*N, H, hd] normalised output over the prefix (0 with no prefix)

    @classmethod
    def empty(cls, rows: int, heads: int, head_dim: int, device: torch.device) -> PrefixState:
        return cls(torch.empty(rows, heads, device=device), torch.empty(rows, heads, device=device),
                   torch.empty(rows, heads, head_dim, device=device))


@triton.jit
def _block_keys(q, m_i, z_i, acc, row, k_ptr, v_ptr, src_ptr, N, scale, kvh, HKV: tl.constexpr, HD: tl.constexpr):
    """Add the N block keys of each row's own branch to its state, one key at a time (a gather per row,
    2-D tiles only); returns (m, z, acc)."""
    valid = row >= 0
    branch = row // N
    d = tl.arange(0, HD)
    for k in range(N):
        src = tl.load(src_ptr + branch * N + k, mask=valid, other=0)
        kv_off = src[:, None] * (HKV * HD) + kvh * HD + d[None, :]
        key = tl.load(k_ptr + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q * key, axis=1) * scale
        m_new = tl.maximum(m_i, s)
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        val = tl.load(v_ptr + kv_off, mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + p[:, None] * val
        z_i = z_i * alpha + p
        m_i = m_new
    return m_i, z_i, acc


@triton.jit
def _group_rows(rows_ptr, M, H: tl.constexpr, HKV: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr):
    """The tile of one program: BLOCK_M flat rows × the GROUP query heads that share KV head program_id(1),
    packed into BLOCK_M·GROUP tile rows, so each K/V tile is read once for the whole group.
    Returns (row, head, valid) per tile row; row is -1 where invalid."""
    kvh = tl.program_id(1)
    r = tl.arange(0, BLOCK_M * GROUP)
    mi = tl.program_id(0) * BLOCK_M + r % BLOCK_M
    g = r // BLOCK_M
    valid = (mi < M) & (g < H // HKV)
    row = tl.load(rows_ptr + mi, mask=valid, other=-1)
    return tl.where(valid, row, -1), kvh * (H // HKV) + g, valid


@triton.jit
def _prefix_block_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, src_ptr, kc_ptr, vc_ptr, slots_ptr, o_ptr,
                         pm_ptr, pz_ptr, po_ptr, M, N, P, scale, H: tl.constexpr, HKV: tl.constexpr,
                         HD: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr, BLOCK_P: tl.constexpr):
    kvh = tl.program_id(1)
    row, head, valid = _group_rows(rows_ptr, M, H, HKV, BLOCK_M, GROUP)
    d = tl.arange(0, HD)
    q = tl.load(q_ptr + row[:, None] * (H * HD) + head[:, None] * HD + d[None, :], mask=valid[:, None], other=0.0)
    m_i = tl.full([BLOCK_M * GROUP], float("-inf"), dtype=tl.float32)
    z_i = tl.zeros([BLOCK_M * GROUP], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP, HD], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        in_p = p < P
        slot = tl.load(slots_ptr + p, mask=in_p, other=0)
        kv_off = slot[None, :] * (HKV * HD) + kvh * HD + d[:, None]
        keys = tl.load(kc_ptr + kv_off, mask=in_p[None, :], other=0.0)
        s = tl.dot(q, keys, input_precision="ieee").to(tl.float32) * scale
        s = tl.where(in_p[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        w = tl.exp(s - m_use[:, None])
        vals = tl.load(vc_ptr + tl.trans(kv_off), mask=in_p[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(w.to(vals.dtype), vals, input_precision="ieee")
        z_i = z_i * alpha + tl.sum(w, axis=1)
        m_i = m_new
    state = row * H + head
    tl.store(pm_ptr + state, m_i, mask=valid)
    tl.store(pz_ptr + state, z_i, mask=valid)
    tl.store(po_ptr + state[:, None] * HD + d[None, :], acc / tl.maximum(z_i, 1e-30)[:, None], mask=valid[:, None])
    m_i, z_i, acc = _block_keys(q.to(tl.float32), m_i, z_i, acc, row, k_ptr, v_ptr, src_ptr, N, scale, kvh,
                                HKV, HD)
    out = o_ptr + row[:, None] * (H * HD) + head[:, None] * HD + d[None, :]
    tl.store(out, (acc / tl.where(valid, z_i, 1.0)[:, None]).to(o_ptr.dtype.element_ty), mask=valid[:, None])


@triton.jit
def _folded_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, src_ptr, o_ptr, pm_ptr, pz_ptr, po_ptr, M, N, scale,
                   H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr):
    kvh = tl.program_id(1)
    row, head, valid = _group_rows(rows_ptr, M, H, HKV, BLOCK_M, GROUP)
    source = tl.load(src_ptr + row, mask=valid, other=0)
    d = tl.arange(0, HD)
    q = tl.load(q_ptr + source[:, None] * (H * HD) + head[:, None] * HD + d[None, :], mask=valid[:, None],
                other=0.0)
    state = source * H + head
    m_i = tl.load(pm_ptr + state, mask=valid, other=float("-inf"))
    z_i = tl.load(pz_ptr + state, mask=valid, other=0.0)
    acc = tl.load(po_ptr + state[:, None] * HD + d[None, :], mask=valid[:, None], other=0.0) * z_i[:, None]
    m_i, z_i, acc = _block_keys(q.to(tl.float32), m_i, z_i, acc, row, k_ptr, v_ptr, src_ptr, N, scale, kvh,
                                HKV, HD)
    out = o_ptr + row[:, None] * (H * HD) + head[:, None] * HD + d[None, :]
    tl.store(out, (acc / tl.where(valid, z_i, 1.0)[:, None]).to(o_ptr.dtype.element_ty), mask=valid[:, None])


def grouped_tile(rows: int, group: int) -> tuple[int, int]:
    """(BLOCK_M, GROUP): flat rows per program and the query-head group padded to a power of two, so that a
    tile holds about 64 rows on a GPU (the wgmma minimum)."""
    group = next_pow2(group)
    return tile(rows, max(1, 64 // group), lo=1), group


def prefix_block_attention_triton(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, src: Tensor, k_cache: Tensor,
                                  v_cache: Tensor, slots: Tensor, out: Tensor, state: PrefixState) -> None:
    """q [R*N, H, hd], k/v [R*N, Hkv, hd] tables; rows [M] recomputed flat rows; src [R, N] flat source rows;
    k/v_cache [S, Hkv, hd] paged prefix memory read at slots [P]; writes out [R*N, H, hd] and the prefix
    state at `rows`."""
    m, n, p = rows.numel(), src.shape[1], slots.numel()
    if m == 0:
        return
    heads, kv_heads, hd = q.shape[1], k.shape[1], q.shape[2]
    block_m, group = grouped_tile(m, heads // kv_heads)
    _prefix_block_kernel[(triton.cdiv(m, block_m), kv_heads)](
        q, k, v, rows, src, k_cache, v_cache, slots, out, state.m, state.z, state.o, m, n, p, hd ** -0.5,
        H=heads, HKV=kv_heads, HD=hd, BLOCK_M=block_m, GROUP=group, BLOCK_P=tile(p, 64))


def folded_correction_triton(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, src: Tensor, out: Tensor,
                             state: PrefixState) -> None:
    """rows [F] folded flat rows: out[row] = attention of the source's query over the source's prefix
    state plus this branch's block keys."""
    f, n = rows.numel(), src.shape[1]
    if f == 0:
        return
    heads, kv_heads, hd = q.shape[1], k.shape[1], q.shape[2]
    block_m, group = grouped_tile(f, heads // kv_heads)
    _folded_kernel[(triton.cdiv(f, block_m), kv_heads)](
        q, k, v, rows, src, out, state.m, state.z, state.o, f, n, hd ** -0.5,
        H=heads, HKV=kv_heads, HD=hd, BLOCK_M=block_m, GROUP=group)



def _grouped(x: Tensor, heads: int) -> Tensor:
    """[..., Hkv, hd] -> [..., H, hd] by repeating each kv head for its query group."""
    return x.repeat_interleave(heads // x.shape[-2], dim=-2)


def _add_block(q: Tensor, m: Tensor, z: Tensor, acc: Tensor, rows: Tensor, k: Tensor, v: Tensor,
               src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The twin of _block_keys: q [M, H, hd] float32, state (m, z [M, H], acc [M, H, hd])."""
    heads, n = q.shape[1], src.shape[1]
    own = src[rows // n].long()                                            # [M, N] flat K/V rows
    keys, vals = _grouped(k[own].float(), heads), _grouped(v[own].float(), heads)   # [M, N, H, hd]
    s = torch.einsum("mhd,mnhd->mhn", q, keys) * q.shape[-1] ** -0.5
    m_new = torch.maximum(m, s.amax(-1))
    m_use = torch.where(m_new == float("-inf"), 0.0, m_new)
    alpha = torch.exp(m - m_use)
    w = torch.exp(s - m_use[..., None])
    acc = acc * alpha[..., None] + torch.einsum("mhn,mnhd->mhd", w, vals)
    return m_new, z * alpha + w.sum(-1), acc


def prefix_block_attention_torch(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, src: Tensor, k_cache: Tensor,
                                 v_cache: Tensor, slots: Tensor, out: Tensor, state: PrefixState) -> None:
    rows = rows.long()
    if rows.numel() == 0:
        return
    heads = q.shape[1]
    qr = q[rows].float()
    pk, pv = _grouped(k_cache[slots.long()].float(), heads), _grouped(v_cache[slots.long()].float(), heads)
    s = torch.einsum("mhd,phd->mhp", qr, pk) * q.shape[-1] ** -0.5
    if s.shape[-1]:
        m = s.amax(-1)
        w = torch.exp(s - m[..., None])
        z = w.sum(-1)
        o = torch.einsum("mhp,phd->mhd", w, pv) / z[..., None]
    else:
        m = torch.full(qr.shape[:2], float("-inf"), device=q.device)
        z, o = torch.zeros_like(m), torch.zeros_like(qr)
    state.m[rows], state.z[rows], state.o[rows] = m, z, o
    m, z, acc = _add_block(qr, m, z, o * z[..., None], rows, k, v, src)
    out[rows] = (acc / z[..., None]).to(out.dtype)


def folded_correction_torch(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, src: Tensor, out: Tensor,
                            state: PrefixState) -> None:
    rows = rows.long()
    if rows.numel() == 0:
        return
    source = src.flatten()[rows].long()
    m, z = state.m[source], state.z[source]
    m, z, acc = _add_block(q[source].float(), m, z, state.o[source] * z[..., None], rows, k, v, src)
    out[rows] = (acc / z[..., None]).to(out.dtype)
