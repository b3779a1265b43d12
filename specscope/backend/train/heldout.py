"""Held-out figures of the adapter, teacher-forced on the model's own greedy answers (fast, one forward a
batch): for seeds every few answer positions, how many leading drafts match the model's greedy tokens.

- `block{B}`: tokens per linear_spec round of a [seed, M x (B-1)] block draft (leading matches + the bonus);
- `causal{K}`: tokens per round of K causal MASK specs after the clean prefix (quadratic with k = K, isd's
  all-accept round with N = K + 1): leading matches + the bonus.

The engine's own figures on real runs (TPF, tok/s) are the bench's; these steer training and checkpointing.
"""
from __future__ import annotations

import torch
from torch import Tensor

from specscope.backend.engine.blocks import longest_match
from specscope.backend.model.transformer import PagedKV, Transformer
from specscope.backend.train.layouts import Chunk, block_chunk, causal_chunk
from specscope.backend.train.packing import Packed, chunk_logits, pack

LAYOUTS = (("block", 8), ("causal", 4))


def layout_chunks(group: list[dict], kind: str, n: int, mask_id: int, stride: int) -> list[list[Chunk]]:
    """Per answer, a `kind` draft of size n seeded every `stride` positions of the answer."""
    make = block_chunk if kind == "block" else causal_chunk
    return [[make(r["seq"], s, n, mask_id) for s in range(r["prompt_len"] - 1, len(r["seq"]) - n - 1, stride)]
            for r in group]


def add_rounds(totals: list[int], pred: Tensor, p: Packed, kind: str) -> None:
    """Add each chunk's tokens per round under the predictions pred [B, Q] (leading matches + the bonus) to
    totals [sum, count]."""
    for i, spans in enumerate(p.kinds):
        for _, row, size in spans:
            t = p.targets[i, row:row + size].tolist()
            g = pred[i, row:row + size].tolist()
            if kind == "block":          # rows 0..B-2 draft positions 1..B-1
                got = longest_match(g[:size - 1], t[:size - 1])
            else:                        # mask rows 1..K
                got = longest_match(g[1:], t[1:])
            totals[0] += got + 1
            totals[1] += 1


def heldout_figures(model: Transformer, rows: list[dict], mask_id: int, device: str, sequences: int = 16,
                    stride: int = 9, batch: int = 4, scope: str = "mask") -> dict[str, float]:
    was_training = model.training
    model.eval()
    totals = {f"{k}{n}": [0, 0] for k, n in LAYOUTS}
    pad = model.cfg.eos_token_id or 0
    for start in range(0, min(sequences, len(rows)), batch):
        group = rows[start:start + batch]
        for kind, n in LAYOUTS:
            p = pack([r["seq"] for r in group], layout_chunks(group, kind, n, mask_id, stride), mask_id, pad)
            b, width = p.clean_ids.shape
            with torch.no_grad():
                cache = PagedKV.empty(model.cfg, b * width, torch.float32, device)
                logits = chunk_logits(model, p.to(device), cache, scope)
            logits[..., mask_id] = float("-inf")
            add_rounds(totals[f"{kind}{n}"], logits.argmax(-1).cpu(), p, kind)
    model.train(was_training)
    figures = {k: round(s / max(c, 1), 3) for k, (s, c) in totals.items()}
    figures["score"] = round(figures["block8"] + figures["causal4"], 3)
    return figures
