"""GPU check: every registered mode on the shipped model and on a random model the size of
Nemotron-Labs-Diffusion-8B, with the lossless equalities, KV invariants, TPF, tokens/s and memory per mode,
then `python -m tools.kernel_bench`.

    python -m tools.gpu_check                 # CUDA: shipped model fp32 + synthetic 8B bf16, then tools.kernel_bench
    python -m tools.gpu_check --set specfold.backend=triton   # specfold through the Triton kernels
    python -m tools.gpu_check --tiny          # CPU, tiny synthetic config: the same checks in seconds

Lossless equalities (each mode's `lossless_vs`) are hard checks on the shipped model in fp32, where the
invariants are stated (specfold: in its extra row with delta=0, see EXACT); on the random model, whose logits
are near-tied everywhere (bf16 on the GPU), they are reported as the share of prompts with identical output.
KV invariants are checked after every round (Engine(check_invariants=True)) and every run must end with nothing leaked.
Only the public Engine API is used.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import describe_modes
from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, LoadedModel, load_checkpoint
from specscope.backend.model.config import ModelConfig
from specscope.backend.model.families import BY_NAME
from specscope.backend.model.rope import RopeSpec
from specscope.backend.model.transformer import ATTN_MODES, Transformer

PROMPTS = ["Sort these numbers: 9 2 7 4 1 8", "What is 17 + 25?", "Count the vowels in 'banana'.",
           "Write a Python function that reverses a list.", "What does the len() function return?",
           "Repeat the word cat three times."]
NLD_ROPE = RopeSpec("yarn", factor=16.0, original_max_position_embeddings=16384, llama_4_scaling_beta=0.1)
"""Nemotron-Labs-Diffusion's rope_parameters (no mscale keys: cos/sin scaled by 0.1 ln 16 + 1)."""


@dataclass
class ModeReport:
    target: str
    mode: str
    status: str                  # ok | failed | skipped
    tokens: int = 0
    nfe: int = 0
    tpf: float | None = None
    tok_per_s: float | None = None
    kv_peak: int = 0
    mem_mib: float | None = None  # peak CUDA memory during the mode, weights included
    lossless_vs: str | None = None
    same_as_ref: float | None = None   # share of prompts whose output equals the reference mode's
    note: str = ""


def nld8b_config(tiny: bool) -> ModelConfig:
    """Nemotron-Labs-Diffusion-8B's shape (Ministral3: 34 layers, 4096 wide, GQA 32/8, YaRN + llama-4 scaling)
    or a tiny one with the same features (original_max 16, so decoding runs past it)."""
    if tiny:
        return ModelConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, family="ministral3",
                           qk_norm=False, tie_word_embeddings=False, rope_theta=1e6, max_position_embeddings=1024,
                           rope=RopeSpec(**(asdict(NLD_ROPE) | {"original_max_position_embeddings": 16})))
    return ModelConfig(vocab_size=131072, hidden_size=4096, intermediate_size=14336, num_hidden_layers=34,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, family="ministral3",
                       qk_norm=False, tie_word_embeddings=False, rope_theta=1e6, rms_norm_eps=1e-5,
                       max_position_embeddings=262144, rope=NLD_ROPE)


def synthetic(cfg: ModelConfig, dtype: torch.dtype, device: str, folder: Path) -> LoadedModel:
    """Random weights built on the device in `dtype`, declared as a Nemotron-Labs-Diffusion model, with the
    shipped tokenizer; the shipped draft graph is copied into folder (spiffy / specfold read it from there)."""
    shutil.copy(DEFAULT_CHECKPOINT / "draft_graph.json", folder / "draft_graph.json")
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Transformer(cfg)
    finally:
        torch.set_default_dtype(default)
    family = BY_NAME["nemotron_labs_diffusion"]
    shipped = load_checkpoint(DEFAULT_CHECKPOINT)
    return LoadedModel(model.eval().requires_grad_(False), shipped.tokenizer, family.mask_token_id, None,
                       f"synthetic-nld-{'tiny' if cfg.hidden_size < 1024 else '8b'}", folder, family=family.name,
                       weights_hash="random-seed0",
                       logits_shifted={m: m not in family.unshifted for m in ATTN_MODES},
                       block_size=family.default_block_size)


EXACT = {"delta": 0.0, "ffn_gate": "strict"}
"""Parameter values under which an approximate mode (specfold) is stated lossless (DESIGN section 4)."""


def variants(mode: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(row name, params): the mode at its defaults, plus an exact row where EXACT names its parameters."""
    exact = {k: v for k, v in EXACT.items() if k in {p["name"] for p in mode["params"]}}
    rows = [(mode["name"], {})]
    if exact:
        rows.append((mode["name"] + "[" + ",".join(f"{k}={v}" for k, v in exact.items()) + "]", exact))
    return rows


def run_target(name: str, loaded: LoadedModel, max_new_tokens: int, prompts: list[str], strict: bool,
               slots: int, only: list[str] | None = None,
               overrides: dict[str, dict[str, Any]] | None = None) -> list[ModeReport]:
    """Every registered mode on every prompt. Lossless references are compared after all modes ran; a
    difference fails the check only when `strict` and the row runs the mode where it is stated lossless."""
    engine = Engine(loaded, num_slots=slots, check_invariants=True)
    cuda = loaded.model.embed_tokens.weight.is_cuda
    outputs: dict[str, list[list[int]]] = {}
    reports: list[tuple[ModeReport, bool]] = []
    for m in describe_modes():
        if only and m["name"] not in only:
            continue
        for row, exact in variants(m):
            extra = (overrides or {}).get(m["name"], {}) | exact
            rep = ModeReport(name, row, "ok", lossless_vs=m["lossless_vs"])
            reports.append((rep, row == m["name"] and len(variants(m)) > 1))
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            try:
                results = [engine.generate(p, m["name"], {"max_new_tokens": max_new_tokens} | extra) for p in prompts]
            except Exception as e:  # a mode this model cannot run (e.g. ParamError) is reported, not fatal
                rep.status, rep.note = "skipped", f"{type(e).__name__}: {e}"
                continue
            outputs[row] = [r.output_ids for r in results]
            measure(rep, results, cuda)
    for rep, approximate in reports:
        ref = rep.lossless_vs
        if ref is None or rep.mode not in outputs or ref not in outputs:
            continue
        same = [a == b for a, b in zip(outputs[rep.mode], outputs[ref], strict=True)]
        rep.same_as_ref = sum(same) / len(same)
        if strict and not approximate and not all(same):
            rep.status = "failed"
            rep.note += f" output differs from {ref} on prompt {same.index(False)}"
    return [rep for rep, _ in reports]


def measure(rep: ModeReport, results: list, cuda: bool) -> None:
    """Fill a report row from the runs' metrics: status, tokens, NFE, TPF, tok/s, KV and CUDA memory peaks."""
    bad = [r for r in results if r.status != "done" or r.metrics.get("kv_leaked")]
    if bad:
        rep.status = "failed"
        rep.note = f"{bad[0].status}: {bad[0].error} (kv_leaked {bad[0].metrics.get('kv_leaked')})"
    rep.tokens = sum(r.metrics["tokens"] for r in results)
    rep.nfe = sum(r.metrics["nfe"] for r in results)
    rep.tpf = rep.tokens / rep.nfe if rep.nfe else None
    wall_ms = sum(r.metrics["wall_ms"] for r in results)
    rep.tok_per_s = rep.tokens / wall_ms * 1000 if wall_ms else None
    rep.kv_peak = max(r.metrics["kv_peak"] for r in results)
    if cuda:
        rep.mem_mib = torch.cuda.max_memory_allocated() / 2**20


def table(reports: list[ModeReport]) -> str:
    lines = ["| model | mode | status | tokens | NFE | TPF | tok/s | KV peak | mem MiB | same as ref | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    for r in reports:
        ref = "-" if r.same_as_ref is None else f"{r.same_as_ref:.0%} vs {r.lossless_vs}"
        lines.append(f"| {r.target} | {r.mode} | {r.status} | {r.tokens} | {r.nfe} | {f(r.tpf, '.2f')} | "
                     f"{f(r.tok_per_s, '.1f')} | {r.kv_peak} | {f(r.mem_mib, '.0f')} | {ref} | {r.note.strip()} |")
    return "\n".join(lines)


def kernels_bench(tiny: bool, out: Path) -> int:
    cmd = [sys.executable, "-m", "tools.kernel_bench", "--out", str(out / "kernels.json")]
    cmd += ["--tiny"] if tiny else []
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


def parse_sets(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """MODE.KEY=VALUE pairs as {mode: {key: value}}; values are read as JSON when they parse."""
    sets: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        target, _, value = pair.partition("=")
        mode, _, key = target.partition(".")
        if not (mode and key and _):
            raise SystemExit(f"--set takes MODE.KEY=VALUE, got {pair!r}")
        try:
            sets.setdefault(mode, {})[key] = json.loads(value)
        except ValueError:
            sets.setdefault(mode, {})[key] = value
    return sets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, fp32, tiny synthetic model: seconds")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: 12 tiny, 128 on the GPU")
    ap.add_argument("--prompts", type=int, default=None, help="how many prompts per mode (default: 1 tiny, 6)")
    ap.add_argument("--slots", type=int, default=8192, help="KV pool size per model")
    ap.add_argument("--out", default="gpu_check", help="folder for report.json, report.md, kernels.json")
    ap.add_argument("--no-bench", action="store_true", help="skip python -m tools.kernel_bench")
    ap.add_argument("--modes", nargs="+", help="only these modes (default: every registered one)")
    ap.add_argument("--set", action="append", default=[], metavar="MODE.KEY=VALUE",
                    help="a mode parameter for every run of that mode, e.g. specfold.backend=triton")
    args = ap.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        ap.error("no CUDA device; use --tiny for the CPU check")
    device = "cpu" if args.tiny else "cuda"
    tokens = args.max_new_tokens or (12 if args.tiny else 128)
    prompts = PROMPTS[: args.prompts or (1 if args.tiny else len(PROMPTS))]
    overrides = parse_sets(args.set)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    reports = run_target("shipped", load_checkpoint(DEFAULT_CHECKPOINT, device=device), tokens, prompts, True,
                         args.slots, args.modes, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        big = synthetic(nld8b_config(args.tiny), torch.float32 if args.tiny else torch.bfloat16, device, Path(tmp))
        reports += run_target(big.name, big, tokens, prompts, False, args.slots, args.modes, overrides)
        del big
    md = table(reports)
    print(md, flush=True)
    summary: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                               "max_new_tokens": tokens, "prompts": prompts,
                               "elapsed_s": round(time.perf_counter() - t0, 1),
                               "modes": [asdict(r) for r in reports]}
    (out / "report.json").write_text(json.dumps(summary, indent=1))
    (out / "report.md").write_text(md + "\n")
    failed = [r for r in reports if r.status == "failed"]
    bench_rc = 0 if args.no_bench else kernels_bench(args.tiny, out)
    return 1 if failed or bench_rc else 0


if __name__ == "__main__":
    sys.exit(main())
