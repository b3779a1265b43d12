"""The C kernels (cpu_decode.c, cpu_fold.c, cpu_amx.c, cpu_int8.c, on the shared simd.h) as one typed library.

`build` compiles both sources with the system's C compiler (`cc -O3 -march=native`, a few seconds) into a
per-user cache keyed by the sources, the headers, the flags and the CPU. `library()` loads it through cffi, which
reads the prototypes from api.h, the header the C files themselves compile against: every call's arguments are
checked against the C definitions, and `ptr` gives each array a pointer of its own element type, so an int32
table passed where int64 is declared is refused instead of read wrongly. Without a compiler or a source, or with
SPECSCOPE_FUSED_DECODE=0, `library()` is None (one logged warning) and the forwards run their tensor ops.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import cffi
import numpy as np
import torch
from torch import Tensor

HERE = Path(__file__).parent
SOURCES = ("cpu_decode.c", "cpu_fold.c", "cpu_amx.c", "cpu_int8.c")
HEADERS = ("simd.h", "api.h", "amx.h", "int8.h")
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-fopenmp")
"""-fopenmp: the step's linears and attention split across torch's threads (torch.set_num_threads); the process's
OpenMP runtime is torch's own libgomp, loaded first."""
NON_TEMPORAL = ("-DPREFETCH_LOCALITY=0", "-DPREFETCH_AHEAD=256")
"""Extra flags on AMD CPUs: prefetch the weights with the non-temporal hint (cpu_decode.c's PREFETCH_LOCALITY)."""
ENABLED = os.environ.get("SPECSCOPE_FUSED_DECODE", "1") != "0"
"""SPECSCOPE_FUSED_DECODE=0 runs every forward on tensor ops (for A/B comparisons)."""
C_TYPES = {torch.float32: "float", torch.int64: "int64_t", torch.int32: "int32_t", torch.uint8: "uint8_t",
           torch.bool: "uint8_t", torch.float16: "uint16_t", torch.bfloat16: "uint16_t"}
"""The C element type of each tensor dtype; float16 and bfloat16 travel as their bits."""
log = logging.getLogger(__name__)
ffi = cffi.FFI()


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "specscope" / "kernels"


def _cpuinfo(field: str) -> str:
    """The first value of a /proc/cpuinfo field ("" where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.partition(":")[2].strip() for line in lines if line.split(":")[0].strip() == field), "")


def _machine() -> bytes:
    """What -march=native depends on: the architecture and the CPU's feature flags."""
    return (platform.machine() + _cpuinfo("flags")).encode()


def native_flags() -> tuple[str, ...]:
    """FLAGS, plus NON_TEMPORAL on AMD."""
    return FLAGS + NON_TEMPORAL if _cpuinfo("vendor_id") == "AuthenticAMD" else FLAGS


def build(compiler: str, flags: tuple[str, ...] = FLAGS, folder: Path = HERE) -> Path | None:
    """Compile folder's SOURCES into the cache, once per sources, headers, flags and machine; None (with a logged
    warning) when a file is missing (a wheel built without it) or the compiler fails."""
    try:
        code = b"".join((folder / name).read_bytes() for name in SOURCES + HEADERS)
    except OSError as e:
        log.warning("cannot build the C kernels: %s", e)
        return None
    key = hashlib.sha256(code + " ".join((compiler, *flags)).encode() + _machine()).hexdigest()
    target = cache_dir() / f"specscope-kernels-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        sources = [str(folder / name) for name in SOURCES]
        try:
            subprocess.run([compiler, *flags, "-o", str(built), *sources, "-lm"], check=True, capture_output=True,
                           timeout=180)
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", None) or b""
            log.warning("cannot build the C kernels (%s): %s %s", compiler, e, detail.decode()[-500:])
            return None
        os.replace(built, target)   # atomic: a concurrent build of the same key loses nothing
    return target


@cache
def declare() -> None:
    """The exported functions' prototypes, read into ffi from api.h (once)."""
    ffi.cdef((HERE / "api.h").read_text())


def load(path: Path) -> Any:
    """The built library, its functions typed by api.h."""
    declare()
    return ffi.dlopen(str(path))


@cache
def library() -> Any | None:
    """The C kernels built with $CC (default cc) and native_flags(); None where they cannot run."""
    if not ENABLED:
        return None
    path = build(os.environ.get("CC", "cc"), native_flags())
    return None if path is None else load(path)


def ptr(array: Tensor | np.ndarray | None) -> Any:
    """A C pointer to a contiguous CPU array's first element, typed by its element type (NULL for None)."""
    if array is None:
        return ffi.NULL
    if isinstance(array, np.ndarray):
        array = torch.from_numpy(array)
    if array.device.type != "cpu" or not array.is_contiguous():
        raise ValueError(f"a C kernel needs a contiguous CPU array, not {array.device} strides {array.stride()}")
    return ffi.cast(f"{C_TYPES[array.dtype]} *", array.data_ptr())
