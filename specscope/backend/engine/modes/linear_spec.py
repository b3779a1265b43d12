"""`linear_spec`: Nemotron linear self-speculation.

Draft: [seed, M x (B-1)] in `block` attention with the draft adapter on (if the model has one), prefix KV
read-only; threshold 0 fills every mask in one pass (position 1 from the seed's row, the rest chained through the
adapter's sampler head when it ships one), threshold > 0 unmasks iteratively. Verify: the block in
`causal` attention writes its KV; accept the longest prefix with ar[i] == block[i+1], plus the AR token at the
first mismatch (the bonus), which becomes the next seed and is not yet in the KV. The KV of the rejected
suffix is freed. Greedy output equals `ar`. NFE = draft passes + 1 verify per round; prefill not counted.
"""
from __future__ import annotations

from specscope.backend.engine.ask import Round
from specscope.backend.engine.blocks import block_size, chain_block, check_block_params, fill_block, longest_match
from specscope.backend.engine.draft_chain import SAMPLER_PARAM
from specscope.backend.engine.draft_tiers import block_length
from specscope.backend.engine.modes import register
from specscope.backend.engine.modes.ar import decode_round
from specscope.backend.engine.modes.base import Mode, RoundResult, SlotRelease
from specscope.backend.engine.params import Param
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.tracing import RoundEvent


@register
class LinearSpec(Mode):
    name = "linear_spec"
    summary = "linear self-speculation: bidirectional draft, causal verify, longest prefix + bonus"
    nfe_note = "draft passes + 1 verify per round; prefill not counted"
    explain = ("Round = draft the block in one pass (block attention, LoRA), then verify it causally. Accepted = "
               "the leading drafts the verifier agrees with; the first disagreement becomes the correction "
               "(bonus) and the rest is rejected; its KV is trimmed. Committed = accepted + correction.")
    lossless_vs = "ar"
    drafter = ("accept_len_mean", 1.5)
    params = (
        Param("block_size", int, 16, 2, 256, "positions per draft block, seed included"),
        Param("threshold", float, 0.0, 0.0, 1.0, "0: one draft pass fills all masks; >0: iterative"),
        Param("lora", bool, True, help="use the draft LoRA adapter when the model has one"),
        SAMPLER_PARAM,
    )

    def check(self, params: dict, rt: Runtime) -> None:
        check_block_params(params, rt)

    def round(self, req: Request, rt: Runtime) -> Round:
        size, start = block_length(block_size(req), req.draft_rows), req.cached
        if size is None:
            return (yield from decode_round(req, rt))
        block = [req.tokens[-1]] + [rt.mask] * (size - 1)
        lora = req.params["lora"]
        threshold = req.params["threshold"]
        if threshold == 0 and req.params["sampler"] and rt.chain is not None:
            conf = yield from chain_block(req, rt, block, start, lora)
        else:
            conf = yield from fill_block(req, rt, block, start, lora, threshold)
        slots = rt.alloc(req, range(start, start + size))
        ar = (yield rt.ask(req, block, start, "causal", kind="verify", write=slots)).tokens()
        accepted = longest_match(ar, block[1:])
        keep = accepted + 1
        release = SlotRelease(slots[keep:], list(range(start + keep, start + size)), "rejected")
        view = self._view(start, block, conf, accepted, ar[accepted]) if req.tracer.enabled else None
        return RoundResult(block[1:keep] + [ar[accepted]], keep, commit=slots[:keep], free=[release], view=view)

    @staticmethod
    def _view(start: int, block: list[int], conf: list[float | None], accepted: int, bonus: int) -> RoundEvent:
        size = len(block)
        states = ["committed"] + ["accepted"] * accepted + ["rejected"] * (size - 1 - accepted)
        tokens = list(block)
        replaced = None
        if accepted + 1 < size:
            replaced = tokens[accepted + 1]
            tokens[accepted + 1], states[accepted + 1] = bonus, "bonus"
            conf = conf[:accepted + 1] + [None] + conf[accepted + 2:]
        else:
            tokens.append(bonus)
            states.append("bonus")
            conf = conf + [None]
        return RoundEvent(start, tokens, states, conf, block_size=size,
                          extra={"replaced_draft": replaced, "drafts": block[1:]})
