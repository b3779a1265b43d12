"""`linear_spec`: Nemotron linear self-speculation.

Draft: [seed, M x (B-1)] in `block` attention with the draft adapter on (if the model has one), prefix KV
read-only; threshold 0 fills every mask in one pass (position 1 from the seed's row, the rest chained through the
adapter's sampler head when it ships one), threshold > 0 unmasks iteratively. Verify: the block in
`causal` attention writes its KV; accept the longest prefix with ar[i] == block[i+1], plus the AR token at the
first mismatch (the bonus), which becomes the next seed and is not yet in the KV. The KV of the rejected
suffix is freed. Greedy output equals `ar`. NFE = draft passes + 1 verify per round; prefill not counted.

`verify=cost` (engine/verify_length.py) drafts a block only as long as the last committed token's confidence pays
for on the engine's cost curve (a block of 1 is a plain decode step), then verifies only the draft prefix whose
drafts' own probabilities pay for its rows. `verify=fixed` drafts and verifies the whole block (the reference).

`branches > 1` (threshold 0) drafts a tree instead of a chain (engine/draft_tree.py): the seed row's likeliest
first tokens, each followed by the sampler head's chain over the same MASK rows; the verify checks the nodes (all
of them, or at verify=cost those whose chances pay for their rows) in one causal forward under a tree mask and
keeps the longest path the verifier confirms, plus its bonus.
"""
from __future__ import annotations

from collections import Counter

from specscope.backend.engine.ask import Round, RoundResult, SlotRelease
from specscope.backend.engine.blocks import (
    block_logits,
    block_size,
    chain_block,
    check_block_params,
    fill_block,
    longest_match,
)
from specscope.backend.engine.draft_chain import SAMPLER_PARAM
from specscope.backend.engine.draft_tree import DraftTree, grow, tree_mask
from specscope.backend.engine.modes import register
from specscope.backend.engine.modes.ar import decode_round
from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.params import Param
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.spec_counts import DraftStep
from specscope.backend.engine.verify_length import VERIFY_PARAM, best_draft_count, best_prefix
from specscope.backend.tracing import RoundEvent


def round_ms(rt: Runtime, size: int) -> float:
    """A round's forwards at block `size`: a draft pass and a verify of `size` rows, or one decode step."""
    return rt.cost.at(1) if size == 1 else 2 * rt.cost.at(size)


@register
class LinearSpec(Mode):
    name = "linear_spec"
    summary = "linear self-speculation: bidirectional draft, causal verify, longest prefix + bonus"
    nfe_note = "draft passes + 1 verify per round; prefill not counted"
    explain = ("Round = draft the block in one pass (block attention, LoRA), then verify it causally. Accepted = "
               "the leading drafts the verifier agrees with; the first disagreement becomes the correction "
               "(bonus) and the rest is rejected; its KV is trimmed. Committed = accepted + correction.")
    color = "#3b82f6"
    lossless_vs = "ar"
    picked = {"chat": 0, "compare": 2, "race": 2, "bench": 0}
    draft_param = "block_size"
    min_draft = 2
    drafter = ("accept_len_mean", 1.5)
    drafter_params = {"verify": "fixed"}
    heldout_layout = "block"
    params = (
        Param("block_size", int, 16, 2, 256, "positions per draft block, seed included"),
        Param("threshold", float, 0.0, 0.0, 1.0, "0: one draft pass fills all masks; >0: iterative"),
        Param("lora", bool, True, help="use the draft LoRA adapter when the model has one"),
        SAMPLER_PARAM,
        VERIFY_PARAM,
        Param("branches", int, 1, 1, 8, "first-position branches of the draft: 1 drafts a chain, more a tree "
                                        "verified in one forward (threshold 0)"),
    )

    def check(self, params: dict, rt: Runtime) -> None:
        check_block_params(params, rt)

    def draft_rows(self, length: int) -> int:
        return 2 * length - 1     # B draft rows, then B verify rows

    def round(self, req: Request, rt: Runtime) -> Round:
        size, start = self.draft_length(block_size(req), req.draft_rows), req.cached
        cost = req.params["verify"] == "cost"
        if size is not None and cost:
            size = 1 + best_draft_count(req.confidence, size - 1, lambda m: round_ms(rt, m + 1))
        if size is None:
            return (yield from decode_round(req, rt))
        if size == 1:
            return (yield from decode_round(req, rt, {"verify": "cost", "drafted": 0}))
        block = [req.tokens[-1]] + [rt.mask] * (size - 1)
        lora = req.params["lora"]
        threshold = req.params["threshold"]
        if threshold == 0 and req.params["branches"] > 1:
            return (yield from self._tree_round(req, rt, block, start, cost))
        if threshold == 0 and req.params["sampler"] and rt.chain is not None:
            conf = yield from chain_block(req, rt, block, start, lora)
        else:
            conf = yield from fill_block(req, rt, block, start, lora, threshold)
        if cost:
            drafted = rt.cost.at(size)
            verified = best_prefix([c or 0.0 for c in conf[1:]], lambda v: drafted + rt.cost.at(1 + v))
            block, conf = block[:1 + verified], conf[:1 + verified]
        size = len(block)
        slots = rt.alloc(req, range(start, start + size))
        verify = yield rt.ask(req, block, start, "causal", kind="verify", write=slots)
        ar = verify.tokens()
        accepted = longest_match(ar, block[1:])
        if cost:
            req.confidence = verify.rows([accepted]).confidence_of([ar[accepted]])[0]
        keep = accepted + 1
        release = SlotRelease(slots[keep:], list(range(start + keep, start + size)), "rejected")
        view = (self._view(start, block, conf, accepted, ar[accepted], req.params["verify"])
                if req.tracer.enabled else None)
        draft = DraftStep(size - 1, size - 1, accepted) if size > 1 else None
        return RoundResult(block[1:keep] + [ar[accepted]], keep, commit=slots[:keep], free=[release], view=view,
                           draft=draft)

    def _tree_round(self, req: Request, rt: Runtime, block: list[int], start: int, cost: bool) -> Round:
        """Draft a tree in one pass, verify its (paying) nodes in one forward, keep the confirmed path + bonus."""
        rows = yield block_logits(req, rt, block, start, "draft", req.params["lora"])
        tree = grow(rt, rows, req.params["branches"])
        if cost:
            drafted = rt.cost.at(len(block))
            tree = tree.paying(lambda n: drafted + rt.cost.at(1 + n))
        ids, offsets = [block[0], *tree.tokens], [0, *tree.depths]
        slots = rt.alloc(req, [start + o for o in offsets])
        verify = yield rt.ask(req, ids, start, "causal", kind="verify", write=slots,
                              mask=tree_mask(tree.rows(), start), offsets=offsets)
        ar = verify.tokens()
        path = tree.path(ar)
        kept = [0, *(node + 1 for node in path)]
        bonus = ar[kept[-1]]
        if cost:
            req.confidence = verify.rows([kept[-1]]).confidence_of([bonus])[0]
        dropped = [row for row in range(len(ids)) if row not in kept]
        release = SlotRelease([slots[r] for r in dropped], [start + offsets[r] for r in dropped], "rejected")
        view = self._tree_view(start, ids, tree, path, bonus, req.params["verify"]) if req.tracer.enabled else None
        draft = DraftStep(len(tree.tokens), max(tree.depths), len(path)) if tree.tokens else None
        return RoundResult([tree.tokens[n] for n in path] + [bonus], len(kept), commit=[slots[r] for r in kept],
                           free=[release], view=view, draft=draft)

    @staticmethod
    def _tree_view(start: int, ids: list[int], tree: DraftTree, path: list[int], bonus: int,
                   verify: str) -> RoundEvent:
        """The verify's rows in order (the seed, then every node at its depth: accepted on the winning path,
        rejected elsewhere), then the bonus; `extra.tree` holds the shape, the path and each branch's rows."""
        on_path = set(path)
        states = ["committed"] + ["accepted" if n in on_path else "rejected" for n in range(len(tree.tokens))]
        rows = Counter(tree.branches)
        return RoundEvent(start, [*ids, bonus], [*states, "bonus"], [None, *tree.chances, None],
                          block_size=len(ids), extra={
                              "layout": "tree", "offsets": [0, *tree.depths, len(path) + 1], "verify": verify,
                              "tree": {"parents": tree.parents, "branches": tree.branches, "path": path,
                                       "won": tree.branches[path[0]] if path else None,
                                       "branch_rows": [rows[b] for b in sorted(rows)]}})

    @staticmethod
    def _view(start: int, block: list[int], conf: list[float | None], accepted: int, bonus: int,
              verify: str) -> RoundEvent:
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
                          extra={"replaced_draft": replaced, "drafts": block[1:], "verify": verify})
