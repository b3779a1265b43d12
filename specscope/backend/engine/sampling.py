"""Token choice from logits: greedy argmax at T=0, else a seeded draw; MASK is never chosen."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def allowed(logits: Tensor, banned: int | None) -> Tensor:
    """logits in float32 with the banned id at -inf (a copy where there is one)."""
    logits = logits.float()
    if banned is not None:
        logits = logits.clone()
        logits[..., banned] = float("-inf")
    return logits


def best(logits: Tensor, banned: int | None) -> Tensor:
    """The most likely tokens [...] (the first of equals), never the banned id."""
    return allowed(logits, banned).max(-1).indices


LEAST_TEMPERATURE = 1e-6
"""Temperatures above 0 but below this draw as at this one: logits / T would overflow float32 to inf (NaN
probabilities), and at 1e-6 the draw is already the argmax's but for exact ties."""


def pick(logits: Tensor, temperature: float, generator: torch.Generator | None,
         banned: int | None) -> tuple[Tensor, Tensor]:
    """Tokens [...] and their probabilities under softmax(logits / T) (T=0: plain softmax, argmax)."""
    logits = allowed(logits, banned)
    if temperature <= 0:   # the top logit's probability is exp(top - logsumexp): no softmax row to write
        top, ids = logits.max(-1)
        return ids, torch.exp(top - torch.logsumexp(logits, -1))
    probs = torch.softmax(logits / max(temperature, LEAST_TEMPERATURE), dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
    return ids, probs.gather(-1, ids[..., None])[..., 0]


def alternatives(logits: Tensor, k: int, banned: int | None) -> list[dict[str, Any]]:
    """Per row of logits [Q, V]: the k most likely tokens under the plain (T = 1) softmax, MASK excluded, with their
    probabilities, the entropy (nats) and the margin between the top two."""
    probs = torch.softmax(allowed(logits, banned), dim=-1)
    top_p, top_id = probs.topk(max(k, 2), dim=-1)
    entropy = torch.special.entr(probs).sum(-1)
    return [{"top": [[int(t), float(p)] for t, p in zip(ids[:k].tolist(), ps[:k].tolist(), strict=True)],
             "entropy": float(h), "margin": float(ps[0] - ps[1])}
            for ids, ps, h in zip(top_id, top_p, entropy.tolist(), strict=True)]


def confidence(logits: Tensor, ids: Tensor, banned: int | None) -> Tensor:
    """Probabilities of ids [...] under the plain (T = 1) softmax of logits [..., V], MASK excluded: the block
    modes' unmasking confidence at every temperature, as Nemotron's `generate` takes it."""
    return torch.softmax(allowed(logits, banned), dim=-1).gather(-1, ids[..., None])[..., 0]
