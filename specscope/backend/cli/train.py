"""`specscope train tiny|adapter|head|evaluate`: train the tiny model, the self-speculation adapter or its sampler
head (each resumable from its workdir), or evaluate a tiny-model checkpoint."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from specscope.backend.model.source import SMOLLM_ADAPTER
from specscope.backend.train import adapter, head, tiny, tiny_eval
from specscope.backend.train.layouts import KINDS

PARENTS = ()
DEFAULT_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

TINY_USAGE = """
    specscope train tiny --workdir train_runs/tiny --steps 1600      # resumes if state.pt exists
    specscope train tiny --workdir train_runs/tiny --export specscope/backend/model/checkpoints/tiny
"""
ADAPTER_USAGE = """
    specscope train adapter --workdir train_runs/selfspec/run --data train_runs/selfspec/train.jsonl \\
        --heldout train_runs/selfspec/heldout.jsonl --steps 800 \\
        --export specscope/backend/model/checkpoints/smollm2-135m-selfspec
"""
HEAD_USAGE = """
    specscope train head --workdir train_runs/sampler/run --data train_runs/selfspec/train.jsonl \\
        --heldout train_runs/selfspec/heldout2.jsonl --export specscope/backend/model/checkpoints/smollm2-135m-selfspec
"""
EVALUATE_USAGE = """
    specscope train evaluate [--checkpoint DIR] [--per-kind 20] [--batches 8] [--modes ar,isd]

Writes evaluation.json next to the checkpoint (or into --out).
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="train_command", required=True)
    for name, (help, module, usage, add, action) in SUBCOMMANDS.items():
        sub = actions.add_parser(name, help=help, description=(module.__doc__ or "") + usage,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        add(sub)
        sub.set_defaults(action=action)


def run(args: argparse.Namespace) -> int:
    """The subcommand's action, on its own options alone (the adapter records them as its recipe)."""
    options = {k: v for k, v in vars(args).items() if k not in ("command", "train_command", "action")}
    args.action(argparse.Namespace(**options))
    return 0


def add_tiny(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", default="train_runs/tiny")
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--task-fraction", type=float, default=0.8, help="share of batch rows that are chat tasks")
    p.add_argument("--no-pad-tasks", action="store_true", help="pack tasks back to back (the first phase's recipe)")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast forward (fp32 master weights)")
    p.add_argument("--init-from", help="warm-start a new workdir from a checkpoint folder (weights only)")
    p.add_argument("--export", help="write the shipped checkpoint to this folder and exit")


def run_tiny(args: argparse.Namespace) -> None:
    tiny.export(args) if args.export else tiny.train(args)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """What every self-speculation training run takes: its workdir, its training and held-out answers, the model,
    the sequence cap, the seed, the export folder and the device."""
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--heldout", type=Path, required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--max-len", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--export", type=Path, default=None)
    p.add_argument("--device", default=DEFAULT_DEVICE)


def kind_weights(text: str) -> dict[str, float]:
    """'causal=2,partial=0.5' -> a weight for every layout kind (1 where not named)."""
    weights = dict.fromkeys(KINDS, 1.0)
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in weights:
            raise argparse.ArgumentTypeError(f"unknown layout kind {name!r} (kinds: {', '.join(KINDS)})")
        weights[name] = float(value)
    return weights


def add_adapter(p: argparse.ArgumentParser) -> None:
    add_run_options(p)
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch", type=int, default=4, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-sequences", type=int, default=16, help="held-out answers each evaluation reads")
    p.add_argument("--kind-weights", type=kind_weights, default=kind_weights(""),
                   help="loss weight per layout kind, e.g. causal=2 (default 1 each)")
    p.add_argument("--chunk-scale", type=int, default=1,
                   help="draft layouts trained per sequence, as a multiple of the default mix (train/layouts.py)")
    p.add_argument("--scope", choices=("mask", "draft"), default="mask",
                   help="where the adapter is on: MASK rows (every mode, lossless everywhere) or whole draft "
                        "forwards (linear_spec and the block modes only; train it with causal=0)")
    p.add_argument("--init-adapter", type=Path, default=None,
                   help="start from this PEFT folder (e.g. the shipped adapter) with a fresh optimizer")
    p.add_argument("--head", type=Path, default=None,
                   help="a sampler head file (sampler_head.safetensors) to train together with the adapter: its "
                        "chain loss joins the objective, the held-out figures are the chain's, exports write it")
    p.add_argument("--head-lr", type=float, default=None, help="the head's peak learning rate (default: --lr)")
    p.add_argument("--head-weight", type=float, default=1.0, help="the chain loss's weight beside the kinds'")
    p.add_argument("--head-rows", type=int, default=1024, help="MASK rows of each batch the chain loss reads")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast for the training forward (fp32 master weights; held-out figures stay fp32)")


def run_adapter(args: argparse.Namespace) -> None:
    args.head_lr = args.lr if args.head_lr is None else args.head_lr
    adapter.train(args)


def add_head(p: argparse.ArgumentParser) -> None:
    add_run_options(p)
    p.add_argument("--adapter", type=Path, default=SMOLLM_ADAPTER, help="the adapter whose MASK rows the head chains")
    p.add_argument("--passes", type=int, default=1, help="extraction passes (each its own random layouts)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations (and saves)")
    p.add_argument("--batch", type=int, default=1024, help="rows per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--width", type=int, default=1152, help="the head's hidden width")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout on the head's hidden layer in training")
    p.add_argument("--candidates", type=int, default=32, help="top tokens of a row the head ranks at run time")
    p.add_argument("--eval-sequences", type=int, default=32, help="held-out answers each evaluation reads")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for the head's training forward")


def run_head(args: argparse.Namespace) -> None:
    head.train_sampler(args)


def add_evaluate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    p.add_argument("--per-kind", type=int, default=20)
    p.add_argument("--batches", type=int, default=8, help="held-out text batches for the loss (0: skip)")
    p.add_argument("--modes", default="", help="comma-separated modes to check exact match in (default: the "
                                                 "exact one, the model's own greedy decode)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write evaluation.json here instead of the checkpoint folder")


def run_evaluate(args: argparse.Namespace) -> None:
    """Evaluate the checkpoint; write evaluation.json next to it (or into --out) and print it."""
    torch.set_num_threads(args.threads)
    from specscope.backend.engine.modes import baseline
    modes = [m for m in args.modes.split(",") if m] or [baseline()]
    result = tiny_eval.evaluate(load_checkpoint(args.checkpoint), args.per_kind, args.batches, modes)
    out = Path(args.out or args.checkpoint) / "evaluation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


SUBCOMMANDS = {
    "tiny": ("train the tiny tri-mode model, or export its checkpoint", tiny, TINY_USAGE, add_tiny, run_tiny),
    "adapter": ("train the self-speculation adapter on a model's own answers", adapter, ADAPTER_USAGE, add_adapter,
                run_adapter),
    "head": ("train the sampler head on a frozen model and adapter", head, HEAD_USAGE, add_head, run_head),
    "evaluate": ("held-out loss and exact match of a tiny-model checkpoint", tiny_eval, EVALUATE_USAGE,
                 add_evaluate, run_evaluate),
}
"""Subcommand: (one-line help, the module doing the work, usage examples, its options, its action)."""
