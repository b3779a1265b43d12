"""SpecFold's gate and packing per layer as one C call (cpu_fold.c), built like the fused decode step
(kernels/cpu_decode.py: `cc -O3 -march=native` on first use, cached per source, flags and CPU).

On a CPU the folded verify's layers are op-bound outside their matmuls: the gate and the packing alone were
some twenty tensor ops a layer (~0.2 ms). `fold_gate` gives kernels/packed_forward.py the same rows and
sources as its PyTorch path, or None where it does not apply (not float32 on the CPU, no C compiler,
SPECSCOPE_FUSED_DECODE=0)."""
from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from kernels.cpu_decode import ENABLED, build, native_flags

SOURCE = Path(__file__).with_name("cpu_fold.c")


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    pointer, int64 = ctypes.c_void_p, ctypes.c_int64
    lib.fold_gate.restype = int64
    lib.fold_gate.argtypes = [pointer, int64, int64, int64, pointer, pointer, int64, ctypes.c_float, *[pointer] * 5]
    return lib


@cache
def library() -> ctypes.CDLL | None:
    """cpu_fold.c built with $CC (default cc) and native_flags(); None without a working compiler."""
    path = build(os.environ.get("CC", "cc"), native_flags(), SOURCE)
    return None if path is None else load(path)


def fold_gate(h: Tensor, parents: Tensor, ancestors: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor] | None:
    """For layer inputs h [R, N, D], parents [R] (int64, row 0 its own) and the ancestor table [R, A] (int64):
    the recomputed flat rows [M] (ascending), each (branch, position)'s source as an index into them [R, N], and
    the recomputed positions per branch [R]; None where the C gate does not apply."""
    if not ENABLED or h.dtype != torch.float32 or h.device.type != "cpu" or not h.is_contiguous():
        return None
    lib = library()
    if lib is None:
        return None
    r, n, d = h.shape
    recompute = torch.empty(r * n, dtype=torch.uint8)
    rows, source, index = (torch.empty(r * n, dtype=torch.long) for _ in range(3))
    counts = torch.empty(r, dtype=torch.long)
    total = lib.fold_gate(h.data_ptr(), r, n, d, parents.data_ptr(), ancestors.data_ptr(), ancestors.shape[1],
                          delta * delta, recompute.data_ptr(), rows.data_ptr(), source.data_ptr(), counts.data_ptr(),
                          index.data_ptr())
    return rows[:total], source.view(r, n), counts
