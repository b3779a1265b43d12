"""Batch-invariant ops: a row's result is bitwise the same whatever rows share the call and wherever it sits among
them, because no op's reduction order depends on the number of rows (Thinking Machines' `batch_invariant_ops`).

- `linear_triton`: x @ w.T in fixed BLOCK_M x BLOCK_N tiles, each summing K in fixed BLOCK_K steps in one program
  (no split-K, no autotuning on M), so a row's dot products run in one order whatever M is.
- `linear_torch`, its twin off CUDA: the rows in fixed tiles of `tile` rows (the last one padded with zeros), one
  matmul call of the same shape per tile, so the BLAS picks one kernel and one blocking whatever the row count (a
  lone row's matmul is a GEMV that sums in another order). Measured bitwise in any tile position on MKL
  (tests/test_kernels.py).
- `by_rows`: a row-wise op (a norm, SiLU) applied to fixed slices of rows. Off CUDA each call stays under ATen's
  parallel grain, so no thread boundary cuts a row, and its rows start on whole vector blocks, so every element of
  a row takes the same (vector or scalar-tail) path in any position: SiLU's vector exp and its scalar tail round
  differently. On CUDA a call per tile keeps a reduction's launch shape fixed.

The torch ops are device-agnostic; `linear` dispatches as the other kernels do (`on_triton`)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from specscope.kernels import INTERPRETED, on_triton

ROW_TILE = 8
"""Rows per matmul call off CUDA (the torch twin): a decode step pays for 8 rows (on the tiny model 8 rows cost
about what 4 do, and 16 about twice that), a 64-row verify makes 8 calls per linear."""
CUDA_TILE = 64
"""Rows per row-wise call on CUDA (launches are what a GPU forward pays for; its matmuls are not tiled)."""
GRAIN = 32768
"""ATen's parallel grain (at::internal::GRAIN_SIZE): an elementwise or reduction call over fewer elements runs on
one thread."""
VECTOR_BLOCK = 64
"""Elements a CPU vector loop takes per step at most (2 x 32 lanes); a row width that is a multiple of this starts
every row on a step, so none of its elements falls in a scalar tail."""
BLOCKS = (1, 32, 32) if INTERPRETED else (64, 64, 32)
"""The Triton kernel's (BLOCK_M, BLOCK_N, BLOCK_K): constants, never chosen by shape. On a GPU every row of a block
runs the same MMA instructions over the same BLOCK_K steps. The interpreter computes tl.dot with NumPy's matmul,
whose BLAS rounds a row by its place in the block (its edge kernels), so there a block is one row."""


@triton.jit
def _linear_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_wk, stride_om,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m, in_n = m < M, n < N
    m = m.to(tl.int64)   # a long prompt's rows times a large vocabulary pass 2**31
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        in_k = k < K
        a = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=in_m[:, None] & in_k[None, :], other=0.0)
        b = tl.load(w_ptr + n[None, :] * stride_wn + k[:, None] * stride_wk, mask=in_n[None, :] & in_k[:, None],
                    other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(out_ptr + m[:, None] * stride_om + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=in_m[:, None] & in_n[None, :])


def linear_triton(x: Tensor, w: Tensor, blocks: tuple[int, int, int] = BLOCKS) -> Tensor:
    """x [M, K] @ w [N, K].T -> [M, N] in x's dtype, float32 sums; any strides of w, x's rows contiguous."""
    if x.stride(1) != 1:
        x = x.contiguous()
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = blocks
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _linear_kernel[grid](x, w, out, m, n, k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
                         BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def linear_torch(x: Tensor, w: Tensor, tile: int = ROW_TILE) -> Tensor:
    """x [M, K] @ w [N, K].T -> [M, N]: one [tile, K] @ [K, N] matmul per tile of rows, the last one zero-padded."""
    m = x.shape[0]
    whole = m - m % tile
    wt = w.t()
    out = x.new_empty(whole + (tile if whole < m else 0), w.shape[0])
    if x.stride(1) != 1 or x.stride(0) != x.shape[1]:
        x = x.contiguous()
    for i in range(0, whole, tile):
        torch.mm(x[i:i + tile], wt, out=out[i:i + tile])
    if whole < m:
        last = x.new_zeros(tile, x.shape[1])
        last[:m - whole] = x[whole:]
        torch.mm(last, wt, out=out[whole:])
    return out[:m]


def row_tile(device: torch.device) -> int:
    """The tile of rows a forward on `device` pads to and hands the row-wise ops."""
    return CUDA_TILE if device.type == "cuda" else ROW_TILE


def linear(x: Tensor, w: Tensor, tile: int = ROW_TILE) -> Tensor:
    """x [M, K] @ w [N, K].T, batch-invariant: the Triton kernel on CUDA, the torch tiles elsewhere."""
    return linear_triton(x, w) if on_triton(x) else linear_torch(x, w, tile)


def rows_per_call(width: int, tile: int, device: torch.device) -> int:
    """How many rows of `width` elements `by_rows` hands a row-wise op at once: a tile on CUDA; off it the most (a
    power of two dividing `tile`) that stay under GRAIN, or 1 where a row's width is no multiple of VECTOR_BLOCK."""
    if device.type == "cuda":
        return tile
    if width % VECTOR_BLOCK:
        return 1
    rows = 1
    while tile % (rows * 2) == 0 and rows * 2 * width < GRAIN:
        rows *= 2
    return rows


def by_rows(op: Callable[[Tensor], Tensor], x: Tensor, tile: int = ROW_TILE) -> Tensor:
    """op (row-wise: each output row depends on its own input row alone) over x [M, ...] in fixed slices of
    `rows_per_call` rows, M a multiple of the slice (a padded forward's rows are a multiple of `tile`)."""
    x = x.contiguous()
    step = rows_per_call(x[0].numel() if x.shape[0] else 1, tile, x.device)
    if x.shape[0] % step:
        raise ValueError(f"{x.shape[0]} rows: by_rows takes a multiple of {step}")
    if x.shape[0] == step:
        return op(x)
    return torch.cat([op(x[i:i + step]) for i in range(0, x.shape[0], step)])


def silu(x: Tensor, tile: int = ROW_TILE) -> Tensor:
    """F.silu, each row as it computes alone (x's rows a multiple of the slice `by_rows` takes)."""
    return by_rows(F.silu, x, tile)
