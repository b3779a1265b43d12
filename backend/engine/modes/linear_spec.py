"""`linear_spec`: Nemotron linear self-speculation.

Draft: [seed, M x (B-1)] in `block` attention with the LoRA adapter on (if the model has one), prefix KV
read-only; threshold 0 fills every mask in one pass, threshold > 0 unmasks iteratively. Verify: the block in
`causal` attention writes its KV; accept the longest prefix with ar[i] == block[i+1], plus the AR token at the
first mismatch (the bonus), which becomes the next seed and is not yet in the KV. The KV of the rejected
suffix is freed. Greedy output equals `ar`. NFE = draft passes + 1 verify per round; prefill not counted.
"""
from __future__ import annotations

import torch

from backend.engine.modes import register
from backend.engine.modes.base import Mode, RoundResult, RoundView, SlotRelease
from backend.engine.modes.block_diffusion import candidates, check_block_params, denoise, unmask_step
from backend.engine.params import Param
from backend.engine.request import Request
from backend.engine.runtime import Runtime


@register
class LinearSpec(Mode):
    name = "linear_spec"
    summary = "linear self-speculation: bidirectional draft, causal verify, longest prefix + bonus"
    nfe_note = "draft passes + 1 verify per round; prefill not counted"
    lossless_vs = "ar"
    params = (
        Param("block_size", int, 16, 2, 256, "positions per draft block, seed included"),
        Param("threshold", float, 0.0, 0.0, 1.0, "0: one draft pass fills all masks; >0: iterative"),
        Param("lora", bool, True, help="use the draft LoRA adapter when the model has one"),
    )

    def check(self, params: dict, rt: Runtime) -> None:
        check_block_params(params, rt)

    def round(self, req: Request, rt: Runtime) -> RoundResult:
        size = req.block_size or req.params["block_size"]
        start = req.cached
        block = [req.tokens[-1]] + [rt.mask] * (size - 1)
        conf: list[float | None] = [None] * size
        lora = req.params["lora"] and rt.model.has_lora
        while rt.mask in block:
            guess, probs = denoise(req, rt, block, start, "draft", lora)
            eligible = candidates(block, rt.mask, 0)
            threshold = req.params["threshold"]
            chosen = unmask_step(block, guess, probs, eligible, threshold if threshold > 0 else 0.0)
            for i in chosen:
                conf[i] = probs[i]
        slots = rt.alloc(req, range(start, start + size))
        logits = rt.forward([req], torch.tensor([block]), [start], "causal", kind="verify", write=[slots])
        ar = rt.pick(req, logits[0])[0].tolist()
        accepted = 0
        while accepted < size - 1 and ar[accepted] == block[accepted + 1]:
            accepted += 1
        emitted = block[1:accepted + 1] + [ar[accepted]]
        keep = accepted + 1
        release = SlotRelease(slots[keep:], list(range(start + keep, start + size)), "rejected")
        view = self._view(start, block, conf, accepted, ar[accepted]) if req.tracer.enabled else None
        return RoundResult(emitted, accepted + 1, commit=slots[:keep], free=[release], view=view)

    @staticmethod
    def _view(start: int, block: list[int], conf: list[float | None], accepted: int, bonus: int) -> RoundView:
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
        return RoundView(start, tokens, states, conf, extra={"replaced_draft": replaced})
