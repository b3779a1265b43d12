"""`ar`: causal one-token decode with a KV cache. NFE = decode forwards (the prefill is not counted)."""
from __future__ import annotations

from specscope.backend.engine.ask import Round, RoundResult
from specscope.backend.engine.modes import register
from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.tracing import RoundEvent


@register
class AR(Mode):
    name = "ar"
    summary = "causal 1-token decode with KV cache (the baseline)"
    nfe_note = "one forward per token; prefill not counted"
    explain = ("One forward per token. Each round commits exactly the token the model picked; nothing is "
               "drafted.")
    color = "#64748b"
    exact = True
    picked = {"compare": 0}
    needs_mask = False

    def extra_positions(self, params: dict) -> int:
        return 1

    def round(self, req: Request, rt: Runtime) -> Round:
        return (yield from decode_round(req, rt))


def decode_round(req: Request, rt: Runtime, extra: dict | None = None) -> Round:
    """Feed the last token (writing its KV) and take the next one: `ar`'s round, and a drafting mode's where its
    draft tier or its cost-aware length allows no drafts (`extra`: what the round records of why)."""
    start = req.cached
    slots = rt.alloc(req, [start])
    scores = yield rt.ask(req, [req.tokens[-1]], start, "causal", kind="decode", write=slots)
    (token,), (prob,) = scores.pick()
    req.confidence = prob
    view = RoundEvent(start + 1, [token], ["accepted"], [prob], extra=extra or {}) if req.tracer.enabled else None
    return RoundResult([token], 1, commit=slots, view=view)
