"""Evaluate a checkpoint: held-out loss per objective vs a unigram baseline, and greedy exact-match per family.

    python -m tools.evaluate [--checkpoint DIR] [--per-kind 20] [--batches 8] [--modes ar,isd]

Exact match is on held-out values, split by wording: `train_wording` prompts use wordings seen in training,
`heldout_wording` prompts wordings never trained. Every mode also reports TPF (tokens per forward).
Writes evaluation.json next to the checkpoint (or to --out).
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specscope.backend.model import data
from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, LoadedModel, load_checkpoint
from specscope.backend.model.tasks import REQUIRED, Task, task_set
from specscope.backend.model.train import OBJECTIVES, objective_losses


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


def exact_match(loaded: LoadedModel, tasks: list[Task], mode: str = "ar",
                params: dict | None = None) -> dict[str, Any]:
    """Greedy exact-match and TPF per family and wording split; the average and minimum over required families."""
    from specscope.backend.engine.engine import Engine
    engine = Engine(loaded, num_slots=4096)
    hits: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    tokens = nfe = 0
    for task in tasks:
        budget = len(loaded.tokenizer(task.answer, add_special_tokens=False)["input_ids"]) + 8
        out = engine.generate(task.prompt, mode, {"max_new_tokens": budget, **(params or {})})
        hits[task.kind][f"{task.phrasing}_wording"].append(out.text.strip() == task.answer)
        tokens, nfe = tokens + len(out.output_ids), nfe + out.metrics["nfe"]
    per_family = {k: {s: round(sum(v) / len(v), 3) for s, v in sorted(d.items())} |
                  {"all": round(sum(sum(v) for v in d.values()) / sum(len(v) for v in d.values()), 3)}
                  for k, d in hits.items()}
    required = [per_family[k]["all"] for k in REQUIRED if k in per_family]
    return {"per_family": per_family, "average": round(sum(required) / len(required), 3),
            "min": min(required), "tpf": round(tokens / max(nfe, 1), 3), "prompts": len(tasks)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    p.add_argument("--per-kind", type=int, default=20)
    p.add_argument("--batches", type=int, default=8, help="held-out text batches for the loss (0: skip)")
    p.add_argument("--modes", default="ar")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write evaluation.json here instead of the checkpoint folder")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_checkpoint(args.checkpoint)
    tasks = task_set("heldout", args.per_kind)
    result: dict[str, Any] = {"per_kind": args.per_kind}
    if args.batches:
        losses = heldout_losses(loaded, args.batches)
        result |= {"heldout_loss": {k: round(v, 4) for k, v in losses.items()},
                   "heldout_perplexity": {k: round(math.exp(v), 2) for k, v in losses.items()},
                   "unigram_baseline_loss": round(unigram_loss(loaded), 4)}
    result["exact_match"] = {}
    for mode in args.modes.split(","):
        result["exact_match"][mode] = exact_match(loaded, tasks, mode)
        print(mode, json.dumps(result["exact_match"][mode]), flush=True)
    out = Path(args.out or args.checkpoint) / "evaluation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
