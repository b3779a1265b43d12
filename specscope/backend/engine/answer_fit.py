"""How the model itself rates an answer, teacher-forced on the prompt and the answer: at each answer token, the
model's own greedy pick after the same prefix, and the token's negative log-likelihood. For a mode that is not
lossless (block diffusion) this says, token by token, how far its text is from what the model would write; "the
same tokens as ar" stops at the first difference. A lossless mode's greedy answer is the model's pick at every
token on the engine that made it (the forward's rows do not depend on how many share it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import baseline
from specscope.backend.engine.params import ParamError
from specscope.backend.engine.request import Request
from specscope.backend.engine.scores import Scores

CHUNK = 16
"""Answer rows a forward scores: a written causal chunk after a committed prefix, whose rows are the decode steps'
numbers bit for bit."""


@dataclass(frozen=True)
class AnswerFit:
    answer: list[int]
    picks: list[int]
    """the model's greedy token after each answer prefix (the prompt, then the answer before that token)"""
    nll: list[float]
    """each answer token's negative log-likelihood under the model, in nats"""

    @property
    def greedy(self) -> int:
        """Answer tokens that are the model's pick."""
        return sum(a == p for a, p in zip(self.answer, self.picks, strict=True))

    def summary(self) -> dict[str, float | int | None]:
        return {"tokens": len(self.answer), "greedy": self.greedy,
                "greedy_share": self.greedy / len(self.answer) if self.answer else None,
                "nll_mean": sum(self.nll) / len(self.nll) if self.nll else None}


def answer_fit(engine: Engine, prompt_ids: list[int], answer: list[int]) -> AnswerFit:
    """The run's forwards replayed on the engine's own model: the prompt's prefill, whose last row predicts the
    answer's first token, then the answer in written causal chunks."""
    if not answer:
        return AnswerFit([], [], [])
    rt = engine.rt
    vocab = rt.model.cfg.vocab_size
    if not prompt_ids or not all(0 <= i < vocab for i in (*prompt_ids, *answer)):
        raise ParamError(f"a prompt and an answer of token ids in [0, {vocab}) are needed")
    if len(prompt_ids) + len(answer) > rt.context:
        raise ParamError(f"{len(prompt_ids)} + {len(answer)} tokens exceed the model's context {rt.context}")
    req = Request(rid="answer_fit", prompt_ids=list(prompt_ids), mode=baseline(), params={}, eos_id=rt.eos_id)
    ids = [*prompt_ids, *answer]
    rows: list[Scores] = []
    try:
        start, stop = 0, len(prompt_ids)
        while start < stop:     # the last answer token's row would predict past the answer
            slots = rt.alloc(req, list(range(start, stop)))
            rows.append(rt.score(req, ids[start:stop], start, "causal", kind="prefill", write=slots))
            rt.commit(req, slots)
            start, stop = stop, min(stop + CHUNK, len(ids) - 1)
    finally:
        rt.release_all(req, "scored")
    logits = torch.cat([s.logits for s in rows])[len(prompt_ids) - 1:].float()     # row j predicts answer[j]
    picks = [p for s in rows for p in s.argmax()][len(prompt_ids) - 1:]
    target = torch.tensor(answer, device=logits.device)
    nll = torch.logsumexp(logits, -1) - logits.gather(-1, target[:, None])[:, 0]
    return AnswerFit(list(answer), picks, nll.tolist())


def summed(fits: list[AnswerFit]) -> dict[str, float | None]:
    """{"greedy_share": tokens that are the model's pick / tokens, "nll": nats a token} over the answers."""
    pooled = AnswerFit([a for f in fits for a in f.answer], [p for f in fits for p in f.picks],
                       [x for f in fits for x in f.nll]).summary()
    return {"greedy_share": pooled["greedy_share"], "nll": pooled["nll_mean"]}
