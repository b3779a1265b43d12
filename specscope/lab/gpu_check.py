"""GPU check: every registered mode on the shipped model and on a random model the size of
Nemotron-Labs-Diffusion-8B, with the lossless equalities, KV invariants, TPF, tokens/s and memory per mode,
then `specscope bench-kernels`.

    specscope gpu-check                 # CUDA: shipped model fp32 + synthetic 8B bf16, then specscope bench-kernels
    specscope gpu-check --set specfold.backend=triton   # specfold through the Triton kernels
    specscope gpu-check --tiny          # CPU, tiny synthetic config: the same checks in seconds

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
from specscope.backend.engine.lossless import Outcome, claim_of, verdict
from specscope.backend.engine.modes import describe_modes
from specscope.backend.engine.params import ParamError
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


def variants(mode: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(row name, params): the mode at its defaults, plus a row at its lossless claim's parameters where the claim
    fixes some (specfold: δ = 0 with the strict FFN gate)."""
    exact = dict(mode["lossless_params"] or {})
    rows: list[tuple[str, dict[str, Any]]] = [(mode["name"], {})]
    if exact:
        rows.append((mode["name"] + "[" + ",".join(f"{k}={v}" for k, v in exact.items()) + "]", exact))
    return rows


@dataclass
class Ran:
    """A report row's runs, as the lossless verdict reads them."""
    mode: str
    params: dict[str, Any]
    outputs: list[list[int]]


def run_target(name: str, loaded: LoadedModel, max_new_tokens: int, prompts: list[str], strict: bool,
               slots: int, only: list[str] | None = None,
               overrides: dict[str, dict[str, Any]] | None = None) -> list[ModeReport]:
    """Every registered mode on every prompt. Lossless references are compared after all modes ran; a
    difference fails the check only when `strict` and the lossless verdict could check the row's claim."""
    engine = Engine(loaded, num_slots=slots, check_invariants=True)
    cuda = loaded.model.embed_tokens.weight.is_cuda
    ran: dict[str, Ran] = {}
    reports: list[ModeReport] = []
    for m in describe_modes():
        if only and m["name"] not in only:
            continue
        for row, exact in variants(m):
            params = {"max_new_tokens": max_new_tokens} | (overrides or {}).get(m["name"], {}) | exact
            rep = ModeReport(name, row, "ok", lossless_vs=m["lossless_vs"])
            reports.append(rep)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            try:
                results = [engine.generate(p, m["name"], params) for p in prompts]
            except Exception as e:  # a mode this model cannot run (e.g. ParamError) is reported, not fatal
                rep.status, rep.note = "skipped", f"{type(e).__name__}: {e}"
                continue
            ran[row] = Ran(m["name"], params, [r.output_ids for r in results])
            measure(rep, results, cuda)
    for rep in reports:
        if rep.lossless_vs in ran and rep.mode in ran:
            judge(rep, ran[rep.mode], ran[rep.lossless_vs], strict)
    return reports


def judge(rep: ModeReport, mine: Ran, ref: Ran, strict: bool) -> None:
    """The row's share of prompts identical to its reference; failed where strict and a checkable claim fails."""
    found = [verdict(Outcome(mine.mode, a, mine.params), Outcome(ref.mode, b, ref.params), claim_of(mine.mode))
             for a, b in zip(mine.outputs, ref.outputs, strict=True)]
    rep.same_as_ref = sum(v.identical for v in found) / len(found)
    failing = [i for i, v in enumerate(found) if v.checked and not v.identical]
    if strict and failing:
        rep.status = "failed"
        rep.note += f" output differs from {ref.mode} on prompt {failing[0]}"


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
    cmd = [sys.executable, "-m", "specscope.backend.cli", "bench-kernels", "--out", str(out / "kernels.json")]
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


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tiny", action="store_true", help="CPU, fp32, tiny synthetic model: seconds")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: 12 tiny, 128 on the GPU")
    ap.add_argument("--prompts", type=int, default=None, help="how many prompts per mode (default: 1 tiny, 6)")
    ap.add_argument("--slots", type=int, default=8192, help="KV pool size per model")
    ap.add_argument("--out", default="gpu_check", help="folder for report.json, report.md, kernels.json")
    ap.add_argument("--no-bench", action="store_true", help="skip specscope bench-kernels")
    ap.add_argument("--modes", nargs="+", help="only these modes (default: every registered one)")
    ap.add_argument("--set", action="append", default=[], metavar="MODE.KEY=VALUE",
                    help="a mode parameter for every run of that mode, e.g. specfold.backend=triton")


def run(args: argparse.Namespace) -> int:
    if not args.tiny and not torch.cuda.is_available():
        raise ParamError("no CUDA device; use --tiny for the CPU check")
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
