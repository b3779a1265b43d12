"""Triton kernels for SpecFold's folded verification and I-DLM's fused verify, each with a PyTorch twin.

Every op lives in one module as `<op>_triton` and `<op>_torch` with identical signatures. CUDA tensors run the
kernels, anything else the twins (`on_triton`): backend/forward/folded.py's `FoldOps` picks the six SpecFold ops
together, `isd_verify.isd_verify` dispatches on its own. Tests run the Triton versions on CPU under
TRITON_INTERPRET=1 (set before these modules are imported) by calling them directly; `python -m
tools.compile_check` compiles them for a GPU. The C kernels (cpu_decode.c, cpu_fold.c, on the shared simd.h) build
into one library with typed calls through `native` (prototypes in api.h). Nothing here imports `backend/` (the
forwards that call these kernels are backend/forward/).
"""
from __future__ import annotations

import os

from torch import Tensor

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Under the CPU interpreter, every tile op costs Python time, so tiles grow to cover whole small shapes."""


def on_triton(x: Tensor) -> bool:
    """Whether ops on x run the Triton kernels (CUDA tensors) or the PyTorch twins (anything else)."""
    return x.is_cuda


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def tile(n: int, gpu_max: int, lo: int = 16) -> int:
    """A power-of-two tile covering n, capped at gpu_max on a GPU (256 under the interpreter), at least lo."""
    return max(lo, min(next_pow2(n), 256 if INTERPRETED else gpu_max))
