"""`isd`: I-DLM introspective strided decoding, Block-N (blk = 2N-1), one causal forward per round.

Verify round  [pending, spec0 .. spec(N-2), M x (N-1)]: specs are checked left to right against the clean
logits by the fused verify of kernels/isd_verify.py (greedy: spec == argmax p; T > 0: accept with
min(1, p / (alpha q)), correction a Gumbel-max draw from norm(max(0, p - q))). All accepted (case V):
emit the N-1 specs + the clean token, keep the new specs the masks drafted (a chain after the clean token
through the adapter's sampler head, when it ships one: backend/engine/draft_chain.py). Reject at spec i (case R): emit
the i accepted specs + the correction, discard this round's drafts; the next round is a cold start on the
correction. Cold start (case C) [t0, M x (2N-2)]: emit the clean token and keep N-1 new specs. MASK KV never
stays: V frees N-1 slots, R frees (N-1-i) + (N-1), C frees 2N-2. The pending / t0 token is the last emitted
one, whose KV this round writes.
NFE = one forward per round; prefill not counted.

`verify=cost` (engine/verify_length.py) verifies only the spec prefix whose drafts' own probabilities pay for its
rows on the engine's cost curve, and drafts only as many new specs as the last committed token's confidence pays
for (verify_length.draft_plan: in every round, or in turns with verify-only rounds where two short forwards cost
less than one long one): a round is [pending, spec0 .. spec(L-1), M x m] with L <= N-1 and m <= N-1 (nothing to
verify and m = 0: a plain decode step), and a cold start carries no padding. `verify=fixed` is the paper's block.

Drafts at T > 0: `draft=sample` (default) *draws* the specs from q, which makes the p/q rule exact
speculative sampling; `draft=argmax` takes the argmax of q, as the I-DLM code does. At T = 0 both are argmax.
A spec whose scaled proposal alpha*q is 0 is rejected (the reference's where(alpha*q > 0, p/q, 0)).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specscope.backend.engine.ask import Round, RoundResult, SlotRelease
from specscope.backend.engine.draft_chain import SAMPLER_PARAM
from specscope.backend.engine.modes import register
from specscope.backend.engine.modes.ar import decode_round
from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.params import Param
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.scores import Scores, Verdict, verify_specs
from specscope.backend.engine.spec_counts import DraftStep
from specscope.backend.engine.verify_length import VERIFY_PARAM, best_prefix, draft_plan
from specscope.backend.tracing import RoundEvent


@dataclass
class ISDState:
    specs: list[int] = field(default_factory=list)   # drafts awaiting verification (empty: cold start)
    draft: Scores | None = None                      # the N-1 MASK rows that drafted the specs (their proposal q)
    n: int = 0                                       # the Block-N of this round (its draft tier may lower it)
    cases: dict[str, int] = field(default_factory=lambda: {"V": 0, "R": 0, "C": 0})
    accepted_specs: int = 0


def pq_table(specs: list[int], verdict: Verdict, temperature: float, alpha: float,
             uniforms: list[float] | None) -> list[dict]:
    """The trace's p/q table: each spec's p, q, acceptance test and uniform (untested after the first reject)."""
    pq = [{"i": i, "token": specs[i], "p": p, "q": q, "accepted": i < verdict.accepted, "tested": True,
           "accept_prob": None if temperature <= 0 else min(1.0, p / (alpha * q)) if alpha * q > 0 else 0.0,
           "u": None if uniforms is None else uniforms[i]}
          for i, (p, q) in enumerate(zip(verdict.p, verdict.q, strict=True))]
    pq += [{"i": i, "token": specs[i], "p": None, "q": None, "accepted": False, "tested": False,
            "accept_prob": None, "u": None} for i in range(len(pq), len(specs))]
    return pq


@register
class ISD(Mode):
    name = "isd"
    summary = "I-DLM introspective strided decoding: verify N-1 specs and draft N-1 more in one causal pass"
    nfe_note = "one forward per round; prefill not counted"
    explain = ("Introspective strided decoding: each forward verifies the previous round's N-1 specs against p "
               "and drafts new ones. Case V: every spec accepted; R: a spec rejected, the correction replaces it "
               "and the rest is dropped (KV trimmed); C: cold start, nothing to verify. Accepted spec: p/q test "
               "passed (greedy: same argmax; T > 0: u < min(1, p/(αq))).")
    color = "#ef4444"
    lossless_vs = "ar"
    picked = {"race": 0}
    draft_param = "n"
    min_draft = 2
    drafter = ("tpf", 1.2)
    drafter_params = {"verify": "fixed"}
    heldout_layout = "causal"
    params = (
        Param("n", int, 4, 2, 8, "Block-N: tokens per all-accept round; blk = 2N-1"),
        Param("alpha", float, 1.0, 0.0, 10.0, "p/q acceptance slack at T > 0 (1 = exact)"),
        Param("draft", str, "sample", help="T > 0: sample the specs from q (exact speculative sampling) or take "
                                           "their argmax (the I-DLM code)", choices=("sample", "argmax")),
        SAMPLER_PARAM,
        VERIFY_PARAM,
    )

    def extra_positions(self, params: dict) -> int:
        return 2 * params["n"]

    def draft_rows(self, length: int) -> int:
        return 2 * length - 2     # Block-N: 2N-1 rows

    def start(self, req: Request, rt: Runtime) -> ISDState:
        return ISDState()

    def metrics(self, req: Request) -> dict:
        st = req.state
        if not isinstance(st, ISDState):      # cancelled or failed before its first round
            return {}
        verify_rounds = st.cases["V"] + st.cases["R"]
        return {**{f"case_{k}": v for k, v in st.cases.items()},
                "mean_accepted_specs": st.accepted_specs / verify_rounds if verify_rounds else None}

    def round(self, req: Request, rt: Runtime) -> Round:
        st: ISDState = req.state
        n = self.draft_length(req.params["n"], req.draft_rows)
        if n is None or n != st.n:           # the tier changed the block: its specs were drafted for another
            st.specs, st.draft = [], None
        if n is None:
            return (yield from decode_round(req, rt))
        st.n = n
        specs, drafting, padding = self._lengths(req, rt, st)
        start = req.cached
        block = [req.tokens[-1]] + specs + [rt.mask] * (drafting + padding)
        slots = rt.alloc(req, range(start, start + len(block)))
        scores = yield rt.ask(req, block, start, "strict_causal", kind="verify", write=slots)
        if not specs:
            return self._cold_start(req, rt, st, scores, slots, start, block, drafting)
        assert st.draft is not None, "specs without their draft rows"
        alpha = req.params["alpha"]
        verified = len(specs)
        verdict, uniforms = verify_specs(scores.rows(slice(0, verified)), st.draft.rows(slice(0, verified)), specs,
                                         alpha, req.tracer.enabled)
        pq = pq_table(specs, verdict, req.temperature, alpha, uniforms) if req.tracer.enabled else []
        st.accepted_specs += verdict.accepted
        if verdict.correction is None:
            return self._all_accepted(req, rt, st, scores, slots, start, block, specs, drafting, pq)
        return self._rejected(req, rt, st, scores, slots, start, block, specs, verdict.accepted,
                              verdict.correction, pq)

    @staticmethod
    def _lengths(req: Request, rt: Runtime, st: ISDState) -> tuple[list[int], int, int]:
        """The specs this round verifies, how many masks draft the next ones, and how many pad the block."""
        k = st.n - 1
        if req.params["verify"] == "fixed":
            return st.specs, k, 0 if st.specs else k
        plan = draft_plan(req.confidence, k, lambda verified, drafted: 1 + verified + drafted, rt.cost)
        drafting = 0 if plan.alternate and st.specs else plan.drafts
        if not st.specs:
            return [], drafting, 0
        probs = st.draft.confidence_of(st.specs) if st.draft is not None else []
        verified = best_prefix(probs, lambda v: rt.cost.at(1 + v + drafting))
        return st.specs[:verified], drafting, 0

    def _draft(self, req: Request, rt: Runtime, st: ISDState, masks: Scores, clean: int) -> None:
        """New specs after the clean token, drawn from (or the argmax of) the rows of the masks (chained through
        the sampler head, if any), which are kept as their proposal q; none without masks."""
        if len(masks) == 0:
            st.specs, st.draft = [], None
            return
        st.specs, st.draft = rt.drafts(masks, clean, req.params["draft"] == "argmax", req.params["sampler"])

    def _cold_start(self, req: Request, rt: Runtime, st: ISDState, scores: Scores, slots: list[int],
                    start: int, block: list[int], drafting: int) -> RoundResult:
        (clean,), (p_clean,) = scores.rows(slice(0, 1)).pick()
        req.confidence = p_clean
        self._draft(req, rt, st, scores.rows(slice(1, 1 + drafting)), clean)
        st.cases["C"] += 1
        release = SlotRelease(slots[1:], list(range(start + 1, start + len(block))), "mask")
        view = None
        if req.tracer.enabled:
            drafts = len(st.specs)
            tokens = [block[0], clean] + st.specs + [rt.mask] * (len(block) - 1 - drafts)
            states = ["pending", "bonus"] + ["draft"] * drafts + ["padding"] * (len(block) - 1 - drafts)
            view = RoundEvent(start, tokens, states, [None, p_clean] + [None] * (len(tokens) - 2),
                             case="C", extra=self._extra(req, st, 0, drafting, len(block) - 1))
        return RoundResult([clean], 1, commit=slots[:1], free=[release], view=view)

    def _all_accepted(self, req: Request, rt: Runtime, st: ISDState, scores: Scores, slots: list[int],
                      start: int, block: list[int], specs: list[int], drafting: int, pq: list[dict]) -> RoundResult:
        verified = len(specs)
        (clean,), (p_clean,) = scores.rows(slice(verified, verified + 1)).pick()
        req.confidence = p_clean
        self._draft(req, rt, st, scores.rows(slice(verified + 1, verified + 1 + drafting)), clean)
        st.cases["V"] += 1
        release = SlotRelease(slots[verified + 1:], list(range(start + verified + 1, start + len(block))), "mask")
        view = None
        if req.tracer.enabled:
            drafts = len(st.specs)
            tokens = [block[0]] + specs + [clean] + st.specs
            states = ["pending"] + ["accepted"] * verified + ["bonus"] + ["draft"] * drafts
            view = RoundEvent(start, tokens, states, [None] * verified + [None, p_clean] + [None] * drafts,
                             case="V", pq=pq,
                             extra=self._extra(req, st, verified, drafting, len(block) - verified - 1))
        return RoundResult(specs + [clean], verified + 1, commit=slots[:verified + 1], free=[release], view=view,
                           draft=DraftStep(verified, verified, verified))

    def _rejected(self, req: Request, rt: Runtime, st: ISDState, scores: Scores, slots: list[int], start: int,
                  block: list[int], specs: list[int], i: int, fix: int, pq: list[dict]) -> RoundResult:
        """Reject at spec i: keep the i accepted specs and the correction `fix`."""
        verified = len(specs)
        masks = len(block) - 1 - verified
        if req.params["verify"] == "cost":       # how sure the model was of the correction: the draft plan reads it
            req.confidence = scores.rows(slice(i, i + 1)).confidence_of([fix])[0]
        st.specs, st.draft = [], None
        st.cases["R"] += 1
        keep = 1 + i
        rejected = SlotRelease(slots[keep:verified + 1], list(range(start + keep, start + verified + 1)), "rejected")
        freed = SlotRelease(slots[verified + 1:], list(range(start + verified + 1, start + len(block))), "mask")
        view = None
        if req.tracer.enabled:
            tokens = [block[0]] + specs[:i] + [fix] + specs[i + 1:] + [rt.mask] * masks
            states = (["pending"] + ["accepted"] * i + ["bonus"] + ["rejected"] * (verified - i - 1)
                      + ["padding"] * masks)
            view = RoundEvent(start, tokens, states, None, case="R", pq=pq,
                             extra={**self._extra(req, st, verified, masks, (verified - i) + masks),
                                    "replaced_draft": specs[i], "rejected_at": i})
        return RoundResult(specs[:i] + [fix], i + 1, commit=slots[:keep], free=[rejected, freed], view=view,
                           draft=DraftStep(verified, verified, i))

    @staticmethod
    def _extra(req: Request, st: ISDState, verified: int, drafting: int, trim: int) -> dict:
        return {"n": st.n, "trim": trim, "verify": req.params["verify"], "verified": verified, "drafted": drafting}
