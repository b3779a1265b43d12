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


@dataclass(frozen=True)
class AnswerFit:
    tokens: int
    greedy: int
    """tokens that equal the model's argmax after the same prefix"""
    nll: float
    """summed over the tokens, in nats"""


def answer_fit(engine: Engine, prompt: Prompt, answer: list[int], raw: bool = False) -> AnswerFit:
    """One causal forward of the prompt (chat-encoded unless raw, as a run reads it) and the answer on the engine's
    own model."""
    prompt_ids = engine.encode_prompt(prompt, raw=raw)
    if not answer:
        return AnswerFit(0, 0, 0.0)
    rt = engine.rt
    req = engine.new_request(prompt, "ar", {"max_new_tokens": 1, "raw": raw})
    ids = prompt_ids + answer
    try:    # written to slots, as a prefill writes them: the rows are then the decode steps' numbers bit for bit
        scores = rt.score(req, ids, 0, "causal", kind="prefill", write=rt.alloc(req, list(range(len(ids)))))
    finally:
        rt.release_all(req, "scored")
    rows = scores.rows(slice(len(prompt_ids) - 1, -1))          # row j predicts answer[j]
    greedy = sum(a == b for a, b in zip(rows.argmax(), answer, strict=True))
    logits, target = rows.logits.float(), torch.tensor(answer, device=rows.logits.device)
    nll = torch.logsumexp(logits, -1) - logits.gather(-1, target[:, None])[:, 0]
    return AnswerFit(len(answer), greedy, float(nll.sum()))


def summed(fits: list[AnswerFit]) -> dict[str, float | None]:
    """{"greedy_share": tokens that are the argmax / tokens, "nll": nats a token} over the answers."""
    tokens = sum(f.tokens for f in fits)
    if not tokens:
        return {"greedy_share": None, "nll": None}
    return {"greedy_share": sum(f.greedy for f in fits) / tokens, "nll": sum(f.nll for f in fits) / tokens}
