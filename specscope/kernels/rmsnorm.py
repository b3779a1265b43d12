"""Packed RMSNorm of gathered rows, shared by the packed projections (QKV, FFN): the rows are normalised once
into an [M, D] buffer in the weights' dtype, which every projection program then reads, instead of each
(row block, head or column tile) program redoing the RMS pass."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specscope.kernels import tile


@triton.jit
def _rmsnorm_rows_kernel(h_ptr, rows_ptr, norm_ptr, out_ptr, M, D, eps, BLOCK_M: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = m < M
    row = tl.load(rows_ptr + m, mask=in_m, other=0)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        x = tl.load(h_ptr + row[:, None] * D + d[None, :], mask=in_m[:, None] & (d < D)[None, :], other=0.0)
        x = x.to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    rstd = 1.0 / tl.sqrt(ss / D + eps)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = in_m[:, None] & (d < D)[None, :]
        x = tl.load(h_ptr + row[:, None] * D + d[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(norm_ptr + d, mask=d < D, other=0.0).to(tl.float32)
        tl.store(out_ptr + m[:, None] * D + d[None, :], (x * rstd[:, None] * g[None, :]).to(out_ptr.dtype.element_ty),
                 mask=mask)


def rmsnorm_rows_triton(h: Tensor, rows: Tensor, weight: Tensor, eps: float) -> Tensor:
    """h [R*N, D], rows [M] -> RMSNorm(h[rows]) · weight as [M, D] in weight's dtype."""
    m, d = rows.numel(), h.shape[1]
    out = torch.empty(m, d, dtype=weight.dtype, device=h.device)
    block_m = tile(m, 16)
    _rmsnorm_rows_kernel[(triton.cdiv(m, block_m),)](h, rows, weight, out, m, d, eps, BLOCK_M=block_m,
                                                     BLOCK_D=tile(d, 256))
    return out


def rms_torch(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm of x over its last dimension, in float32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rmsnorm_rows_torch(h: Tensor, rows: Tensor, weight: Tensor, eps: float) -> Tensor:
    return rms_torch(h[rows.long()], weight, eps).to(weight.dtype)
