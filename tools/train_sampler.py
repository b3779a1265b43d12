"""Train the sampler head on the frozen model + shipped adapter (selfspec/sampler.py):

    python -m tools.train_sampler --workdir train_runs/sampler/run --data train_runs/selfspec/train.jsonl \\
        --heldout train_runs/selfspec/heldout2.jsonl --export backend/model/checkpoints/smollm2-135m-selfspec

Resumable: the extracted rows (features.pt) and the head's state (state.pt) stay in the workdir; --export
writes sampler_head.safetensors into the adapter folder whenever the held-out chain figures improve. The same
command runs on CUDA when a GPU is present.
"""
from __future__ import annotations

from pathlib import Path

from specscope.selfspec.cli import run_parser
from specscope.selfspec.sampler import train_sampler


def main() -> None:
    p = run_parser(__doc__)
    p.add_argument("--adapter", type=Path, default=Path("specscope/backend/model/checkpoints/smollm2-135m-selfspec"),
                   help="the adapter whose MASK rows the head chains")
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
    train_sampler(p.parse_args())


if __name__ == "__main__":
    main()
