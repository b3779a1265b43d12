"""The folded verify's small per-layer ops as C calls (cpu_fold.c, in the library kernels/native.py builds).

On a CPU the folded verify's layers are op-bound outside their matmuls: the gate and the packing were some
twenty tensor ops a layer (~0.13 ms), the packed rows' norms and RoPE some thirty more. Each function here
gives backend/forward/packed.py what its tensor ops give (the gate's flags up to float32 rounding at the
threshold), or None / False where it does not apply (not float32 on the CPU, no C compiler,
SPECSCOPE_FUSED_DECODE=0): the caller then runs the tensor ops."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specscope.kernels.native import library, ptr


def native(*tensors: Tensor) -> Any | None:
    """The library, where every tensor is float32 and contiguous on the CPU (else None: run the tensor ops)."""
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in tensors):
        return None
    return library()


def fold_gate(h: Tensor, parents: Tensor, ancestors: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor] | None:
    """For layer inputs h [R, N, D], parents [R] (row 0 its own) and the ancestor table [R, A] (any int dtype):
    the recomputed flat rows [M] (ascending), each (branch, position)'s source as an index into them [R, N], and
    the recomputed positions per branch [R]; None where the C gate does not apply."""
    lib = native(h)
    if lib is None:
        return None
    parents, ancestors = parents.long().contiguous(), ancestors.long().contiguous()   # no-ops when they are
    r, n, d = h.shape
    recompute = torch.empty(r * n, dtype=torch.uint8)
    rows, source, index = (torch.empty(r * n, dtype=torch.long) for _ in range(3))
    counts = torch.empty(r, dtype=torch.long)
    total = lib.fold_gate(ptr(h), r, n, d, ptr(parents), ptr(ancestors), ancestors.shape[1], delta * delta,
                          ptr(recompute), ptr(rows), ptr(source), ptr(counts), ptr(index))
    return rows[:total], source.view(r, n), counts


def norm_rows(h: Tensor, rows: Tensor, weight: Tensor, eps: float) -> Tensor | None:
    """HF's RMSNorm (weight [D], eps) of h's rows `rows` (h [*, D], rows [M] int64): [M, D], or None."""
    lib = native(h, weight)
    if lib is None:
        return None
    rows = rows.long().contiguous()
    out = torch.empty(rows.shape[0], h.shape[-1])
    lib.norm_rows(ptr(h), ptr(rows), rows.shape[0], h.shape[-1], ptr(weight), eps, ptr(out))
    return out


def position_qk(q: Tensor, k: Tensor, q_norm: tuple[Tensor, float] | None, k_norm: tuple[Tensor, float] | None,
                cos: Tensor, sin: Tensor, position: Tensor, scale: Tensor | None) -> bool:
    """In place on q [M, H, hd] and k [M, Hkv, hd]: each head's RMSNorm (q_norm, k_norm: weight [hd] and eps;
    None: none), rotate-half RoPE at each row's position (cos, sin [P, hd]; position [M] int64 into them), then
    q's scale (scale [P]; None: none), as Attention.position does; False where it does not apply (nothing
    touched)."""
    tables = [t for t in (q, k, cos, sin, scale, *(n[0] for n in (q_norm, k_norm) if n)) if t is not None]
    lib = native(*tables)
    if lib is None or q.shape[-1] % 2:
        return False
    position = position.long().contiguous()
    for x, norm, by in ((q, q_norm, scale), (k, k_norm, None)):
        lib.norm_rope(ptr(x), x.shape[0], x.shape[1], x.shape[2], ptr(norm and norm[0]), norm[1] if norm else 0.0,
                      ptr(cos), ptr(sin), ptr(position), ptr(by))
    return True
