"""Benchmark every decoding mode on one fixed held-out prompt set; every ratio comes from this one run.

    specscope bench [--model smollm2-135m|tiny|DIR] [--modes ar,isd,quadratic] [--prompts 36] [--repeats 5]
                    [--threads 1] [--clock wall|cpu] [--variant specfold:ffn_gate=strict] [--adapter-off]
                    [--no-tracing] [--no-peer] [--out bench_results]

Prompts: a checkpoint that ships tasks.jsonl (the tiny model) is benched on its held-out tasks; any other model
on held-out chat prompts (backend/train/prompts.py: templates never trained on by the self-speculation
adapter), one user message each, through the model's chat template.

Per mode: NFE, TPF, tokens/s, accepted-length histogram, exact-match accuracy on the synthetic tasks, token
equality with the mode's lossless reference (`ar` by default), tokens/s as a ratio to `ar` and to the peer baseline
(HF `transformers` `generate`, greedy, eager attention, its default DynamicCache, on the same checkpoint and
prompts) and, for the default model when llama-cpp-python is installed, to llama.cpp on the GGUF, the tracing-on /
tracing-off time ratio (in-process RecordingTracer vs none), the median batched verify-forward time against the
reference mode's (e.g. SpecFold's folded verify vs spiffy's dense one), the share of time per forward kind, and the
mode's own metrics (e.g. fold_ratio), read generically from its runs. Times (wall clock, or --clock cpu: this
process's CPU time) are medians over repeats; each repeat times every row and the peer in turn, and within a row
each prompt runs untraced and traced back to back (the tracing ratio is the median over repeats of the traced /
untraced time). Writes bench.json and bench.md to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from specscope.backend.bench_cells import model_pick, same_as_reference
from specscope.backend.cli.common import with_cost_curve
from specscope.backend.cli.options import add_cost_curve_arg, add_forward_arg
from specscope.backend.engine.answer_fit import answer_fit, summed
from specscope.backend.engine.draft_tiers import draft_tiers_of
from specscope.backend.engine.engine import Engine, RunResult
from specscope.backend.engine.lossless import Claim, Outcome, Verdict, claim_of, verdict
from specscope.backend.engine.modes import baseline, get_mode, mode_names
from specscope.backend.engine.speedup import DIGITS, against_baseline, shown
from specscope.backend.forward.fused_step import MATMULS
from specscope.backend.model.checkpoint import DTYPES, load_checkpoint
from specscope.backend.model.families import ADAPTER_SCOPES
from specscope.backend.model.source import DEFAULT_MODEL, ModelSource, resolve
from specscope.backend.tracing import NULL_TRACER, RecordingTracer
from specscope.backend.train.prompts import prompt_set
from specscope.backend.train.tasks import Task, checkpoint_tasks
from specscope.lab.bench_load import load_table
from specscope.lab.bench_load import markdown as load_markdown
from specscope.lab.verify_rows import markdown as verify_rows_markdown
from specscope.lab.verify_rows import verify_rows

STANDARD = {"nfe", "tokens", "tpf", "wall_ms", "tok_per_s", "accept_len_mean", "accept_hist", "kv_peak",
            "kv_leaked", "rounds", "forward_ms", "mean_forward_ms", "forward_share", "forward_rows"}
PEER = "transformers"
LLAMA_CPP = "llama.cpp"
FLOAT32 = " (float32)"
"""With --matmul bf16: the baseline (the exact mode) with the float32 fused step, the exact model's fastest path, in
the same run, as the row of its name with this suffix."""
BENCH_SEED = 7
"""The held-out chat prompts' draw (the adapter's held-out figures use seed 0 of the same templates)."""
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
"""The lscpu flags that decide which matmul path runs (a figure names them with its machine)."""
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""cpu: this process's CPU time, robust to other processes on a shared machine (use it with --threads 1: with
more threads it also counts their spinning)."""
Clock = Callable[[], float]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default="", help="comma-separated modes (default: all registered)")
    p.add_argument("--model", "--checkpoint", dest="model", default=DEFAULT_MODEL,
                   help=f"model name or checkpoint folder (default {DEFAULT_MODEL})")
    p.add_argument("--per-kind", type=int, default=6,
                   help="held-out prompts per task kind, for a checkpoint that ships tasks.jsonl (the tiny model)")
    p.add_argument("--prompts", type=int, default=36, help="held-out chat prompts, for any other model")
    p.add_argument("--adapter", default=None,
                   help="PEFT adapter folder (default: the one shipped for the model, if any); 'none' benches without")
    p.add_argument("--adapter-scope", choices=[s for s in ADAPTER_SCOPES if s], default=None,
                   help="where the adapter applies: draft passes or MASK positions (default: the adapter's own)")
    p.add_argument("--adapter-off", action="store_true",
                   help="also bench every --modes mode that drafts with MASK (not the variants) on the model "
                        "without its adapter")
    p.add_argument("--no-tracing", action="store_true",
                   help="time untraced runs only (no tracing on/off ratio): halves a slow model's bench")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's own)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="time runs by wall clock or by this process's CPU time (shared machines, --threads 1)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="weights, KV and activations of our engine and of the peer alike (the lossless equalities "
                        "are claimed in float32)")
    p.add_argument("--matmul", choices=MATMULS, default="float32",
                   help="the fused CPU step's matmuls: float32, or bf16 on AMX tiles (then `ar` also runs with "
                        "float32 matmuls, as the row 'ar (float32)')")
    add_forward_arg(p)
    p.add_argument("--no-peer", action="store_true",
                   help="skip the peers (transformers generate; llama.cpp on the GGUF when installed)")
    p.add_argument("--variant", action="append", default=[], metavar="MODE:KEY=VALUE[,KEY=VALUE]",
                   help="also bench MODE with these parameters as a row of its own, e.g. specfold:ffn_gate=strict")
    p.add_argument("--out", default="bench_results")
    p.add_argument("--lossless", action="store_true",
                   help="check the lossless claims instead of timing: every mode that declares one (or --modes), "
                        "at its claim's parameters, against its reference on the prompts, once, with the "
                        "drafter's figure beside it; exits 1 where a claim fails or a drafter does not draft")
    p.add_argument("--summary", metavar="BENCH_JSON",
                   help="print the headline table of a stored bench.json (no run); with --into FILE, write it "
                        "between the file's bench-table markers instead")
    p.add_argument("--into", metavar="FILE", help="with --summary: the file whose bench-table section it replaces")
    p.add_argument("--draft-tiers", metavar="auto|none|N:R,...", default="none",
                   help="with --concurrency: the engine's draft tiers (auto: from this machine's verify cost)")
    add_cost_curve_arg(p)
    p.add_argument("--concurrency", metavar="N,N,...",
                   help="instead of the per-mode table: each of --modes (default: the baseline and every mode that "
                        "drafts under a draft tier's budget, Mode.draft_param) alone "
                        "and mixed with N requests at once, e.g. 1,4,16 (load.json and load.md in --out)")


def paired_pass(engine: Engine, mode: str, tasks: list[Task], params: dict, clock: Clock,
                traced: bool = True) -> tuple[dict[bool, float], dict[bool, list[RunResult]]]:
    """One pass over the prompts, each run untraced and traced back to back (alternating which goes first), so
    the on/off ratio compares runs made moments apart (traced=False: untraced only). Returns the seconds and
    results by tracing on/off."""
    spent: dict[bool, float] = {False: 0.0, True: 0.0}
    results: dict[bool, list[RunResult]] = {False: [], True: []}
    for i, task in enumerate(tasks):
        for tracing in ((False, True) if i % 2 == 0 else (True, False)) if traced else (False,):
            t0 = clock()
            res = engine.generate(task.prompt, mode, params, tracer=RecordingTracer() if tracing else NULL_TRACER)
            spent[tracing] += clock() - t0
            results[tracing].append(res)
    return spent, results


@dataclass
class ForwardClock:
    """Installed as the engine runtime's `run` (the forward under every verb): times every forward with the
    bench's clock, by kind (prefill, decode, denoise, verify, ...); the traces' phase times are wall times."""
    forward: Callable[..., Any]
    clock: Clock
    ms: dict[str, list[float]]

    def __call__(self, *args: Any, kind: str, **kwargs: Any) -> Any:
        t0 = self.clock()
        out = self.forward(*args, kind=kind, **kwargs)
        self.ms.setdefault(kind, []).append((self.clock() - t0) * 1000)
        return out


def time_split(ms: dict[str, list[float]], total_s: float) -> dict[str, float]:
    """Share of the passes' time per forward kind, and `other` (sampling, mode and engine Python, tracing)."""
    split = dict(sorted(((k, sum(v) / 1000 / total_s) for k, v in ms.items()), key=lambda kv: -kv[1]))
    return {**split, "other": 1 - sum(split.values())}


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """"specfold:ffn_gate=strict,delta=0.2" -> ("specfold", {"ffn_gate": "strict", "delta": 0.2})."""
    mode, _, pairs = spec.partition(":")
    params: dict[str, Any] = {}
    for pair in filter(None, pairs.split(",")):
        key, _, value = pair.partition("=")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return mode, params


@dataclass
class ModeBench:
    """One bench row (a mode with its parameters), timed one pass per repeat: the run loop interleaves every
    row and the peer within each repeat, so a slow spell of a shared machine hits them all alike."""
    engine: Engine
    mode: str
    tasks: list[Task]
    params: dict
    clock: Clock
    traced: bool = True
    times: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    outputs: dict[bool, list[RunResult]] = field(default_factory=dict)
    timed: list[RunResult] = field(default_factory=list)
    """Every timed pass's untraced runs (the speedup's factors are summed over them, as its tok/s is timed)."""
    forward_ms: dict[str, list[float]] = field(default_factory=dict)

    def warm_up(self) -> None:
        self.engine.generate(self.tasks[0].prompt, self.mode, self.params)

    def timed_pass(self) -> None:
        rt = self.engine.rt
        rt.run = ForwardClock(rt.run, self.clock, self.forward_ms)  # type: ignore[method-assign]
        try:
            spent, self.outputs = paired_pass(self.engine, self.mode, self.tasks, self.params, self.clock,
                                              self.traced)
        finally:
            del rt.run                                       # the class's own method again
        for tracing, seconds in spent.items():
            if tracing in self.outputs and self.outputs[tracing]:
                self.times[tracing].append(seconds)
        self.timed += self.outputs[False]

    def row(self) -> dict[str, Any]:
        tasks, runs, verify = self.tasks, self.outputs[False], self.forward_ms.get("verify")
        nfe = sum(r.metrics["nfe"] for r in runs)
        tokens = sum(r.metrics["tokens"] for r in runs)
        hist: Counter[str] = Counter()
        for r in runs:
            hist.update(r.metrics["accept_hist"])
        rounds = sum(hist.values())
        correct: Counter[str] = Counter()
        for t, r in zip(tasks, runs, strict=True):
            correct[t.kind] += r.text.strip() == t.answer
        kinds = sorted({t.kind for t in tasks})
        per_kind = {k: correct[k] / sum(t.kind == k for t in tasks) for k in kinds}
        checked = any(t.answer for t in tasks)   # chat prompts have no reference answer
        t_off = statistics.median(self.times[False])
        extra = mode_metrics(runs)
        drafter = get_mode(self.mode).drafter
        fit = summed([answer_fit(self.engine, self.engine.encode_prompt(t.prompt, raw=False), r.output_ids)
                      for t, r in zip(tasks, runs, strict=True)])
        return {
            "mode": self.mode, "params": self.params, "nfe": nfe, "tokens": tokens,
            "tpf": tokens / nfe if nfe else None, "time_s": t_off, "tok_per_s": tokens / t_off,
            "accept_len_mean": sum(int(k) * v for k, v in hist.items()) / rounds if rounds else None,
            "accept_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
            "accuracy": {**per_kind, "average": sum(per_kind.values()) / len(per_kind)} if checked else None,
            "tracing_ratio": statistics.median(on / off for on, off in zip(self.times[True], self.times[False],
                                                                             strict=True)) if self.traced else None,
            "tracing_identical": [r.output_ids for r in self.outputs[True]] == [r.output_ids for r in runs]
            if self.traced else None,
            "greedy_share": fit["greedy_share"], "answer_nll": fit["nll"],
            "kv_leaked": sum(r.metrics["kv_leaked"] for r in runs),
            "kv_peak": max(r.metrics["kv_peak"] for r in runs),
            "mode_metrics": extra,
            "fold_ratio": extra.get("fold_ratio"),        # the UI's bench tab reads it here
            "verify_forward_ms": statistics.median(verify) if verify else None,
            "time_split": time_split(self.forward_ms, sum(self.times[False]) + sum(self.times[True])),
            "drafter_mean": sum(r.metrics.get(drafter[0]) or 0.0 for r in runs) / len(runs) if drafter else None,
            **forward_figures(self.timed),
            "outputs": [r.output_ids for r in runs],
        }


def forward_figures(runs: list[RunResult]) -> dict[str, Any]:
    """The speedup decomposition's inputs over a row's timed runs: mean forward ms, the forwards' share of wall
    time, and how many forwards computed each number of rows."""
    forward_ms = sum(r.metrics["forward_ms"] for r in runs)
    nfe, wall = sum(r.metrics["nfe"] for r in runs), sum(r.metrics["wall_ms"] for r in runs)
    rows: Counter[str] = Counter()
    for r in runs:
        rows.update(r.metrics["forward_rows"])
    return {"mean_forward_ms": forward_ms / nfe if nfe else None, "forward_share": forward_ms / wall if wall else None,
            "forward_rows": dict(rows)}


def mode_metrics(runs: list[RunResult]) -> dict[str, float]:
    """Mode-specific metrics over the prompt set: counts are summed, ratios averaged over runs."""
    values: dict[str, list] = {}
    for r in runs:
        for k, v in r.metrics.items():
            if k not in STANDARD and isinstance(v, (int, float)) and not isinstance(v, bool):
                values.setdefault(k, []).append(v)
    return {k: sum(vs) if all(isinstance(v, int) for v in vs) else sum(vs) / len(vs) for k, vs in values.items()}


Generate = Callable[[list[int], int], list[int]]
"""A peer's greedy generation: prompt ids, max new tokens -> new ids (it may run past EOS; cut here)."""


@dataclass
class PeerBench:
    """A peer engine on the same model and chat-encoded prompts; tokens counted as ours (up to, without, EOS)."""
    name: str
    generate: Generate
    prompts: list[list[int]]
    eos: int | None
    max_new_tokens: int
    clock: Clock
    times: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    def warm_up(self) -> None:
        self.generate(self.prompts[0], 4)

    def timed_pass(self) -> None:
        t0 = self.clock()
        outs = [self.generate(ids, self.max_new_tokens) for ids in self.prompts]
        self.times.append(self.clock() - t0)
        self.outputs = [o[:o.index(self.eos)] if self.eos in o else o for o in outs]

    def row(self) -> dict[str, Any]:
        spent = statistics.median(self.times)
        tokens = sum(len(o) for o in self.outputs)
        return {"mode": self.name, "tokens": tokens, "time_s": spent, "tok_per_s": tokens / spent,
                "outputs": self.outputs}


def transformers_peer(folder: Path, dtype: torch.dtype, eos: int | None) -> Generate:
    """HF transformers `generate`: greedy, eager attention, its default DynamicCache."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()

    def generate(ids: list[int], max_new_tokens: int) -> list[int]:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=eos, pad_token_id=eos)
        return out[0, x.shape[1]:].tolist()
    return generate


def llama_cpp_peer(gguf: Path, eos: int | None, threads: int) -> Generate | None:
    """llama.cpp (llama-cpp-python, `pip install .[peers]`) on the GGUF itself, greedy; None when not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, verbose=False)

    def generate(ids: list[int], max_new_tokens: int) -> list[int]:
        out: list[int] = []
        for tok in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
            out.append(int(tok))
            if tok == eos or len(out) >= max_new_tokens:
                break
        return out
    return generate


def compare_to_references(rows: dict[str, dict[str, Any]], peer: dict[str, Any] | None) -> None:
    """Fill same_as_reference (fraction of prompts with identical tokens), agreed_prefix (per prompt, the share of
    the reference's tokens given before the first difference, averaged), lossless (where the row's mode claims
    equality with its reference and the claim covers its parameters: the prompts checked and those identical,
    from `verdict`), tokens/s ratios to the baseline, the exact mode (speedup_vs_ar) and to the peer (vs_peer), and
    the verify-forward speed-up over the reference mode."""
    exact = baseline()
    for row in rows.values():
        claim = claim_of(row["mode"])
        ref = claim.reference if claim else exact
        row["reference"] = ref
        if ref in rows:
            found = pair_verdicts(row, rows[ref], claim)
            row["same_as_reference"] = sum(v.identical for v in found) / len(found)
            row["agreed_prefix"] = sum(agreed_share(v) for v in found) / len(found)
            if claim is not None and all(v.checked for v in found):
                row["lossless"] = {"prompts": len(found), "identical": sum(v.identical for v in found)}
            ref_ms, ms = rows[ref].get("verify_forward_ms"), row.get("verify_forward_ms")
            if ref_ms and ms:
                row["verify_speedup_vs_reference"] = ref_ms / ms
        if exact in rows:
            row["speedup_vs_ar"] = row["tok_per_s"] / rows[exact]["tok_per_s"]
            row["speedup_explained"] = against_baseline(row, rows[exact])
        if peer is not None:
            row["vs_peer"] = row["tok_per_s"] / peer["tok_per_s"]
    if peer is not None and exact in rows:
        pairs = list(zip(peer["outputs"], rows[exact]["outputs"], strict=True))
        peer["same_as_ar"] = sum(a == b for a, b in pairs) / len(pairs)


def pair_verdicts(row: dict[str, Any], ref: dict[str, Any], claim: Claim | None) -> list[Verdict]:
    """The lossless verdict on each prompt of a bench row against its reference row (same engine and prompts)."""
    mine, theirs = row.get("params", {}), ref.get("params", {})
    return [verdict(Outcome(row["mode"], out, mine), Outcome(ref["mode"], ref_out, theirs), claim)
            for out, ref_out in zip(row["outputs"], ref["outputs"], strict=True)]


def agreed_share(v: Verdict) -> float:
    """The share of the reference's tokens given before the first difference."""
    return 1.0 if v.identical else min(v.first_difference or 0, v.reference_length) / max(v.reference_length, 1)


def fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def markdown(rows: dict[str, dict[str, Any]], peer: dict[str, Any] | None, meta: dict[str, Any]) -> str:
    exact = baseline()
    head = (f"| mode | NFE | TPF | tok/s | vs {exact} | vs transformers | tokens / round | accuracy | same as ref | "
            "model's pick (NLL) | tracing on/off | verify ms (vs ref) | KV peak |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    if peer is not None:
        peer_same = same_as_reference({"same_as_reference": peer.get("same_as_ar"), "reference": exact})
        lines.append(f"| {PEER} generate (peer) | — | — | {peer['tok_per_s']:.0f} | "
                     f"{fmt(peer['tok_per_s'] / rows[exact]['tok_per_s'] if exact in rows else None, '.2f', '×')} | "
                     f"1.00× | — | — | {peer_same} | — | — | — | — |")
    for label, r in rows.items():
        verify = fmt(r.get("verify_forward_ms"), ".1f")
        if r.get("verify_speedup_vs_reference"):
            verify += f" ({r['verify_speedup_vs_reference']:.2f}× vs {r['reference']})"
        lines.append(
            f"| {label} | {r['nfe']} | {r['tpf']:.2f} | {r['tok_per_s']:.0f} | "
            f"{fmt(r.get('speedup_vs_ar'), '.2f', '×')} | {fmt(r.get('vs_peer'), '.2f', '×')} | "
            f"{r['accept_len_mean'] or 0:.2f} | "
            f"{fmt(r['accuracy'] and 100 * r['accuracy']['average'], '.0f', ' %')} | {same_as_reference(r)} | "
            f"{model_pick(r)} | {fmt(r['tracing_ratio'], '.2f')} | {verify} | {r['kv_peak']} |")
    split = [f"- {label}: " + ", ".join(f"{k} {100 * v:.0f} %" for k, v in r["time_split"].items())
             for label, r in rows.items()]
    extras = [f"- {label}: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(r["mode_metrics"].items()))
              for label, r in rows.items() if r["mode_metrics"]]
    intro = (f"`specscope bench` at commit {meta['commit']} on {meta['cpu']} ({meta['cores']} cores), "
             f"{meta['date']}.\n\n"
             f"Prompts: {meta['prompts']} held-out {meta['prompt_kind']}, max_new_tokens {meta['max_new_tokens']}, "
             f"greedy, "
             f"{meta['repeats']} repeats (median, {meta['clock']} clock), model {meta['model']} "
             f"(adapter scope {meta.get('adapter_scope')}), "
             f"{meta['threads']} torch thread(s), {meta['dtype']}{matmul_note(meta)}. Ratios are tokens/s ratios "
             f"from this one run; "
             f"verify ms: median per verify forward; same as ref: the prompts whose tokens equal the reference "
             f"mode's, and where not all do, the share of the reference's tokens given before the first "
             f"difference (averaged over prompts); model's pick: the share of the mode's answer tokens that are "
             f"the model's own greedy choice after the same prefix (teacher-forced on the engine that ran the "
             f"row), and in brackets their mean negative log-likelihood under it, nats a token.\n\n")
    text = intro + head + "\n".join(lines) + "\n"
    text += ("\nWhere the time goes: forwards by kind, other = sampling, mode and engine Python, tracing:\n\n"
             + "\n".join(split) + "\n")
    explained = [(label, shown(r["speedup_explained"])) for label, r in rows.items() if r.get("speedup_explained")]
    if explained:
        text += (f"\nThe speedup explained: tok/s against {exact} = TPF ratio × row cost ({exact}'s mean forward "
                 f"ms ÷ the row's) × forward share ratio (the row's share of wall time in forwards ÷ {exact}'s); the "
                 "product against the measured ratio:\n\n| mode | TPF | × row cost | × forward share | = product | "
                 "measured |\n|---|---|---|---|---|---|\n"
                 + "\n".join(f"| {label} | {e['tpf']:.{DIGITS}f} | {e['row_cost']:.{DIGITS}f} | "
                             f"{e['forward_share']:.{DIGITS}f} | {e['product']:.{DIGITS}f}× | "
                             f"{e['measured']:.{DIGITS}f}× |" for label, e in explained) + "\n")
    if extras:
        text += "\nMode metrics (counts summed, ratios averaged over prompts):\n\n" + "\n".join(extras) + "\n"
    if exact + FLOAT32 in rows:
        fastest = rows[exact + FLOAT32]["tok_per_s"]
        text += (f"\nAgainst `{exact}` with float32 matmuls ({fastest:.0f} tok/s, the exact model): "
                 + ", ".join(f"{label} {r['tok_per_s'] / fastest:.2f}×" for label, r in rows.items()
                             if label != exact + FLOAT32) + ".\n")
    return text


MATMUL_NOTES = {
    "bf16": "in bf16 on AMX tiles (weights and each linear's input rows rounded to bfloat16, float32 sums)",
    "int8": "in int8 (GGUF Q4_1 / Q8_0 weight blocks, each linear's input rows rounded to int8 blocks of 32, exact "
            "integer sums)",
    "int16": "in int16 (GGUF Q4_1 / Q8_0 weight blocks, each linear's input rows rounded to 16-bit blocks of 32 and "
             "dotted as two int8 planes, exact integer sums)"}
"""How the fused step multiplies, by its precision (fused_step.MATMULS but float32)."""


def matmul_note(meta: dict[str, Any]) -> str:
    """How the fused step multiplied, where not in float32."""
    matmul = meta.get("matmul", "float32")
    return "" if matmul == "float32" else f", matmuls {MATMUL_NOTES.get(matmul, matmul)}"


def provenance() -> dict[str, Any]:
    """What a figure cites: the commit, the machine (CPU model, cores) and the date."""
    def command(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return ""
    cpu = next((line.split(":", 1)[1].strip() for line in command("lscpu").splitlines()
                if line.startswith("Model name")), platform.processor())
    dirty = bool(command("git", "status", "--porcelain", "--untracked-files=no"))
    flags = next((line.split(":", 1)[1].split() for line in command("lscpu").splitlines()
                  if line.startswith("Flags")), [])
    return {"commit": command("git", "rev-parse", "--short", "HEAD") + ("+dirty" if dirty else ""), "cpu": cpu,
            "cpu_flags": [f for f in ISA_FLAGS if f in flags], "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def bench_prompts(folder: Path, args: argparse.Namespace) -> tuple[list[Task], str]:
    """The checkpoint's own held-out tasks (with answers) if it ships them, else held-out chat prompts."""
    tasks = checkpoint_tasks(folder, args.per_kind)
    if tasks is not None:
        return tasks, "tasks"
    rows = prompt_set(args.prompts, seed=BENCH_SEED, held_out=True)
    return [Task(r["category"], r["messages"][0]["content"], "") for r in rows], "chat prompts"


def llama_cpp_lines(rows: dict[str, dict[str, Any]], llama: dict[str, Any] | None, meta: dict[str, Any]) -> str:
    """The llama.cpp peer's line, and each row's tokens/s against it (`not installed` when it is not)."""
    if llama is None:
        return ("\nllama.cpp: not measured (install it with `pip install .[peers]`, built with the flags in "
                "docs/performance.md).\n")
    ratios = ", ".join(f"{label} {r['vs_llama_cpp']:.2f}×" for label, r in rows.items())
    return (f"\nllama.cpp (llama-cpp-python, the Q4_1 GGUF itself, greedy, {meta['threads']} thread(s)): "
            f"{llama['tok_per_s']:.1f} tok/s. Each row's tokens/s against it: {ratios}.\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.summary:
        return write_summary(Path(args.summary), Path(args.into) if args.into else None)
    if args.lossless:
        return check_lossless(args)
    if args.concurrency:
        return bench_concurrency(args)
    return bench(args)


def bench(args: argparse.Namespace, runs: list[tuple[str, str, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The timed bench of `runs` (label, mode, parameters; default: --modes, then each --variant)."""
    modes = [m for m in args.modes.split(",") if m] or mode_names()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    source = resolve(args.model)
    engine = bench_engine(args, source, 8192)
    tasks, prompt_kind = bench_prompts(source.folder, args)
    params = {"max_new_tokens": args.max_new_tokens}
    if runs is None:
        runs = [(m, m, {}) for m in modes] + [(spec, *parse_variant(spec)) for spec in args.variant]
    clock = CLOCKS[args.clock]
    traced = not args.no_tracing
    benches: dict[str, ModeBench | PeerBench] = {
        label: ModeBench(engine, mode, tasks, {**params, **extra}, clock, traced) for label, mode, extra in runs}
    if args.adapter_off and engine.rt.loaded.adapter_scope is not None:
        bare = with_cost_curve(Engine(load_checkpoint(source.folder, dtype, adapter=False, name=source.name),
                                      num_slots=8192, matmul=args.matmul, forward=args.forward), args.cost_curve)
        benches.update({f"{label} (adapter off)": ModeBench(bare, mode, tasks, {**params, **extra}, clock, traced)
                        for label, mode, extra in runs[:len(modes)] if get_mode(mode).needs_mask})
    if args.matmul != "float32" and baseline() in modes:
        exact = Engine(load_checkpoint(source.folder, dtype, adapter=False, name=source.name), num_slots=8192)
        benches[baseline() + FLOAT32] = ModeBench(exact, baseline(), tasks, params, clock, traced)
    prompts = [engine.encode_prompt(t.prompt, raw=False) for t in tasks]
    peers: list[tuple[str, Generate | None]] = []
    if not args.no_peer:
        peers.append((PEER, transformers_peer(source.folder, dtype, engine.rt.eos_id)))
        if source.gguf is not None:
            peers.append((LLAMA_CPP, llama_cpp_peer(source.gguf, engine.rt.eos_id, torch.get_num_threads())))
    for name, generate in peers:
        if generate is not None:
            benches[name] = PeerBench(name, generate, prompts, engine.rt.eos_id, args.max_new_tokens, clock)
    for b in benches.values():
        b.warm_up()
    for _ in tqdm(range(args.repeats), desc="repeats"):  # every row once per repeat: drift hits all alike
        for b in benches.values():
            b.timed_pass()
    peer = benches.pop(PEER).row() if PEER in benches else None
    llama = benches.pop(LLAMA_CPP).row() if LLAMA_CPP in benches else None
    rows = {label: b.row() for label, b in benches.items()}
    compare_to_references(rows, peer)
    rows_cost = verify_rows(engine, tasks[0].prompt)
    if llama is not None:
        for row in rows.values():
            row["vs_llama_cpp"] = row["tok_per_s"] / llama["tok_per_s"]
    meta = {**provenance(), "prompts": len(tasks), "prompt_kind": prompt_kind, "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "model": engine.model_name, "adapter_scope": engine.rt.loaded.adapter_scope,
            "threads": torch.get_num_threads(), "clock": args.clock, "dtype": args.dtype, "matmul": args.matmul,
            "forward": engine.rt.backend_name}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"meta": meta, "modes": rows, "peer": peer, "llama_cpp": llama,
                                                           "verify_rows": rows_cost}, indent=1))
    text = markdown(rows, peer, meta) + llama_cpp_lines(rows, llama, meta) + verify_rows_markdown(rows_cost)
    (out / "bench.md").write_text(text)
    print(text)
    return rows


def bench_engine(args: argparse.Namespace, source: ModelSource, slots: int) -> Engine:
    """The engine the bench options name: the model in --dtype, its adapter (or --adapter, or none), --matmul,
    --forward, pricing rows with the curve --cost-curve names (this machine's, loaded or measured:
    `with_cost_curve`)."""
    adapter = False if args.adapter == "none" else args.adapter or source.adapter
    return with_cost_curve(Engine(load_checkpoint(source.folder, DTYPES[args.dtype], adapter=adapter,
                                                  adapter_scope=args.adapter_scope, name=source.name),
                                  num_slots=slots, matmul=args.matmul, forward=args.forward), args.cost_curve)


def load_modes() -> list[str]:
    """`--concurrency`'s default modes: the baseline and the modes a draft tier shrinks under load (those that
    declare a `draft_param`)."""
    return [baseline(), *(m for m in mode_names() if get_mode(m).draft_param)]


def bench_concurrency(args: argparse.Namespace) -> dict[str, Any]:
    """`bench --concurrency`: bench_load's table on the bench's engine and prompts."""
    if args.threads:
        torch.set_num_threads(args.threads)
    source = resolve(args.model)
    engine = bench_engine(args, source, 32768)
    engine.scheduler.draft_tiers = draft_tiers_of(args.draft_tiers, engine.cost_curve)
    modes = [m for m in args.modes.split(",") if m] or load_modes()
    levels = [int(n) for n in args.concurrency.split(",")]
    tasks, _ = bench_prompts(source.folder, args)
    table = load_table(engine, modes, levels, [t.prompt for t in tasks], args.max_new_tokens, args.repeats)
    meta = {**provenance(), "model": engine.model_name, "matmul": engine.rt.matmul, "forward": engine.rt.backend_name,
            "draft_tiers": [list(tier) for tier in engine.scheduler.draft_tiers],
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "threads": torch.get_num_threads()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps({"meta": meta, "rows": table}, indent=1))
    text = load_markdown(table, meta)
    (out / "load.md").write_text(text)
    print(text)
    return {"meta": meta, "rows": table}


def claimed_runs(modes: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """Bench rows for a lossless check: each mode that claims equality, at its claim's parameters, and each
    claim's reference mode at its defaults."""
    claims = {m: claim for m in modes if (claim := claim_of(m)) is not None}
    references = sorted({c.reference for c in claims.values()} - set(claims))
    return [(r, r, {}) for r in references] + [(m, m, dict(c.params)) for m, c in claims.items()]


def drafter_works(mode: str, row: dict[str, Any]) -> bool | None:
    """Whether the mode's drafter figure (its declared run metric, averaged over the prompts) reaches its minimum,
    so an equality is never the trivial one of a drafter that is always rejected; None where the mode declares
    none, or where its claim fixes parameters that switch the drafting off (SpecFold folds nothing at δ = 0)."""
    drafter, claim = get_mode(mode).drafter, claim_of(mode)
    if drafter is None or claim is None or claim.params:
        return None
    if any(row["params"].get(k) != v for k, v in get_mode(mode).drafter_params.items()):
        return None     # the drafter shows its work at its own parameters (a fixed verify length): a --variant
    return row["drafter_mean"] >= drafter[1]


def check_lossless(args: argparse.Namespace) -> dict[str, Any]:
    """`bench --lossless`: one untraced pass of every claim (and each --variant) and its reference; lossless.json and
    a table; exit status 1 where a claim fails."""
    args.no_peer, args.no_tracing, args.repeats, args.adapter_off = True, True, 1, False
    variants = [(spec, *parse_variant(spec)) for spec in args.variant]
    rows = bench(args, claimed_runs([m for m in args.modes.split(",") if m] or mode_names()) + variants)
    report = []
    for label, row in rows.items():
        claim = claim_of(row["mode"])
        if claim is None or label == claim.reference:
            continue
        checked = row.get("lossless")
        report.append({"row": label, "reference": claim.reference, "params": row["params"],
                       "prompts": checked["prompts"] if checked else 0,
                       "identical": checked["identical"] if checked else 0, "tpf": row["tpf"],
                       "drafter": get_mode(row["mode"]).drafter, "drafter_works": drafter_works(row["mode"], row)})
    Path(args.out, "lossless.json").write_text(json.dumps({"meta": provenance(), "rows": report}, indent=1) + "\n")
    failed = [r["row"] for r in report
              if not r["prompts"] or r["identical"] != r["prompts"] or r["drafter_works"] is False]
    for r in report:
        print(f"{r['row']}: {r['identical']}/{r['prompts']} identical to {r['reference']}, TPF {r['tpf']:.2f}, "
              f"drafter {DRAFTER_VERDICT[r['drafter_works']]} {r['drafter'] or ''}".rstrip())
    if failed:
        raise SystemExit(f"lossless check failed: {failed}")
    return rows


DRAFTER_VERDICT = {True: "works", False: "FAILS", None: "not checked"}
SUMMARY_MARKERS = ("<!-- bench-table:", "<!-- /bench-table -->")


def headline(doc: dict[str, Any]) -> str:
    """A stored bench as a compact table (the peers first, then every row), under a line saying where, when and
    how it was measured."""
    meta, rows = doc["meta"], doc["modes"]
    exact = baseline()
    ar = rows.get(exact, {}).get("tok_per_s")
    flags = ", ".join(meta.get("cpu_flags") or []) or "flags not recorded"
    lines = [f"`specscope bench` at commit {meta['commit']}, {meta['date']}, on {meta['cpu']} ({meta['cores']} cores; "
             f"{flags}); {meta['model']}, {meta['dtype']}{matmul_note(meta)}; {meta['prompts']} held-out "
             f"{meta['prompt_kind']}, max_new_tokens {meta['max_new_tokens']}, greedy, {meta['threads']} thread(s).",
             "", f"| row | TPF | tok/s | vs {exact} | same as reference | model's pick (NLL) |",
             "|---|---|---|---|---|---|"]
    for name, peer in ((LLAMA_CPP, doc.get("llama_cpp")), (PEER, doc.get("peer"))):
        if peer:
            same = same_as_reference({"same_as_reference": peer.get("same_as_ar"), "reference": exact})
            lines.append(f"| {name} (peer) | — | {peer['tok_per_s']:.0f} | "
                         f"{fmt(ar and peer['tok_per_s'] / ar, '.2f', '×')} | {same} | — |")
    for label, r in rows.items():
        lines.append(f"| {label} | {r['tpf']:.2f} | {r['tok_per_s']:.0f} | {fmt(r.get('speedup_vs_ar'), '.2f', '×')} "
                     f"| {same_as_reference(r)} | {model_pick(r)} |")
    return "\n".join(lines) + "\n"


def write_summary(path: Path, into: Path | None) -> dict[str, Any]:
    """Print a stored bench's headline table, or write it between the bench-table markers of `into`."""
    doc = json.loads(path.read_text())
    table = headline(doc)
    if into is None:
        print(table)
        return doc["modes"]
    text = into.read_text()
    start, end = text.index(SUMMARY_MARKERS[0]), text.index(SUMMARY_MARKERS[1])
    opening = text[start:text.index("\n", start) + 1]
    into.write_text(text[:start] + opening + table + text[end:])
    return doc["modes"]
