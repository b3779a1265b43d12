"""Kernel 3, packed RMSNorm + QKV projection + RoPE: for the recomputed flat rows only, normalise the layer
input once (kernels/rmsnorm.py), project one head per program (the two RoPE halves as two accumulators),
apply the optional q/k-norm and RoPE, and scatter into the (branch·N + position) Q/K/V tables. Folded slots
are left untouched."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specscope.kernels import tile
from specscope.kernels.rmsnorm import rms_torch, rmsnorm_rows_torch, rmsnorm_rows_triton


@dataclass
class QKVWeights:
    """One layer's attention input weights in the layout of our Transformer (Linear: [out, in])."""
    norm: Tensor                      # [D] input RMSNorm
    wq: Tensor                        # [H*hd, D]
    wk: Tensor                        # [Hkv*hd, D]
    wv: Tensor
    bq: Tensor | None = None
    bk: Tensor | None = None
    bv: Tensor | None = None
    q_norm: Tensor | None = None      # [hd] (Qwen3 q/k-norm)
    k_norm: Tensor | None = None
    eps: float = 1e-6


@triton.jit
def _qkv_head_kernel(x_ptr, rows_ptr, w_ptr, b_ptr, hnorm_ptr, cos_ptr, sin_ptr, out_ptr,
                     M, N, D, eps, HEADS: tl.constexpr, HALF: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HEAD_NORM: tl.constexpr, ROPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    head = tl.program_id(1)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = m < M
    row = tl.load(rows_ptr + m, mask=in_m, other=0)
    j = tl.arange(0, HALF)
    lo_rows = head * 2 * HALF + j
    acc_lo = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        in_d = d < D
        xn = tl.load(x_ptr + m[:, None] * D + d[None, :], mask=in_m[:, None] & in_d[None, :], other=0.0)
        w_lo = tl.load(w_ptr + lo_rows[None, :] * D + d[:, None], mask=in_d[:, None], other=0.0)
        w_hi = tl.load(w_ptr + (lo_rows + HALF)[None, :] * D + d[:, None], mask=in_d[:, None], other=0.0)
        acc_lo += tl.dot(xn, w_lo, input_precision="ieee")
        acc_hi += tl.dot(xn, w_hi, input_precision="ieee")
    if HAS_BIAS:
        acc_lo += tl.load(b_ptr + lo_rows).to(tl.float32)[None, :]
        acc_hi += tl.load(b_ptr + lo_rows + HALF).to(tl.float32)[None, :]
    if HEAD_NORM:
        r = 1.0 / tl.sqrt((tl.sum(acc_lo * acc_lo, axis=1) + tl.sum(acc_hi * acc_hi, axis=1)) / (2 * HALF) + eps)
        acc_lo = acc_lo * r[:, None] * tl.load(hnorm_ptr + j).to(tl.float32)[None, :]
        acc_hi = acc_hi * r[:, None] * tl.load(hnorm_ptr + HALF + j).to(tl.float32)[None, :]
    if ROPE:
        pos = row % N
        c_lo = tl.load(cos_ptr + pos[:, None] * 2 * HALF + j[None, :])
        c_hi = tl.load(cos_ptr + pos[:, None] * 2 * HALF + HALF + j[None, :])
        s_lo = tl.load(sin_ptr + pos[:, None] * 2 * HALF + j[None, :])
        s_hi = tl.load(sin_ptr + pos[:, None] * 2 * HALF + HALF + j[None, :])
        acc_lo, acc_hi = acc_lo * c_lo - acc_hi * s_lo, acc_hi * c_hi + acc_lo * s_hi
    out = out_ptr + row[:, None] * (HEADS * 2 * HALF) + head * 2 * HALF + j[None, :]
    tl.store(out, acc_lo.to(out_ptr.dtype.element_ty), mask=in_m[:, None])
    tl.store(out + HALF, acc_hi.to(out_ptr.dtype.element_ty), mask=in_m[:, None])


def packed_qkv_triton(h: Tensor, rows: Tensor, w: QKVWeights, cos: Tensor, sin: Tensor,
                      q_table: Tensor, k_table: Tensor, v_table: Tensor) -> None:
    """h [R*N, D]; rows [M] int32 recomputed flat rows; cos/sin [N, hd] float32 (rotate-half layout);
    writes q_table [R*N, H, hd], k_table / v_table [R*N, Hkv, hd] at `rows`."""
    m, d = rows.numel(), h.shape[1]
    if m == 0:
        return
    xn = rmsnorm_rows_triton(h, rows, w.norm, w.eps)
    n, hd = cos.shape
    block_m = tile(m, 64)
    common = dict(BLOCK_M=block_m, BLOCK_D=tile(d, 64), HALF=hd // 2)
    for weight, bias, head_norm, rope, table in ((w.wq, w.bq, w.q_norm, True, q_table),
                                                 (w.wk, w.bk, w.k_norm, True, k_table),
                                                 (w.wv, w.bv, None, False, v_table)):
        heads = table.shape[1]
        _qkv_head_kernel[(triton.cdiv(m, block_m), heads)](
            xn, rows, weight, bias if bias is not None else weight,
            head_norm if head_norm is not None else weight, cos, sin, table, m, n, d, w.eps,
            HEADS=heads, HAS_BIAS=bias is not None, HEAD_NORM=head_norm is not None, ROPE=rope, **common)


def packed_qkv_torch(h: Tensor, rows: Tensor, w: QKVWeights, cos: Tensor, sin: Tensor,
                     q_table: Tensor, k_table: Tensor, v_table: Tensor) -> None:
    rows = rows.long()
    n, hd = cos.shape
    xn = rmsnorm_rows_torch(h, rows, w.norm, w.eps).float()
    pos = rows % n
    half = hd // 2
    for weight, bias, head_norm, rope, table in ((w.wq, w.bq, w.q_norm, True, q_table),
                                                 (w.wk, w.bk, w.k_norm, True, k_table),
                                                 (w.wv, w.bv, None, False, v_table)):
        y = xn @ weight.float().T
        if bias is not None:
            y = y + bias.float()
        y = y.view(len(rows), -1, hd)
        if head_norm is not None:
            y = rms_torch(y, head_norm, w.eps)
        if rope:
            c, s = cos[pos][:, None], sin[pos][:, None]
            y = y * c + torch.cat([-y[..., half:], y[..., :half]], dim=-1) * s
        table[rows] = y.to(table.dtype)
