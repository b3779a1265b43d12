"""Train the self-speculation adapter: a LoRA on every projection, on at MASK positions only (the gated LoRA of
"Your LLM Knows the Future"; I-DLM's R-ISD scope), plus the MASK token's embedding, on the base model's own
greedy answers in every mode's draft layout (selfspec/layouts.py). Ordinary tokens never see the adapter, so
the model's next-token outputs, and every lossless claim, stay exact. `--scope draft` trains the other scope
instead (Nemotron's linear-spec LoRA: on for whole draft forwards, which only linear_spec and the block modes
have), to compare the two on the modes that can use either.

    python -m tools.train_selfspec --workdir train_runs/selfspec/run --data train_runs/selfspec/train.jsonl \\
        --heldout train_runs/selfspec/heldout.jsonl --steps 800 --export backend/model/checkpoints/smollm2-135m-selfspec

Resumable: <workdir>/state.pt holds the adapter, the optimizer and the step, saved every --save-every steps;
each step's batch is a pure function of (seed, step). Losses go to <workdir>/curves.jsonl and held-out figures
to <workdir>/heldout.jsonl; --export writes the PEFT folder whenever the held-out figures improve. The same
command runs on CUDA when a GPU is present.
"""
from __future__ import annotations

from pathlib import Path

from specscope.selfspec.cli import run_parser
from specscope.selfspec.train import kind_weights, train


def main() -> None:
    p = run_parser(__doc__)
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
                   help="draft layouts trained per sequence, as a multiple of the default mix (selfspec/layouts.py)")
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
    args = p.parse_args()
    args.head_lr = args.lr if args.head_lr is None else args.head_lr
    train(args)


if __name__ == "__main__":
    main()
