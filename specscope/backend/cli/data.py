"""`specscope data prompts|answers`: the self-distillation prompt set as JSONL, and a model's own answers to it
(the training data of `specscope train adapter|head`)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specscope.backend.engine.engine import Engine
from specscope.backend.forward.fused_step import MATMULS
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.model.source import resolve
from specscope.backend.train import answers
from specscope.backend.train.prompts import TEMPLATES, prompt_set

PARENTS = ()

ANSWERS_USAGE = """
    specscope data answers --split train --count 1000 --out train_runs/selfspec/train.jsonl
    specscope data answers --split heldout --count 64 --out train_runs/selfspec/heldout.jsonl

Drawn answers (seeded per prompt from --seed), for more of the model's own text on the same prompts:

    specscope data answers --split train --count 4000 --temperature 0.7 --seed 1 \\
        --out train_runs/selfspec/train.jsonl
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="data_command", required=True)
    prompts = actions.add_parser("prompts", help="write the prompt set as JSONL, one prompt a line",
                                 description="The self-distillation prompt set (train/prompts.py) as a JSONL file, "
                                             "one prompt a line: specscope data prompts --count 3000 --out "
                                             "prompts.jsonl")
    prompts.add_argument("--count", type=int, default=3000)
    prompts.add_argument("--seed", type=int, default=0)
    prompts.add_argument("--out", type=Path, required=True)
    prompts.set_defaults(action=write_prompts)
    generate = actions.add_parser("answers", help="generate a model's own answers to the prompt set",
                                  description=(answers.__doc__ or "") + ANSWERS_USAGE,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    generate.add_argument("--split", choices=("train", "heldout"), required=True)
    generate.add_argument("--count", type=int, required=True, help="prompts (follow-ups add their second turn)")
    generate.add_argument("--out", type=Path, required=True)
    generate.add_argument("--model", default=None, help="model name or folder (default: the real default model)")
    generate.add_argument("--batch", type=int, default=32)
    generate.add_argument("--max-new-tokens", type=int, default=answers.GENERATION_CAP)
    generate.add_argument("--seed", type=int, default=0, help="the prompt draw's seed, and the answers' at T > 0")
    generate.add_argument("--temperature", type=float, default=0.0,
                          help="draw the answers at this temperature (0: greedy)")
    generate.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    generate.add_argument("--matmul", choices=MATMULS, default="float32",
                          help="the fused CPU step's matmul precision (bf16: AMX tiles, several times faster at 32 "
                               "rows)")
    generate.set_defaults(action=write_answers)


def run(args: argparse.Namespace) -> int:
    args.action(args)
    return 0


def write_prompts(args: argparse.Namespace) -> None:
    rows = prompt_set(args.count, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = sum(r["held_out"] for r in rows)
    print(f"{len(rows)} prompts from {len(TEMPLATES)} templates ({held} held out) -> {args.out}")


def write_answers(args: argparse.Namespace) -> None:
    """The model (adapter off) answers the split's prompts `--batch` at a time, appended to --out."""
    loaded = load_checkpoint(resolve(args.model).folder, device=args.device, adapter=False)
    engine = Engine(loaded, num_slots=args.batch * 2 * (args.max_new_tokens + 512), matmul=args.matmul)
    rows = prompt_set(args.count, args.seed, held_out=args.split == "heldout")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    answers.generate(engine, rows, args.out, args.batch, args.max_new_tokens, args.temperature, args.seed)
