"""GPU benchmark: dense batched verification vs SpecFold folded verification at controlled fold ratios.

    specscope bench-kernels                 # H200-sized synthetic model, about 2-4 minutes
    specscope bench-kernels --tiny          # a seconds-long CPU check of the same code path (PyTorch twins)

A synthetic model with random weights (default: hidden 2048, 16 layers, GQA 16/4, head 128, FFN 5632, fp16).
Per (branches B, prefix P, target fold ratio f): branch rows copy their parent's layer input at a share f of
positions (ρ = 0, folded at δ = 0.05) and differ elsewhere; every layer runs on that input, so the fold
pattern stays controlled. One verify step = all layers, dense (the engine's batched block-attention layer
over a gathered prefix) or folded (backend.forward.folded.fold_layer: Triton on CUDA). Reports time per
step, speedup, measured QKV/FFN fold ratios, achieved TFLOP/s and GB/s against ceilings measured here
(a large fp16 matmul and a device-to-device copy), and layer 0's largest output difference folded vs dense
(at target 0 nothing folds, so it is rounding only). Writes JSON (default docs/bench/kernels.json).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch
from torch import Tensor

from specscope.backend.forward.folded import TORCH_OPS, TRITON_OPS, fold_layer, layer_weights
from specscope.backend.model.config import ModelConfig
from specscope.backend.model.transformer import DecoderLayer, KVContext, PagedKV, Transformer, build_mask, rope_cos_sin
from specscope.kernels.gate import parent_rows

DELTA = 0.05
FFN_GATE = "strict"   # the stored H200 figures (docs/bench/kernels.json) were measured with the second FFN gate


@dataclass
class BenchConfig:
    hidden: int = 2048
    layers: int = 16
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 128
    ffn: int = 5632
    block: int = 32
    branches: tuple[int, ...] = (2, 4, 8)
    prefixes: tuple[int, ...] = (1024, 4096)
    folds: tuple[float, ...] = (0.0, 0.3, 0.6, 0.9)
    repeats: int = 5
    dtype: str = "float16"


TINY = BenchConfig(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, ffn=128, block=8, branches=(2, 3),
                   prefixes=(16,), folds=(0.0, 0.5), repeats=1, dtype="float32")


def synthetic_model(cfg: BenchConfig, device: str) -> Transformer:
    mc = ModelConfig(vocab_size=256, hidden_size=cfg.hidden, intermediate_size=cfg.ffn, num_hidden_layers=cfg.layers,
                     num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                     family="qwen3", qk_norm=True, max_position_embeddings=1 << 16)
    torch.manual_seed(0)
    with torch.device(device):          # initialise the weights where they will run (0.7 B parameters)
        model = Transformer(mc)
    return model.to(dtype=getattr(torch, cfg.dtype)).eval()


def branch_inputs(parents: list[int], n: int, d: int, fold: float, like: Tensor) -> Tensor:
    """h [R, N, D]: each draft branch equals its parent at a share `fold` of positions, differs elsewhere."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(len(parents), n, d, generator=g)
    for i in range(1, len(parents)):
        same = torch.rand(n, generator=g) < fold
        h[i] = torch.where(same[:, None], h[parents[i]], h[parents[i]] + torch.randn(n, d, generator=g))
    return h.to(like)


def timed(step: Callable[[], object], repeats: int, device: str) -> float:
    """Median seconds of `step` after one warm-up call."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    step()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def ceilings(device: str, dtype: torch.dtype, tiny: bool) -> dict[str, float]:
    """Measured peak-ish rates on this device: a square matmul (TFLOP/s) and a large copy (GB/s)."""
    n = 256 if tiny else 8192
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    t = timed(lambda: a @ b, 3, device)
    src = torch.empty((1 << 20) if tiny else (1 << 30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    c = timed(lambda: dst.copy_(src), 3, device)
    return {"matmul_tflops": 2 * n**3 / t / 1e12, "copy_gbps": 2 * src.numel() / c / 1e9}


def layer_costs(cfg: BenchConfig, rows_qkv: int, rows_ffn: int, rows_all: int, folded: int, prefix: int,
                prefix_reads: int) -> tuple[float, float]:
    """(FLOPs, minimum bytes) of one verify step: projections on the rows that compute them, attention of
    recomputed rows over prefix + block and of folded rows over the block, weights and prefix K/V read."""
    d, hd, h, hkv, f, n = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.block
    qkv_params, o_params, ffn_params = d * (h + 2 * hkv) * hd, h * hd * d, 3 * d * f
    flops = 2 * (rows_qkv * qkv_params + rows_all * o_params + rows_ffn * ffn_params)
    flops += 4 * h * hd * (rows_qkv * (prefix + n) + folded * n)
    elem = 2 if cfg.dtype != "float32" else 4
    weights = (qkv_params + o_params + ffn_params) * elem
    kv = prefix_reads * prefix * 2 * hkv * hd * elem
    return cfg.layers * flops, cfg.layers * (weights + kv)


def bench_case(model: Transformer, cfg: BenchConfig, cache: PagedKV, branches: int, prefix: int, fold: float,
               device: str) -> dict:
    parent_list = [-1] + [(i - 1) // 2 for i in range(1, branches)]
    parents = parent_rows(parent_list, torch.device(device))
    n, layers = cfg.block, cast(list[DecoderLayer], list(model.layers))
    h0 = branch_inputs(parent_list, n, cfg.hidden, fold, cache.k)
    positions = torch.arange(prefix, prefix + n, device=device)[None].expand(branches, n)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, 10000.0)
    slots = torch.arange(prefix, device=device, dtype=torch.int32)
    kv = KVContext(cache, slots.long()[None].expand(branches, prefix))
    mask = build_mask(n, "block", kv, branches, torch.device(device))
    ops = TRITON_OPS if device == "cuda" else TORCH_OPS
    weights = [layer_weights(layer, layer.self_attn.cfg.rms_norm_eps) for layer in layers]   # made once, as at load
    counts: list[Tensor] = []

    def dense() -> None:
        for i, layer in enumerate(layers):
            layer(i, h0, cos, sin, mask, kv, False, None)

    def folded() -> None:
        counts.clear()
        for i, layer in enumerate(layers):
            counts.append(fold_layer(ops, layer, weights[i], h0, parents, DELTA, cos[0, :, 0], sin[0, :, 0],
                                     cache.k[i], cache.v[i], slots, FFN_GATE)[1])

    with torch.no_grad():
        t_dense, t_folded = timed(dense, cfg.repeats, device), timed(folded, cfg.repeats, device)
        want = layers[0](0, h0, cos, sin, mask, kv, False, None).reshape(branches * n, -1)
        got = fold_layer(ops, layers[0], weights[0], h0, parents, DELTA, cos[0, :, 0], sin[0, :, 0], cache.k[0],
                         cache.v[0], slots, FFN_GATE)[0]
    draft_rows = (branches - 1) * n
    per_layer = torch.stack(counts)[:, :, 1:].sum(-1).float().mean(0).tolist()   # draft rows recomputed, QKV/FFN
    qkv_rec, ffn_rec = per_layer
    rows_all = branches * n
    dense_flops, dense_bytes = layer_costs(cfg, rows_all, rows_all, rows_all, 0, prefix, branches)
    fold_flops, fold_bytes = layer_costs(cfg, round(n + qkv_rec), round(n + ffn_rec), rows_all,
                                         round(draft_rows - qkv_rec), prefix, 1)
    return {"branches": branches, "prefix": prefix, "target_fold": fold,
            "fold_qkv": 1 - qkv_rec / draft_rows, "fold_ffn": 1 - ffn_rec / draft_rows,
            "dense_ms": t_dense * 1e3, "folded_ms": t_folded * 1e3, "speedup": t_dense / t_folded,
            "dense_tflops": dense_flops / t_dense / 1e12, "folded_tflops": fold_flops / t_folded / 1e12,
            "dense_gbps": dense_bytes / t_dense / 1e9, "folded_gbps": fold_bytes / t_folded / 1e9,
            "layer0_max_diff": float((got.float() - want.float()).abs().max())}


def bench(cfg: BenchConfig, device: str, tiny: bool) -> dict:
    started = time.perf_counter()
    model = synthetic_model(cfg, device)
    dtype = getattr(torch, cfg.dtype)
    cache = PagedKV.empty(model.cfg, max(cfg.prefixes), dtype, device)
    cache.k.normal_()
    cache.v.normal_()
    rows = [bench_case(model, cfg, cache, b, p, f, device)
            for b in cfg.branches for p in cfg.prefixes for f in cfg.folds]
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    return {"device": name, "backend": "triton" if device == "cuda" else "torch twins", "delta": DELTA,
            "ffn_gate": FFN_GATE, "config": asdict(cfg), "ceilings": ceilings(device, dtype, tiny), "rows": rows,
            "elapsed_s": time.perf_counter() - started}


def table(result: dict) -> str:
    head = "| B | prefix | fold target | fold QKV/FFN | dense ms | folded ms | speedup | TFLOP/s d/f | GB/s d/f |"
    lines = [head, "|" + "---|" * 9]
    for r in result["rows"]:
        lines.append(f"| {r['branches']} | {r['prefix']} | {r['target_fold']:.1f} | {r['fold_qkv']:.2f}/"
                     f"{r['fold_ffn']:.2f} | {r['dense_ms']:.2f} | {r['folded_ms']:.2f} | {r['speedup']:.2f} | "
                     f"{r['dense_tflops']:.1f}/{r['folded_tflops']:.1f} | "
                     f"{r['dense_gbps']:.0f}/{r['folded_gbps']:.0f} |")
    c = result["ceilings"]
    lines.append(f"\nceilings on {result['device']}: matmul {c['matmul_tflops']:.1f} TFLOP/s, "
                 f"copy {c['copy_gbps']:.0f} GB/s; {result['elapsed_s']:.0f} s")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tiny", action="store_true", help="a tiny config that runs in seconds on CPU")
    p.add_argument("--out", default="docs/bench/kernels.json")


def run(args: argparse.Namespace) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = bench(TINY if args.tiny else BenchConfig(), device, args.tiny)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0
