"""RMSNorm pieces shared by the packed projections (QKV, FFN): Triton helpers for gathered rows, and the twin."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def row_rstd(h_ptr, row, in_m, D, eps, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """1 / RMS of the gathered rows h[row] [BLOCK_M] (float32)."""
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        x = tl.load(h_ptr + row[:, None] * D + d[None, :], mask=in_m[:, None] & (d < D)[None, :], other=0.0)
        x = x.to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(ss / D + eps)


@triton.jit
def normed_tile(h_ptr, norm_ptr, row, in_m, rstd, d, D):
    """The [BLOCK_M, BLOCK_D] tile h[row, d] · rstd · weight[d] (float32), zero outside the rows and D."""
    in_d = d < D
    x = tl.load(h_ptr + row[:, None] * D + d[None, :], mask=in_m[:, None] & in_d[None, :], other=0.0)
    g = tl.load(norm_ptr + d, mask=in_d, other=0.0).to(tl.float32)
    return x.to(tl.float32) * rstd[:, None] * g[None, :]


def rms_torch(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The twin: RMSNorm of x over its last dimension, in float32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
