"""`quadratic`: Nemotron quadratic self-speculation (the "Your LLM Knows the Future" layout, as Nemotron's
`sbd_inference_diffusion_quadratic` runs it), one forward per round.

Round input: the pending token d0 and the k speculative tokens d1..dk of the last round, each followed by a
group of k masks, `[d0, M×k, d1, M×k, …, dk, M×k]`; group j sits at positions P+j .. P+j+k. Attention: every
row sees the committed prefix; the d's form a causal chain (d_j sees d_0..d_j); a mask sees d_0..d_j of its
own group and the earlier masks of its group (strict causal, as the model's MASK stream was trained). So
d_j's logits are the causal (AR) prediction for P+j+1, and the masks of group j predict P+j+2 .. P+j+k+1
from exactly the prefix d_0..d_j. Accept the longest a with d_{i+1} == AR(d_i) for i < a, emit d_1..d_a plus
the AR token of d_a (the bonus; the next pending token), and take the next k specs from group a's masks (a chain
after the bonus through the adapter's sampler head, when it ships one: backend/engine/draft_chain.py):
whatever prefix is accepted, fresh specs conditioned on exactly it are ready. The first round after the
prefill has no specs (one group). KV: only d_0..d_a's (valid causal KV) is committed; rejected d's and all
masks are freed. Greedy output equals `ar`. NFE = one forward per round; prefill not counted. At T > 0 a
spec is accepted when it equals the token drawn from the AR logits (as Nemotron's linear_spec does).

`verify=cost` (engine/verify_length.py) verifies only the spec prefix whose drafts' probabilities pay for its
groups on the engine's cost curve, and gives each group only as many masks as the last committed token's
confidence pays for ((L+1)(m+1) rows; verify_length.draft_plan, which may take turns of drafting and verify-only
rounds; L = m = 0 is a plain decode step). `verify=fixed` is the paper's layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specscope.backend.engine.ask import Round, RoundResult, SlotRelease
from specscope.backend.engine.blocks import longest_match
from specscope.backend.engine.draft_chain import SAMPLER_PARAM
from specscope.backend.engine.modes import register
from specscope.backend.engine.modes.ar import decode_round
from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.params import Param
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.scores import Scores
from specscope.backend.engine.spec_counts import DraftStep
from specscope.backend.engine.verify_length import VERIFY_PARAM, best_prefix, draft_plan
from specscope.backend.tracing import RoundEvent


@dataclass
class QuadraticState:
    specs: list[int] = field(default_factory=list)   # d1..dk for the next round (empty: cold start)
    probs: list[float] = field(default_factory=list)  # how sure their rows were of them (verify=cost reads it)
    seeded_by: int | None = None                     # the group whose masks drafted them (trace)


def interleaved(drafts: list[int], k: int, mask_id: int) -> tuple[list[int], list[int]]:
    """Token ids and position offsets of [d0, M×k, d1, M×k, …]: group j at offsets j .. j+k."""
    ids, offsets = [], []
    for j, d in enumerate(drafts):
        ids += [d] + [mask_id] * k
        offsets += list(range(j, j + k + 1))
    return ids, offsets


def interleaved_mask(groups: int, k: int, prefix: int) -> Tensor:
    """[1, 1, Q, P+Q] attention mask over [prefix ‖ chunk] of quadratic decoding's interleaved layout
    [d0, M×k, d1, M×k, …]: the d's form a causal chain, each group of k masks sees d_0..d_j and its own earlier
    masks."""
    q = groups * (k + 1)
    u = torch.arange(q)
    group, first = u // (k + 1), u % (k + 1) == 0
    chain = first[None, :] & (group[None, :] <= group[:, None])            # d_0..d_g, every row
    own = ~first[:, None] & (group[None, :] == group[:, None]) & (u[None, :] <= u[:, None])
    chunk = chain | own
    return torch.cat([torch.ones(q, prefix, dtype=torch.bool), chunk], dim=1)[None, None]


@register
class Quadratic(Mode):
    name = "quadratic"
    summary = "quadratic self-speculation: k masks after each of the k specs, fresh specs for any accepted prefix"
    nfe_note = "one forward per round ((k+1)² query rows); prefill not counted"
    explain = ("One forward per round over [d0, M×k, d1, M×k, …]: each spec d_j is followed by k masks that "
               "see exactly d0..d_j. Accepted = the specs the causal rows confirm, then the correction (bonus); "
               "the accepted group's masks become the next k specs (drafts). Cells are in input order; the small "
               "number under a cell is its position. Masks and rejected specs have their KV freed.")
    color = "#0891b2"
    lossless_vs = "ar"
    picked = {"race": 1}
    draft_param = "k"
    drafter = ("accept_len_mean", 1.3)
    drafter_params = {"verify": "fixed"}
    heldout_layout = "causal"
    params = (Param("k", int, 4, 1, 8, "speculative tokens per round; each is followed by k masks"), SAMPLER_PARAM,
              VERIFY_PARAM)

    def extra_positions(self, params: dict) -> int:
        return (params["k"] + 1) ** 2

    def draft_rows(self, length: int) -> int:
        return (length + 1) ** 2 - 1     # (k+1)² rows

    def start(self, req: Request, rt: Runtime) -> QuadraticState:
        return QuadraticState()

    def round(self, req: Request, rt: Runtime) -> Round:
        st: QuadraticState = req.state
        k, start = self.draft_length(req.params["k"], req.draft_rows), req.cached
        if k is None or len(st.specs) > k:   # the tier lowered k: the longer specs are dropped
            st.specs, st.probs, st.seeded_by = [], [], None
        if k is None:
            return (yield from decode_round(req, rt))
        specs, k = self._lengths(req, rt, st, k)
        drafts = [req.tokens[-1]] + specs
        ids, offsets = interleaved(drafts, k, rt.mask)
        slots = rt.alloc(req, [start + o for o in offsets])
        scores = yield rt.ask(req, ids, start, "strict_causal", kind="verify", write=slots,
                              mask=interleaved_mask(len(drafts), k, start), offsets=offsets)
        firsts = [j * (k + 1) for j in range(len(drafts))]
        ar = scores.rows(firsts).tokens()
        accepted = longest_match(ar, specs)
        seeded = st.seeded_by
        group = firsts[accepted]
        self._draft(req, rt, st, scores.rows(slice(group + 1, group + k + 1)), ar[accepted])
        if req.params["verify"] == "cost":
            req.confidence = scores.rows([group]).confidence_of([ar[accepted]])[0]
        st.seeded_by = accepted
        keep = firsts[:accepted + 1]
        rejected = firsts[accepted + 1:]
        masks = [u for u in range(len(ids)) if u % (k + 1)]
        free = [SlotRelease([slots[u] for u in rejected], [start + offsets[u] for u in rejected], "rejected"),
                SlotRelease([slots[u] for u in masks], [start + offsets[u] for u in masks], "mask")]
        emitted = drafts[1:accepted + 1] + [ar[accepted]]
        view = (self._view(start, ids, offsets, k, accepted, ar, st.specs, seeded, req.params["verify"])
                if req.tracer.enabled else None)
        draft = DraftStep(len(specs), len(specs), accepted) if specs else None
        return RoundResult(emitted, accepted + 1, commit=[slots[u] for u in keep], free=free, view=view, draft=draft)

    @staticmethod
    def _lengths(req: Request, rt: Runtime, st: QuadraticState, k: int) -> tuple[list[int], int]:
        """The specs this round verifies, and the masks after each of them (the next round's drafts)."""
        if req.params["verify"] == "fixed":
            return st.specs, k
        plan = draft_plan(req.confidence, k, lambda verified, drafted: (verified + 1) * (drafted + 1), rt.cost)
        masks = 0 if plan.alternate and st.specs else plan.drafts
        verified = best_prefix(st.probs, lambda v: rt.cost.at((v + 1) * (masks + 1)))
        return st.specs[:verified], masks

    @staticmethod
    def _draft(req: Request, rt: Runtime, st: QuadraticState, masks: Scores, previous: int) -> None:
        """The next round's specs from a group's masks (none without masks), and how sure their rows were."""
        if len(masks) == 0:
            st.specs, st.probs = [], []
            return
        st.specs, ranked = rt.drafts(masks, previous, chained=req.params["sampler"])
        st.probs = ranked.confidence_of(st.specs) if req.params["verify"] == "cost" else []

    @staticmethod
    def _view(start: int, ids: list[int], offsets: list[int], k: int, accepted: int, ar: list[int],
              next_specs: list[int], seeded: int | None, verify: str) -> RoundEvent:
        """The interleaved layout in input order (`extra.offsets`: each cell's position - block_start): d_0
        pending, accepted / rejected specs, masks as padding except group `accepted`, whose masks show the
        next round's specs as drafts; the bonus follows."""
        tokens, states = [], []
        for u, tok in enumerate(ids):
            j, i = divmod(u, k + 1)
            if i == 0:
                tokens.append(tok)
                states.append("pending" if j == 0 else "accepted" if j <= accepted else "rejected")
            elif j == accepted:
                tokens.append(next_specs[i - 1])
                states.append("draft")
            else:
                tokens.append(tok)
                states.append("padding")
        tokens.append(ar[accepted])
        states.append("bonus")
        return RoundEvent(start, tokens, states, extra={
            "k": k, "groups": len(ids) // (k + 1), "accepted_group": accepted, "seeded_by_group": seeded,
            "replaced_draft": ids[(accepted + 1) * (k + 1)] if (accepted + 1) * (k + 1) < len(ids) else None,
            "layout": "interleaved", "offsets": offsets + [accepted + 1], "verify": verify,
            "verified": len(ids) // (k + 1) - 1})
