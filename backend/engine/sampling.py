"""Token choice from logits: greedy argmax at T=0, else a seeded draw; MASK is never chosen."""
from __future__ import annotations

import torch
from torch import Tensor


def pick(logits: Tensor, temperature: float, generator: torch.Generator | None,
         banned: int | None) -> tuple[Tensor, Tensor]:
    """Tokens [...] and their probabilities under softmax(logits / T) (T=0: plain softmax, argmax)."""
    logits = logits.float()
    if banned is not None:
        logits = logits.clone()
        logits[..., banned] = float("-inf")
    probs = torch.softmax(logits / temperature if temperature > 0 else logits, dim=-1)
    if temperature > 0:
        flat = probs.reshape(-1, probs.shape[-1])
        ids = torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
    else:
        ids = logits.argmax(-1)
    return ids, probs.gather(-1, ids[..., None])[..., 0]
