"""The block loop shared by the block family (block_diffusion, spiffy, specfold; linear_spec drafts with it).

A block [seed, M, ..., M] of B positions is denoised against the read-only prefix KV. Each round asks the
block's logits source for the logits of the current block state (a dense `block` forward, Spiffy's
draft-logit cache, or SpecFold's folded verify), then commits the most confident eligible masked position
plus every eligible one whose confidence (T = 1 softmax) is >= threshold. When the block is full, or the run
can stop inside it (an EOS with no mask before it, or max_new_tokens reached), one `causal` refresh pass
writes the block's KV and its last logits give the next seed, as Nemotron's `generate` runs and counts it.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specscope.backend.engine.ask import Ask, BranchAsk, Round, RoundResult, SlotRelease
from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.params import Param, ParamError
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.sampling import confidence
from specscope.backend.engine.scores import Scores
from specscope.backend.tracing import RoundEvent

BLOCK_PARAMS: tuple[Param, ...] = (
    Param("block_size", int, 32, 2, 256, "positions per block, seed included"),
    Param("threshold", float, 0.9, 0.0, 1.0, "commit every masked position with confidence >= threshold"),
    Param("sub_block", int, 0, 0, 256, "denoise sub-blocks of this size left to right (0 = off)"),
)


class LogitsSource(Protocol):
    """Where a block state's logits come from; holds its own per-request data (caches, counters)."""

    def logits(self, req: Request, rt: Runtime, block: BlockState) -> Generator[Ask | BranchAsk, Any, Scores]:
        """The rows [B] of the block's current state (asking for the forwards that need)."""
        ...

    def block_done(self) -> None:
        """The block was refreshed: the prefix changed, forget what depended on it."""
        ...

    def annotate(self, view: RoundEvent) -> None:
        """Add this round's facts of the source (branches, folds, cache hits) to the trace view."""
        ...

    def metrics(self) -> dict[str, Any]:
        ...


@dataclass
class BlockState:
    """The request's open block (start = -1 between blocks) and the source of its logits."""
    source: LogitsSource
    start: int = -1
    tokens: list[int] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.start >= 0


class Dense:
    """One read-only `block` forward per block state (block_diffusion's denoise pass)."""

    def logits(self, req: Request, rt: Runtime, block: BlockState) -> Generator[Ask, Any, Scores]:
        return (yield block_logits(req, rt, block.tokens, block.start, "denoise"))

    def block_done(self) -> None:
        pass

    def annotate(self, view: RoundEvent) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        return {}


def check_block_params(params: dict, rt: Runtime) -> None:
    if params["block_size"] > rt.context:
        raise ParamError(f"block_size {params['block_size']} exceeds the context {rt.context}")
    if params.get("sub_block", 0) and params["block_size"] % params["sub_block"]:
        raise ParamError(f"sub_block {params['sub_block']} must divide block_size {params['block_size']}")


def block_size(req: Request) -> int:
    """The block size this round uses: the scheduler's tier when tiers are set, else the request's own."""
    return req.block_size or req.params["block_size"]


def candidates(block: list[int], mask_id: int, sub_block: int) -> list[int]:
    """Masked positions (1..B-1) eligible this pass: all, or those of the first unfinished sub-block."""
    masked = [i for i in range(1, len(block)) if block[i] == mask_id]
    if not sub_block or not masked:
        return masked
    first = masked[0] // sub_block
    return [i for i in masked if i // sub_block == first]


def unmask_step(block: list[int], guess: list[int], conf: list[float], eligible: list[int],
                threshold: float) -> list[int]:
    """Fill the most confident eligible position and every eligible one with conf >= threshold."""
    best = max(eligible, key=lambda i: conf[i])
    chosen = sorted({best} | {i for i in eligible if conf[i] >= threshold})
    for i in chosen:
        block[i] = guess[i]
    return chosen


def block_logits(req: Request, rt: Runtime, block: list[int], start: int, kind: str, lora: bool = False) -> Ask:
    """The ask for one read-only `block`-attention forward of a block state (answered with its rows [B])."""
    return rt.ask(req, block, start, "block", kind=kind, lora=lora)


def guesses(block: Scores) -> tuple[list[int], list[float]]:
    """Per block position i >= 1 the guessed token (from row i-1, drawn at the request's temperature) and its
    confidence under the T = 1 softmax."""
    ids, conf = block.rows(slice(0, -1)).pick_with_confidence()
    return [0] + ids, [0.0] + conf


def visible_end(block: list[int], eos_id: int | None, need: int) -> int:
    """Last block index that can ever be emitted: the first EOS, or the `need`-th generated position."""
    eos = block.index(eos_id, 1) if eos_id in block[1:] else len(block) - 1
    return min(eos, need)


def finished_prefix(block: list[int], mask_id: int, eos_id: int | None, need: int) -> int | None:
    """Length of block[1:] that can be emitted now if the run can stop inside this block, else None:
    an EOS with no mask before it, or the first `need` positions all filled."""
    for i in range(1, len(block)):
        if block[i] == mask_id:
            return None
        if block[i] == eos_id or i >= need:
            return i
    return None


def denoise_round(req: Request, rt: Runtime, st: BlockState) -> Round:
    """One denoise step of the open block (opening one on the last emitted token if none is open)."""
    if not st.active:
        st.start, st.tokens = req.cached, [req.tokens[-1]] + [rt.mask] * (block_size(req) - 1)
    block, before = st.tokens, list(st.tokens)
    guess, conf = guesses((yield from st.source.logits(req, rt, st)))
    chosen = unmask_step(block, guess, conf, candidates(block, rt.mask, req.params["sub_block"]),
                         req.params["threshold"])
    need = req.params["max_new_tokens"] - len(req.generated)
    accepted = sum(i <= visible_end(block, req.eos_id, need) for i in chosen)
    view = denoise_view(req, rt, st, before, guess, conf, chosen) if req.tracer.enabled else None
    stop_at = finished_prefix(block, rt.mask, req.eos_id, need)
    if stop_at is None and rt.mask in block:
        return RoundResult([], accepted, view=view)
    return (yield from refresh(req, rt, st, accepted, view, stop_at))


def refresh(req: Request, rt: Runtime, st: BlockState, accepted: int, view: RoundEvent | None,
            stop_at: int | None) -> Round:
    """Causal pass over the whole block: writes its KV and yields the next seed. When the run stops inside
    the block (`stop_at` = last emitted index) the pass still runs and counts, as in the reference; the KV
    past the emitted tokens is trimmed."""
    positions = list(range(st.start, st.start + len(st.tokens)))
    slots = rt.alloc(req, positions)
    rows = yield rt.ask(req, st.tokens, st.start, "causal", kind="refresh", write=slots, kv_op="refresh")
    tokens = st.tokens
    st.source.block_done()
    st.start, st.tokens = -1, []
    if stop_at is not None:
        keep = stop_at + 1
        trim = SlotRelease(slots[keep:], positions[keep:], "trim")
        return RoundResult(tokens[1:keep], accepted, commit=slots[:keep], free=[trim], view=view)
    (seed,) = rows.rows(slice(-1, None)).tokens()
    if view is not None:
        view.tokens.append(seed)
        view.states.append("bonus")
        if view.conf is not None:
            view.conf.append(None)
    return RoundResult(tokens[1:] + [seed], accepted + 1, commit=slots, view=view)


def denoise_view(req: Request, rt: Runtime, st: BlockState, before: list[int], guess: list[int],
                 conf: list[float], chosen: list[int]) -> RoundEvent:
    """The trace of one denoise step: committed / newly accepted / still masked positions, confidences of
    the positions that were masked, and the source's own facts."""
    states, shown_conf = [], []
    for i, tok in enumerate(st.tokens):
        if i == 0:
            states.append("committed")
        elif i in chosen:
            states.append("accepted")
        else:
            states.append("mask" if tok == rt.mask else "committed")
        shown_conf.append(conf[i] if i and before[i] == rt.mask else None)
    view = RoundEvent(st.start, list(st.tokens), states, shown_conf, block_size=len(st.tokens),
                      extra={"guess": guess[1:], "threshold": req.params["threshold"]})
    st.source.annotate(view)
    return view


def fill_block(req: Request, rt: Runtime, block: list[int], start: int, lora: bool,
               threshold: float) -> Generator[Ask, Any, list[float | None]]:
    """Draft every mask of `block` in place with read-only `block` forwards: one pass fills all masks at
    threshold 0, else each pass fills the most confident mask plus every one >= threshold. Returns the
    confidence each position was drafted with."""
    conf: list[float | None] = [None] * len(block)
    while rt.mask in block:
        guess, probs = guesses((yield block_logits(req, rt, block, start, "draft", lora)))
        for i in unmask_step(block, guess, probs, candidates(block, rt.mask, 0), threshold):
            conf[i] = probs[i]
    return conf


def chain_block(req: Request, rt: Runtime, block: list[int], start: int,
                lora: bool) -> Generator[Ask, Any, list[float | None]]:
    """Draft every mask of `block` in place with one read-only `block` forward: position 1 from the seed's row,
    the rest as one chain after it through the sampler head (Runtime.drafts). Returns the confidence each
    position was drafted with (the chain's: under its re-ranked rows)."""
    rows = yield block_logits(req, rt, block, start, "draft", lora)
    (first,), (p_first,) = rows.rows(slice(0, 1)).pick_with_confidence()
    rest, ranked = rt.drafts(rows.rows(slice(1, len(block) - 1)), first)
    block[1:] = [first] + rest
    return [None, p_first] + confidence(ranked.logits, torch.tensor(rest), rt.mask).tolist()


def longest_match(verifier: list[int], drafts: list[int]) -> int:
    """How many drafts the verifier's tokens confirm, left to right (verifier[i] checks drafts[i])."""
    n = 0
    while n < len(drafts) and verifier[n] == drafts[n]:
        n += 1
    return n


class BlockMode(Mode):
    """A mode that decodes by this loop: one denoise pass a round, on logits from the mode's `source` (dense for
    block_diffusion; spiffy's and specfold's draft caches over their batched verifies)."""
    params = BLOCK_PARAMS

    def check(self, params: dict, rt: Runtime) -> None:
        check_block_params(params, rt)

    def source(self, req: Request, rt: Runtime) -> LogitsSource:
        """Where this mode's block states get their logits."""
        return Dense()

    def start(self, req: Request, rt: Runtime) -> BlockState:
        return BlockState(self.source(req, rt))

    def round(self, req: Request, rt: Runtime) -> Round:
        return (yield from denoise_round(req, rt, req.state))

    def metrics(self, req: Request) -> dict:
        return req.state.source.metrics() if isinstance(req.state, BlockState) else {}
