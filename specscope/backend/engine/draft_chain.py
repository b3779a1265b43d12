"""Chained MASK drafts through the adapter's sampler head (backend/model/sampler_head.py): the rows of a MASK run
are drafted left to right, each re-ranked given the draft just before it, so the run reads as one continuation
where the rows alone are each a guess that does not know its neighbour. A draft follows the request's rule
(argmax at T = 0, else a seeded draw) on its re-ranked row, and the re-ranked rows are the drafts' proposal q
(isd's p/q test), so speculative sampling stays exact."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specscope.backend.engine.params import Param
from specscope.backend.engine.sampling import pick
from specscope.backend.engine.scores import Scores
from specscope.backend.model.sampler_head import SAMPLER_FILE, SamplerHead, load_sampler
from specscope.backend.model.transformer import Transformer

SAMPLER_PARAM = Param("sampler", bool, True,
                      help="chain the MASK drafts through the adapter's sampler head, when it ships one")


class DraftChain:
    def __init__(self, head: SamplerHead, lm_head: Tensor, mask_id: int):
        self.head = head
        self.lm_head = lm_head.float().contiguous()
        """Row-major (a copy where the runtime keeps the head input-major): the chain gathers whole rows."""
        self.mask_id = mask_id

    def draw(self, masks: Scores, previous: int, argmax: bool) -> tuple[list[int], Scores]:
        """The drafts of MASK rows that follow the token `previous`, and the re-ranked rows they came from."""
        if masks.hidden is None:
            raise ValueError("the chain reads the rows' hidden states, and this forward gave none")
        logits = masks.logits.float().clone()
        logits[:, self.mask_id] = float("-inf")
        temperature = 0.0 if argmax else masks.req.temperature
        drafts: list[int] = []
        head = self.head
        with torch.inference_mode():
            hidden = masks.hidden.float()
            own = head.own(hidden)                                          # the rows' share, in one product
            settled = hidden + head.down.bias                               # finish's terms that ignore the draft
            candidates = logits.topk(head.candidates, -1).indices           # [K, C]
            rows = self.lm_head[candidates]                                 # [K, C, D]
            scores = torch.empty(candidates.shape, device=logits.device)
            ids = candidates.tolist()
            for j in range(len(ids)):   # head.finish(hidden[j], own[j], previous row) in two addmv: few ops a draft
                pre = torch.addmv(own[j], head.previous.weight, self.lm_head[previous])
                torch.mv(rows[j], torch.addmv(settled[j], head.down.weight, F.silu(pre)), out=scores[j])
                choice = (int(scores[j].argmax()) if temperature <= 0
                          else int(pick(scores[j], temperature, masks.req.generator, None)[0]))
                previous = ids[j][choice]
                drafts.append(previous)
        ranked = torch.full_like(logits, float("-inf")).scatter_(1, candidates, scores)
        return drafts, Scores(ranked, masks.req, self.mask_id)


def draft_chain(model: Transformer, adapter_dir: Path | None, mask_id: int | None) -> DraftChain | None:
    """The chain of the sampler head shipped in the adapter's folder, if it has one."""
    path = None if adapter_dir is None else adapter_dir / SAMPLER_FILE
    if path is None or mask_id is None or not path.is_file():
        return None
    weight = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    return DraftChain(load_sampler(path, weight.device), weight.detach(), mask_id)
