"""Kernel 1, gate + compaction: per (branch, position) relative residual ρ = ‖h_i − h_par‖ / ‖h_par‖ against
the parent branch; recompute where ρ > δ (row 0 always), tested as ‖h_i − h_par‖² > δ²‖h_par‖² (no sqrt or
division, so kernel and twin agree near the threshold); compact the recomputed (branch, position) pairs into
one global list of flat row indices (branch·N + position) and per-branch position lists, through atomic
counters. List order is the order the counters hand out slots: only the sets are defined."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specscope.kernels import tile

FFN_GATES = ("paper", "strict")
"""paper: the layer-input gate also decides FFN reuse; strict: a second gate on the FFN input."""


@dataclass
class Gate:
    recompute: Tensor       # [R, N] bool
    rows: Tensor            # [R*N] int32 flat rows: the `total` recomputed ones first, then the folded ones
    total: int
    branch_rows: Tensor     # [R, N] int32; row i's first branch_counts[i] entries are its recomputed positions
    branch_counts: Tensor   # [R] int32

    @property
    def recomputed_rows(self) -> Tensor:
        return self.rows[:self.total]

    @property
    def folded_rows(self) -> Tensor:
        return self.rows[self.total:]


def parent_rows(parents: list[int], device: torch.device) -> Tensor:
    """The parent list as an int32 tensor on `device`, the main row pointing at itself (built once per forward)."""
    return torch.tensor([max(p, 0) for p in parents], dtype=torch.int32, device=device)


@triton.jit
def _gate_kernel(h_ptr, parent_ptr, rec_ptr, rows_ptr, total_ptr, branch_rows_ptr, branch_counts_ptr,
                 R, N, D, delta, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = n < N
    par = tl.load(parent_ptr + i)
    diff = tl.zeros([BLOCK_N], dtype=tl.float32)
    norm = tl.zeros([BLOCK_N], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        m = in_n[:, None] & (d < D)[None, :]
        x = tl.load(h_ptr + (i * N + n)[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float32)
        y = tl.load(h_ptr + (par * N + n)[:, None] * D + d[None, :], mask=m, other=0.0).to(tl.float32)
        diff += tl.sum((x - y) * (x - y), axis=1)
        norm += tl.sum(y * y, axis=1)
    flag = ((diff > delta * delta * norm) | (i == 0)) & in_n      # ρ > δ without sqrt or division
    tl.store(rec_ptr + i * N + n, flag.to(tl.int8), mask=in_n)
    flag32 = flag.to(tl.int32)
    rank = tl.cumsum(flag32, axis=0) - flag32
    count = tl.sum(flag32, axis=0)
    base = tl.atomic_add(total_ptr, count)
    tl.store(rows_ptr + base + rank, i * N + n, mask=flag)
    branch_base = tl.atomic_add(branch_counts_ptr + i, count)
    tl.store(branch_rows_ptr + i * N + branch_base + rank, n, mask=flag)
    folded = (~flag & in_n).to(tl.int32)                     # folded rows fill the list from its end
    folded_base = tl.atomic_add(total_ptr + 1, tl.sum(folded, axis=0))
    tl.store(rows_ptr + R * N - 1 - folded_base - (tl.cumsum(folded, axis=0) - folded), i * N + n,
             mask=folded != 0)


def fold_gate_triton(h: Tensor, parents: Tensor, delta: float) -> Gate:
    """h [R, N, D] layer inputs of R branches; parents [R] from `parent_rows` (parents[i] < i)."""
    r, n, d = h.shape
    h = h.contiguous()
    rec = torch.empty(r, n, dtype=torch.int8, device=h.device)
    rows = torch.empty(r * n, dtype=torch.int32, device=h.device)
    total = torch.zeros(2, dtype=torch.int32, device=h.device)        # recomputed, folded
    branch_rows = torch.zeros(r, n, dtype=torch.int32, device=h.device)
    branch_counts = torch.zeros(r, dtype=torch.int32, device=h.device)
    block_n = tile(n, 64, 1)
    _gate_kernel[(r, triton.cdiv(n, block_n))](
        h, parents, rec, rows, total, branch_rows, branch_counts, r, n, d, float(delta),
        BLOCK_N=block_n, BLOCK_D=tile(d, 128))
    return Gate(rec.bool(), rows, int(total[0].item()), branch_rows, branch_counts)


def recompute_flags(h: Tensor, parents: Tensor, delta: float) -> Tensor:
    """[R, N] bool: row 0 always; row i where ‖h_i − h_par(i)‖² > δ²‖h_par(i)‖² (parents [R], any int dtype)."""
    x, y = h.float(), h.index_select(0, parents).float()
    rec = (x - y).pow(2).sum(-1) > delta * delta * y.pow(2).sum(-1)
    rec[0] = True
    return rec


def fold_gate_torch(h: Tensor, parents: Tensor, delta: float) -> Gate:
    rec = recompute_flags(h, parents, delta)
    flat = rec.flatten()
    rows = torch.cat([flat.nonzero()[:, 0], (~flat).nonzero()[:, 0]]).int()
    order = torch.argsort((~rec).int(), dim=1, stable=True).int()   # recomputed positions first, ascending
    return Gate(rec, rows, int(flat.sum()), order, rec.sum(1).int())
