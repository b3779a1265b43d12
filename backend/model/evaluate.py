"""Evaluate a checkpoint: held-out loss per objective vs a unigram baseline, AR greedy exact-match per task.

    python -m backend.model.evaluate [--checkpoint DIR] [--per-kind 40] [--batches 8]

Writes evaluation.json next to the checkpoint.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from backend.model import data
from backend.model.checkpoint import DEFAULT_CHECKPOINT, LoadedModel, load_checkpoint
from backend.model.tasks import task_set
from backend.model.train import OBJECTIVES, objective_losses


def heldout_losses(loaded: LoadedModel, batches: int, seed: int = 1234) -> dict[str, float]:
    """Mean cross-entropy of each objective on held-out text (the same text the unigram baseline scores)."""
    tok = loaded.tokenizer
    stream = data.tokenize_documents(tok, data.text_documents("heldout"))
    spec = data.BatchSpec(batch_size=8, task_fraction=0.0)
    sums = dict.fromkeys(OBJECTIVES, 0.0)
    with torch.inference_mode():
        for step in range(batches):
            batch = data.make_batch(tok, stream, spec, seed, step, loaded.mask_token_id, split="heldout")
            for k, v in objective_losses(loaded.model, batch).items():
                sums[k] += v.item() / batches
    return sums


def unigram_loss(loaded: LoadedModel) -> float:
    """Cross-entropy of held-out text under the training text's unigram distribution (add-one)."""
    tok = loaded.tokenizer
    train = data.tokenize_documents(tok, data.text_documents("train")[::8])
    held = data.tokenize_documents(tok, data.text_documents("heldout"))
    counts = np.bincount(train, minlength=len(tok)).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[held].mean())


def exact_match(loaded: LoadedModel, per_kind: int, mode: str = "ar",
                params: dict | None = None) -> dict[str, float]:
    """Greedy exact-match of the answer per task kind on the held-out split, plus the average."""
    from backend.engine.engine import Engine
    engine = Engine(loaded, num_slots=4096)
    hits: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for task in task_set("heldout", per_kind):
        out = engine.generate(task.prompt, mode, {"max_new_tokens": 32, **(params or {})})
        total[task.kind] += 1
        hits[task.kind] += out.text.strip() == task.answer
    scores = {k: hits[k] / total[k] for k in total}
    scores["average"] = sum(scores.values()) / len(scores)
    return scores


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    p.add_argument("--per-kind", type=int, default=40)
    p.add_argument("--batches", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(2)
    loaded = load_checkpoint(args.checkpoint)
    losses = heldout_losses(loaded, args.batches)
    unigram = unigram_loss(loaded)
    result = {
        "heldout_loss": {k: round(v, 4) for k, v in losses.items()},
        "heldout_perplexity": {k: round(math.exp(v), 2) for k, v in losses.items()},
        "unigram_baseline_loss": round(unigram, 4),
        "ar_exact_match": exact_match(loaded, args.per_kind),
        "per_kind": args.per_kind,
    }
    out = Path(args.checkpoint) / "evaluation.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
