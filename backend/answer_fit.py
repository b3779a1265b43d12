"""How the model itself rates an answer, teacher-forced on the prompt and the answer: the share of the answer's
tokens that are the model's greedy choice after the same prefix, and the answer's mean negative log-likelihood.
For a mode that is not lossless (block diffusion) this says, token by token, how far its text is from what the
model would write; "the same tokens as ar" stops at the first difference. A lossless mode's greedy answer scores
a greedy share of 1 on the engine that made it (the forward's rows do not depend on how many share it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.engine.engine import Engine
from backend.engine.messages import Prompt
from backend.engine.scores import Scores


@dataclass(frozen=True)
class AnswerFit:
    tokens: int
    greedy: int
    """tokens that equal the model's argmax after the same prefix"""
    nll: float
    """summed over the tokens, in nats"""


CHUNK = 16
"""Answer rows a forward scores: a written causal chunk after a committed prefix, whose rows are the decode steps'
numbers bit for bit."""


def answer_fit(engine: Engine, prompt: Prompt, answer: list[int], raw: bool = False) -> AnswerFit:
    """The run's forwards replayed on the engine's own model: the prompt's prefill (chat-encoded unless raw), whose
    last row predicts the answer's first token, then the answer in written causal chunks."""
    if not answer:
        return AnswerFit(0, 0, 0.0)
    rt = engine.rt
    req = engine.new_request(prompt, "ar", {"max_new_tokens": 1, "raw": raw})
    ids = [*req.prompt_ids, *answer]
    rows: list[Scores] = []
    try:
        start, stop = 0, len(req.prompt_ids)
        while start < stop:     # the last answer token's row would predict past the answer
            slots = rt.alloc(req, list(range(start, stop)))
            rows.append(rt.score(req, ids[start:stop], start, "causal", kind="prefill", write=slots))
            rt.commit(req, slots)
            start, stop = stop, min(stop + CHUNK, len(ids) - 1)
    finally:
        rt.release_all(req, "scored")
    logits = torch.cat([s.logits for s in rows])[len(req.prompt_ids) - 1:]     # row j predicts answer[j]
    picks = torch.cat([torch.tensor(s.argmax()) for s in rows])[len(req.prompt_ids) - 1:]
    target = torch.tensor(answer)
    nll = torch.logsumexp(logits.float(), -1) - logits.float().gather(-1, target[:, None].to(logits.device))[:, 0]
    return AnswerFit(len(answer), int((picks == target).sum()), float(nll.sum()))


def summed(fits: list[AnswerFit]) -> dict[str, float | None]:
    """{"greedy_share": tokens that are the argmax / tokens, "nll": nats a token} over the answers."""
    tokens = sum(f.tokens for f in fits)
    if not tokens:
        return {"greedy_share": None, "nll": None}
    return {"greedy_share": sum(f.greedy for f in fits) / tokens, "nll": sum(f.nll for f in fits) / tokens}
