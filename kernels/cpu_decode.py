"""The fused CPU decode step's C side (cpu_decode.c) and the build every C kernel here shares: `build` compiles
a source of this folder with the system's C compiler (`cc -O3 -march=native`, about a second) into a per-user cache
keyed by the source, the flags and the CPU; `library()` loads the decode step with its argument types declared.
The forward that calls it is backend/forward/fused_step.py.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_decode.c")
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-fopenmp")
"""-fopenmp: the step's linears and attention split across torch's threads (torch.set_num_threads); the process's
OpenMP runtime is torch's own libgomp, loaded first."""
NON_TEMPORAL = ("-DPREFETCH_LOCALITY=0", "-DPREFETCH_AHEAD=256")
"""Extra flags on AMD CPUs: prefetch the weights with the non-temporal hint (cpu_decode.c's PREFETCH_LOCALITY)."""
ENABLED = os.environ.get("SPECSCOPE_FUSED_DECODE", "1") != "0"
"""SPECSCOPE_FUSED_DECODE=0 runs every decode forward eagerly (for A/B comparisons)."""
log = logging.getLogger(__name__)

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


def build(compiler: str, flags: tuple[str, ...] = FLAGS, source: Path = SOURCE) -> Path | None:
    """Compile a C source of this folder (cpu_decode.c by default) into the cache, once per source, flags and
    machine; None when the source is missing (a wheel built without it) or the compiler fails."""
    try:
        code = source.read_bytes()
    except OSError as e:
        log.warning("cannot build %s: %s", source.name, e)
        return None
    key = hashlib.sha256(code + " ".join((compiler, *flags)).encode() + _machine()).hexdigest()
    target = cache_dir() / f"{source.stem}-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        try:
            subprocess.run([compiler, *flags, "-o", str(built), str(source), "-lm"], check=True, capture_output=True,
                           timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", None) or b""
            log.warning("cannot build %s (%s): %s %s", source.name, compiler, e, detail.decode()[-500:])
            return None
        os.replace(built, target)   # atomic: a concurrent build of the same key loses nothing
    return target


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.decode_step.restype = ctypes.c_int
    pointer, int64 = ctypes.c_void_p, ctypes.c_int64   # declared, so a call passes plain ints without wrapping
    lib.decode_step.argtypes = ([pointer] * 6 + [ctypes.c_int] + [pointer] * 6 + [int64] + [pointer] * 4
                                + [int64, ctypes.c_int, pointer, ctypes.c_int, ctypes.c_float, pointer, pointer])
    return lib


@cache
def library() -> ctypes.CDLL | None:
    """The decode step built with $CC (default cc) and native_flags(); None without a working compiler."""
    path = build(os.environ.get("CC", "cc"), native_flags())
    return None if path is None else load(path)


FORMATS = (torch.float32, torch.float16, torch.bfloat16)
"""cpu_decode.c's weight formats, by their enum value."""
