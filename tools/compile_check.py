"""Compile every kernel for an NVIDIA GPU ahead of time, without one: Triton's real compiler and the wheel's ptxas.

    python -m tools.compile_check [--arch 90]

The interpreter that runs the kernels in tests accepts things the GPU compiler rejects (loop-carried dtype
changes, fp64 literals, ...); this catches them on a CPU-only machine. Shapes are the benchmark's (fp16,
hidden 2048, 16/4 heads of 128, FFN 5632) with the launch tiles the wrappers pick on a GPU. Prints shared
memory, registers and spills per kernel; exits 1 if any kernel fails to compile. Must run without
TRITON_INTERPRET (the kernels are then ordinary JIT functions).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("tools.compile_check compiles for a GPU: run it without TRITON_INTERPRET=1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402

from specscope.kernels import attention, ffn, gate, invariant, isd_verify, qkv, rmsnorm, sources  # noqa: E402

H16, I32, F32 = "*fp16", "*i32", "*fp32"
ALIGNED = {"h_ptr", "x_ptr", "w_ptr", "q_ptr", "k_ptr", "v_ptr", "kc_ptr", "vc_ptr", "o_ptr", "po_ptr", "wg_ptr",
           "wu_ptr", "wd_ptr", "act_ptr", "out_ptr", "table_ptr", "D", "N", "P", "V", "INNER"}


def cases() -> list[tuple[str, Any, dict[str, str], dict[str, Any]]]:
    """(label, kernel, runtime argument types, constexprs)."""
    qkv_args = dict(x_ptr=H16, rows_ptr=I32, w_ptr=H16, b_ptr=H16, hnorm_ptr=H16, cos_ptr=F32, sin_ptr=F32,
                    out_ptr=H16, M="i32", N="i32", D="i32", eps="fp32")
    attn_args = dict(q_ptr=H16, k_ptr=H16, v_ptr=H16, rows_ptr=I32, src_ptr=I32, kc_ptr=H16, vc_ptr=H16,
                     slots_ptr=I32, o_ptr=H16, pm_ptr=F32, pz_ptr=F32, po_ptr=F32, M="i32", N="i32", P="i32",
                     scale="fp32")
    folded_args = {k: v for k, v in attn_args.items() if k not in ("kc_ptr", "vc_ptr", "slots_ptr", "P")}
    isd_args = dict(clean_ptr=F32, draft_ptr=F32, spec_ptr=I32, u_ptr=F32, g_ptr=F32, out_ptr=I32, px_ptr=F32,
                    qx_ptr=F32, K="i32", V="i32", banned="i32", temperature="fp32", alpha="fp32")
    heads = dict(H=16, HKV=4, HD=128)
    return [
        ("gate", gate._gate_kernel, dict(h_ptr=H16, parent_ptr=I32, rec_ptr="*i8", rows_ptr=I32, total_ptr=I32,
                                         branch_rows_ptr=I32, branch_counts_ptr=I32, R="i32", N="i32", D="i32",
                                         delta="fp32"), dict(BLOCK_N=32, BLOCK_D=128)),
        ("rmsnorm_rows", rmsnorm._rmsnorm_rows_kernel, dict(h_ptr=H16, rows_ptr=I32, norm_ptr=H16, out_ptr=H16,
                                                            M="i32", D="i32", eps="fp32"),
         dict(BLOCK_M=16, BLOCK_D=256)),
        ("sources", sources._sources_kernel, dict(rec_ptr="*i8", parent_ptr=I32, src_ptr=I32, R="i32", N="i32"),
         dict(BLOCK_N=32)),
        ("qkv_q", qkv._qkv_head_kernel, qkv_args, dict(HEADS=16, HALF=64, HAS_BIAS=False, HEAD_NORM=True,
                                                       ROPE=True, BLOCK_M=64, BLOCK_D=64)),
        ("qkv_v_bias", qkv._qkv_head_kernel, qkv_args, dict(HEADS=4, HALF=64, HAS_BIAS=True, HEAD_NORM=False,
                                                            ROPE=False, BLOCK_M=64, BLOCK_D=64)),
        ("attention_prefix", attention._prefix_block_kernel, attn_args, dict(**heads, BLOCK_M=16, GROUP=4,
                                                                             BLOCK_P=64)),
        ("attention_folded", attention._folded_kernel, folded_args, dict(**heads, BLOCK_M=16, GROUP=4)),
        ("ffn_gate_up", ffn._gate_up_kernel, dict(x_ptr=H16, wg_ptr=H16, wu_ptr=H16, act_ptr=H16, M="i32",
                                                  D="i32", INNER="i32"),
         dict(BLOCK_M=64, BLOCK_I=64, BLOCK_D=64)),
        ("ffn_down", ffn._down_kernel, dict(act_ptr=H16, rows_ptr=I32, wd_ptr=H16, out_ptr=H16, M="i32", D="i32",
                                            INNER="i32"), dict(BLOCK_M=64, BLOCK_D=64, BLOCK_I=64)),
        ("ffn_add_sources", ffn._add_sources_kernel, dict(h_ptr=H16, table_ptr=H16, src_ptr=I32, RN="i32",
                                                          D="i32"), dict(BLOCK_R=16, BLOCK_D=128)),
        ("isd_verify_greedy", isd_verify._isd_verify_kernel, isd_args, dict(GREEDY=True, BLOCK_V=1024)),
        ("isd_verify_sampling", isd_verify._isd_verify_kernel, isd_args, dict(GREEDY=False, BLOCK_V=1024)),
        *((f"invariant_linear_{name}", invariant._linear_kernel,
           dict(x_ptr=t, w_ptr=t, out_ptr=t, M="i32", N="i32", K="i32", stride_xm="i32", stride_wn="i32",
                stride_wk="i32", stride_om="i32"), dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32))
          for name, t in (("fp16", H16), ("fp32", F32))),
    ]


def compile_one(kernel: Any, args: dict[str, str], consts: dict[str, Any], target: GPUTarget) -> Any:
    names = kernel.arg_names
    signature = {n: "constexpr" if n in consts else args[n] for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in ALIGNED and n not in consts}
    options = make_backend(target).parse_options({"num_warps": 4, "num_stages": 3})
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs), target=target,
                          options=options.__dict__)


def ptxas_report(ptx: str, arch: int) -> str:
    """Registers and spills from the wheel's ptxas."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([str(ptxas), f"-arch=sm_{arch}a", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    return f"registers {regs.group(1) if regs else '?'}, spill stores {spill.group(1) if spill else '?'} B"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90 = H100/H200)")
    arch = p.parse_args().arch
    target = GPUTarget("cuda", arch, 32)
    failed = []
    for label, kernel, args, consts in cases():
        try:
            compiled = compile_one(kernel, args, consts, target)
        except Exception as exc:  # the compiler's own error, reported per kernel
            failed.append(label)
            print(f"FAIL {label}: {type(exc).__name__}: {' | '.join(str(exc).strip().splitlines()[-4:])}")
            continue
        print(f"ok   {label}: shared {compiled.metadata.shared} B, {ptxas_report(compiled.asm['ptx'], arch)}")
    if failed:
        sys.exit(f"{len(failed)} kernel(s) failed to compile for sm_{arch}: {', '.join(failed)}")


if __name__ == "__main__":
    main()
