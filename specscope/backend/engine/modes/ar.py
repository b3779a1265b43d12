"""`ar`: causal one-token decode with a KV cache. NFE = decode forwards (the prefill is not counted)."""
from __future__ import annotations

from specscope.backend.engine.modes import register
from specscope.backend.engine.modes.base import Mode, RoundResult
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
    needs_mask = False
    batchable = True

    def extra_positions(self, params: dict) -> int:
        return 1

    def round(self, req: Request, rt: Runtime) -> RoundResult:
        return self.round_batch([req], rt)[0]

    def round_batch(self, reqs: list[Request], rt: Runtime) -> list[RoundResult]:
        """Feed each request's last token (writing its KV) and take the next one."""
        starts = [r.cached for r in reqs]
        slots = [rt.alloc(r, [s]) for r, s in zip(reqs, starts, strict=True)]
        results = []
        for r, scores, s, start in zip(reqs, rt.decode(reqs, slots), slots, starts, strict=True):
            (token,), (prob,) = scores.pick()
            view = RoundEvent(start + 1, [token], ["accepted"], [prob]) if r.tracer.enabled else None
            results.append(RoundResult([token], 1, commit=s, view=view))
        return results
