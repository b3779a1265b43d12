"""Kernel 6, packed FFN: RMSNorm (kernels/rmsnorm.py), gate/up projections, SiLU and the down projection for
the recomputed flat rows only, written into an FFN-output table; then every (branch, position) adds the
output of its source row to its own residual stream (`add_from_sources`): residual streams are never folded."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from specscope.kernels import tile
from specscope.kernels.rmsnorm import rmsnorm_rows_torch, rmsnorm_rows_triton


@dataclass
class FFNWeights:
    norm: Tensor      # [D] post-attention RMSNorm
    w_gate: Tensor    # [I, D]
    w_up: Tensor      # [I, D]
    w_down: Tensor    # [D, I]
    eps: float = 1e-6


@triton.jit
def _gate_up_kernel(x_ptr, wg_ptr, wu_ptr, act_ptr, M, D, INNER,
                    BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    in_m, in_c = m < M, c < INNER
    g_acc = tl.zeros([BLOCK_M, BLOCK_I], dtype=tl.float32)
    u_acc = tl.zeros([BLOCK_M, BLOCK_I], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        in_d = d < D
        xn = tl.load(x_ptr + m[:, None] * D + d[None, :], mask=in_m[:, None] & in_d[None, :], other=0.0)
        w_off = c[None, :] * D + d[:, None]
        w_mask = in_c[None, :] & in_d[:, None]
        g_acc += tl.dot(xn, tl.load(wg_ptr + w_off, mask=w_mask, other=0.0), input_precision="ieee")
        u_acc += tl.dot(xn, tl.load(wu_ptr + w_off, mask=w_mask, other=0.0), input_precision="ieee")
    act = g_acc / (1.0 + tl.exp(-g_acc)) * u_acc
    tl.store(act_ptr + m[:, None] * INNER + c[None, :], act.to(act_ptr.dtype.element_ty),
             mask=in_m[:, None] & in_c[None, :])


@triton.jit
def _down_kernel(act_ptr, rows_ptr, wd_ptr, out_ptr, M, D, INNER,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_I: tl.constexpr):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    in_m, in_d = m < M, d < D
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for c0 in range(0, INNER, BLOCK_I):
        c = c0 + tl.arange(0, BLOCK_I)
        in_c = c < INNER
        a = tl.load(act_ptr + m[:, None] * INNER + c[None, :], mask=in_m[:, None] & in_c[None, :], other=0.0)
        w = tl.load(wd_ptr + d[None, :] * INNER + c[:, None], mask=in_d[None, :] & in_c[:, None], other=0.0)
        acc += tl.dot(a, w, input_precision="ieee")
    row = tl.load(rows_ptr + m, mask=in_m, other=0)
    tl.store(out_ptr + row[:, None] * D + d[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=in_m[:, None] & in_d[None, :])


@triton.jit
def _add_sources_kernel(h_ptr, table_ptr, src_ptr, RN, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (r < RN)[:, None] & (d < D)[None, :]
    src = tl.load(src_ptr + r, mask=r < RN, other=0)
    y = tl.load(table_ptr + src[:, None] * D + d[None, :], mask=mask, other=0.0)
    h = tl.load(h_ptr + r[:, None] * D + d[None, :], mask=mask, other=0.0)
    tl.store(h_ptr + r[:, None] * D + d[None, :], (h + y).to(h_ptr.dtype.element_ty), mask=mask)


def packed_ffn_triton(h: Tensor, rows: Tensor, w: FFNWeights, out: Tensor) -> None:
    """h [R*N, D]; rows [M] recomputed flat rows; writes out [R*N, D] (the FFN output) at `rows`."""
    m, (d, i) = rows.numel(), (h.shape[1], w.w_gate.shape[0])
    if m == 0:
        return
    xn = rmsnorm_rows_triton(h, rows, w.norm, w.eps)
    act = torch.empty(m, i, dtype=w.w_gate.dtype, device=h.device)
    block_m = tile(m, 64)
    block_d = tile(d, 64)
    block_i = tile(i, 64)
    _gate_up_kernel[(triton.cdiv(m, block_m), triton.cdiv(i, block_i))](
        xn, w.w_gate, w.w_up, act, m, d, i, BLOCK_M=block_m, BLOCK_I=block_i, BLOCK_D=block_d)
    _down_kernel[(triton.cdiv(m, block_m), triton.cdiv(d, block_d))](
        act, rows, w.w_down, out, m, d, i, BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_I=block_i)


def packed_ffn_torch(h: Tensor, rows: Tensor, w: FFNWeights, out: Tensor) -> None:
    rows = rows.long()
    xn = rmsnorm_rows_torch(h, rows, w.norm, w.eps).float()
    act = (F.silu(xn @ w.w_gate.float().T) * (xn @ w.w_up.float().T)).to(w.w_gate.dtype).float()
    out[rows] = (act @ w.w_down.float().T).to(out.dtype)


def add_from_sources_triton(h: Tensor, table: Tensor, src: Tensor) -> None:
    """h [R*N, D] += table[src] for the flat source rows src [R, N] (in place)."""
    rn, d = h.shape
    block_r, block_d = tile(rn, 16), tile(d, 128)
    _add_sources_kernel[(triton.cdiv(rn, block_r), triton.cdiv(d, block_d))](
        h, table, src, rn, d, BLOCK_R=block_r, BLOCK_D=block_d)


def add_from_sources_torch(h: Tensor, table: Tensor, src: Tensor) -> None:
    h += table[src.flatten().long()]
