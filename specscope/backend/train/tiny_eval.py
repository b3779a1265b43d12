"""Evaluate a tiny-model checkpoint: held-out loss per objective vs a unigram baseline, and greedy exact-match per
family (the command line: `specscope train evaluate`).

Exact match is on held-out values, split by wording: `train_wording` prompts use wordings seen in training,
`heldout_wording` prompts wordings never trained. Every mode also reports TPF (tokens per forward).
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from specscope.backend.engine.engine import Engine
from specscope.backend.model.checkpoint import LoadedModel
from specscope.backend.train import tiny_data
from specscope.backend.train.tasks import REQUIRED, Task, task_set
from specscope.backend.train.tiny import OBJECTIVES, objective_losses


def heldout_losses(loaded: LoadedModel, batches: int, seed: int = 1234) -> dict[str, float]:
    """Mean cross-entropy of each objective on held-out text (the same text the unigram baseline scores)."""
    tok = loaded.tokenizer
    stream = tiny_data.tokenize_documents(tok, tiny_data.text_documents("heldout"))
    spec = tiny_data.BatchSpec(batch_size=8, task_fraction=0.0)
    sums = dict.fromkeys(OBJECTIVES, 0.0)
    with torch.inference_mode():
        for step in range(batches):
            batch = tiny_data.make_batch(tok, stream, spec, seed, step, loaded.mask_token_id, split="heldout")
            for k, v in objective_losses(loaded.model, batch).items():
                sums[k] += v.item() / batches
    return sums


def unigram_loss(loaded: LoadedModel) -> float:
    """Cross-entropy of held-out text under the training text's unigram distribution (add-one)."""
    tok = loaded.tokenizer
    train = tiny_data.tokenize_documents(tok, tiny_data.text_documents("train")[::8])
    held = tiny_data.tokenize_documents(tok, tiny_data.text_documents("heldout"))
    counts = np.bincount(train, minlength=len(tok)).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[held].mean())


def exact_match(loaded: LoadedModel, tasks: list[Task], mode: str,
                params: dict | None = None) -> dict[str, Any]:
    """Greedy exact-match and TPF per family and wording split; the average and minimum over required families."""
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


def evaluate(loaded: LoadedModel, per_kind: int, batches: int, modes: list[str]) -> dict[str, Any]:
    """The held-out losses (over `batches` text batches; none when 0) and every mode's exact match on `per_kind`
    held-out tasks a family, each mode's printed as it is done."""
    tasks = task_set("heldout", per_kind)
    result: dict[str, Any] = {"per_kind": per_kind}
    if batches:
        losses = heldout_losses(loaded, batches)
        result |= {"heldout_loss": {k: round(v, 4) for k, v in losses.items()},
                   "heldout_perplexity": {k: round(math.exp(v), 2) for k, v in losses.items()},
                   "unigram_baseline_loss": round(unigram_loss(loaded), 4)}
    result["exact_match"] = {}
    for mode in modes:
        result["exact_match"][mode] = exact_match(loaded, tasks, mode)
        print(mode, json.dumps(result["exact_match"][mode]), flush=True)
    return result
