"""Kernel 2, source resolution: walk fold chains so that every (branch, position) points to the nearest
ancestor-or-self branch that recomputed the position. Returns the flat row (source·N + position) whose
q/k/v and FFN output the slot uses; row 0 recomputes everything, so every walk ends within R hops."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from specscope.kernels import tile


@triton.jit
def _sources_kernel(rec_ptr, parent_ptr, src_ptr, R, N, BLOCK_N: tl.constexpr):
    i = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = n < N
    cur = tl.zeros([BLOCK_N], dtype=tl.int32) + i
    for _ in range(R):
        done = tl.load(rec_ptr + cur * N + n, mask=in_n, other=1) != 0
        cur = tl.where(done, cur, tl.load(parent_ptr + cur, mask=in_n, other=0))
    tl.store(src_ptr + i * N + n, cur * N + n, mask=in_n)


def resolve_sources_triton(recompute: Tensor, parents: Tensor) -> Tensor:
    """recompute [R, N] bool, parents [R] (kernels.gate.parent_rows) -> source flat rows [R, N] int32."""
    r, n = recompute.shape
    src = torch.empty(r, n, dtype=torch.int32, device=recompute.device)
    block_n = tile(n, 64, 1)
    _sources_kernel[(r, triton.cdiv(n, block_n))](
        recompute.to(torch.int8).contiguous(), parents, src, r, n,
        BLOCK_N=block_n)
    return src


def resolve_sources_torch(recompute: Tensor, parents: Tensor) -> Tensor:
    r, n = recompute.shape
    parent = parents.tolist()
    src = torch.empty(r, n, dtype=torch.int32, device=recompute.device)
    pos = torch.arange(n, dtype=torch.int32, device=recompute.device)
    src[0] = pos
    for i in range(1, r):
        src[i] = torch.where(recompute[i], i * n + pos, src[parent[i]])
    return src
