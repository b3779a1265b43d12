"""What a forward gives back to a mode: one request's query rows behind plain-data reads (tokens and their
probabilities under the request's sampling rule, I-DLM's p/q verify), so a mode file holds no tensor code."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specscope.backend.engine.request import Request
from specscope.backend.engine.sampling import allowed, best, confidence, pick
from specscope.kernels.isd_verify import Verdict, isd_verify


@dataclass(frozen=True)
class Scores:
    """The logits [Q, V] of one request's query rows; row j predicts the position after row j's. `hidden` [Q, D]:
    the rows' final hidden states, where the forward gave them (for the sampler head's chain)."""
    logits: Tensor
    req: Request
    mask_id: int | None
    hidden: Tensor | None = None

    def __len__(self) -> int:
        return self.logits.shape[0]

    def rows(self, index: slice | Sequence[int]) -> Scores:
        """These rows alone: a slice is a view, a list of rows gathers them."""
        at = index if isinstance(index, slice) else list(index)
        return Scores(self.logits[at], self.req, self.mask_id, None if self.hidden is None else self.hidden[at])

    def pick(self) -> tuple[list[int], list[float]]:
        """Each row's token under the request's rule (argmax at T = 0, else a seeded draw, MASK never) and its
        probability."""
        ids, probs = pick(self.logits, self.req.temperature, self.req.generator, self.mask_id)
        return ids.tolist(), probs.tolist()

    def tokens(self) -> list[int]:
        """Each row's token under the request's rule (`pick` without the probabilities)."""
        return self.argmax() if self.req.temperature <= 0 else self.pick()[0]

    def pick_with_confidence(self) -> tuple[list[int], list[float]]:
        """Each row's token under the request's rule and its probability under the plain (T = 1) softmax, MASK
        excluded: the block modes' unmasking confidence at every temperature (as Nemotron's `generate` takes it)."""
        ids = pick(self.logits, self.req.temperature, self.req.generator, self.mask_id)[0]
        return ids.tolist(), confidence(self.logits, ids, self.mask_id).tolist()

    def top(self, k: int) -> tuple[list[int], list[float]]:
        """The first row's k likeliest tokens and their probabilities under the plain softmax, MASK excluded."""
        probs = torch.softmax(allowed(self.logits[0], self.mask_id), dim=-1).topk(k)
        return probs.indices.tolist(), probs.values.tolist()

    def confidence_of(self, ids: Sequence[int]) -> list[float]:
        """Each row's probability of `ids[j]` under the plain softmax, MASK excluded: how sure row j is of a token
        (a draft's, for the cost-aware verify length)."""
        logits = allowed(self.logits, self.mask_id)
        chosen = logits.gather(-1, torch.tensor(list(ids), device=logits.device)[:, None])[:, 0]
        return torch.exp(chosen - torch.logsumexp(logits, -1)).tolist()   # no softmax row to write

    def argmax(self) -> list[int]:
        """Each row's most likely token (MASK excluded), whatever the request's temperature."""
        return best(self.logits, self.mask_id).tolist()


def verify_specs(clean: Scores, draft: Scores, specs: list[int], alpha: float,
                 probabilities: bool = True) -> tuple[Verdict, list[float] | None]:
    """I-DLM's left-to-right check of specs against the clean rows (row i predicts spec i), with the rows that
    drafted them as the proposal q, by the fused verify (kernels/isd_verify.py). The noise at T > 0 comes from
    the request's generator; its uniforms come back for the trace. With `probabilities` off (tracing off), a
    greedy check may skip p and q (the verdict's lists then come back empty)."""
    logits, req = clean.logits, clean.req
    if clean.mask_id is None:
        raise RuntimeError("the p/q verify of drafted specs needs the model's mask token")
    k, v = logits.shape
    uniforms = gumbel = None
    if req.temperature > 0:
        uniforms = torch.rand(k, generator=req.generator).to(logits.device)
        gumbel = -torch.log(-torch.log(torch.rand(k, v, generator=req.generator).clamp_min(1e-20)))
        gumbel = gumbel.to(logits.device)
    verdict = isd_verify(logits, draft.logits, torch.tensor(specs, device=logits.device), req.temperature,
                         alpha, clean.mask_id, uniforms, gumbel, probabilities)
    return verdict, None if uniforms is None else uniforms.tolist()
