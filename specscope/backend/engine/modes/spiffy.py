"""`spiffy`: lossless multi-branch speculation over block_diffusion's own policy (Spiffy, calibrated graph).

The block loop is block_diffusion's (`BlockMode`, backend/engine/blocks.py); only the source of a block state's
logits changes (`DraftCache`).
If the current state S_t is in the request's draft-logit cache its logits are reused: no forward, 0 NFE (a
cache hit). Otherwise one batched read-only `block` forward verifies [S_t + B drafts]: the calibrated draft
graph's nodes expanded on S_t with the ranks of the freshest logits (those of S_{t-1}); each draft's logits
are cached under its exact state and the main row's are used. The logits of a state are a pure function of
(prefix, state), so the output equals block_diffusion's token for token, up to the last bits of batched
against single-row arithmetic. The cache keeps only states the block can still reach and is cleared at block
end (the refresh changes the prefix). A block's first state has no freshest logits and is denoised alone.
The graph is `draft_graph.json` beside the weights or the adapter it was calibrated with (`specscope calibrate`).
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from specscope.backend.engine.ask import BranchAsk
from specscope.backend.engine.blocks import BLOCK_PARAMS, BlockMode, BlockState, candidates
from specscope.backend.engine.draft_graph import (
    CALIBRATE_HINT,
    GRAPH_FILE,
    GraphError,
    Node,
    Ranking,
    State,
    expand,
    load_graph,
)
from specscope.backend.engine.modes import register
from specscope.backend.engine.params import Param, ParamError
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.scores import Scores
from specscope.backend.engine.spec_counts import DraftStep
from specscope.backend.tracing import RoundEvent


class BatchVerify(Protocol):
    """One batched read-only forward of R block states of one request (row 0 = main, parents[r] < r)."""

    def __call__(self, req: Request, rt: Runtime, start: int, states: list[State],
                 parents: list[int]) -> Generator[BranchAsk, Any, list[Scores]]:
        """The rows of each state (asking for the forward)."""
        ...

    def annotate(self, view: RoundEvent) -> None:
        """Add the last forward's facts to the round's trace view."""
        ...

    def metrics(self) -> dict[str, Any]:
        ...


class DenseVerify:
    """The dense batched forward: every row computed in full."""

    def __call__(self, req: Request, rt: Runtime, start: int, states: list[State],
                 parents: list[int]) -> Generator[BranchAsk, Any, list[Scores]]:
        return (yield BranchAsk(req, states, start))

    def annotate(self, view: RoundEvent) -> None:
        pass

    def metrics(self) -> dict[str, Any]:
        return {}


@dataclass
class Branch:
    """A verified draft branch waiting in the cache: its rows and where it came from (for the trace)."""
    scores: Scores
    row: int             # row in its verify batch (0 = main)
    parent: int          # parent row
    node: int            # graph node id
    round: int           # round of the verify forward


def reachable(draft: State, main: State, mask_id: int) -> bool:
    """Whether the main trajectory can still reach `draft`: it only fills masks of `main`."""
    return draft != main and all(m == mask_id or d == m for d, m in zip(draft, main, strict=True))


@dataclass
class DraftCache:
    """Spiffy's logits source: cached draft logits by exact block state, else one batched verify."""
    nodes: tuple[Node, ...]
    verify: BatchVerify = field(default_factory=DenseVerify)
    cache: dict[State, Branch] = field(default_factory=dict)
    fresh: Scores | None = None           # the rows of the previous main state of this block
    verified: bool = False                # this round ran a verify forward
    hits: int = 0
    verifies: int = 0
    drafts: int = 0
    trace: list[dict[str, Any]] = field(default_factory=list)   # this round's branches
    steps: dict[int, DraftStep] = field(default_factory=dict)   # this block's drafts by their verify's round

    def logits(self, req: Request, rt: Runtime, block: BlockState) -> Generator[BranchAsk, Any, Scores]:
        main = tuple(block.tokens)
        hit = self.cache.pop(main, None)
        self.verified = hit is None
        if hit is None:
            scores = yield from self._verify(req, rt, block, main)
        else:
            self.hits += 1
            self.steps[hit.round].accepted += 1    # the next position of that verify's draft
            scores = hit.scores
            if req.tracer.enabled:
                self.trace = [{"id": hit.row, "parent": hit.parent, "node": hit.node, "tokens": list(main),
                               "cache_hit": True, "verified_round": hit.round}]
        self.cache = {s: b for s, b in self.cache.items() if reachable(s, main, rt.mask)}
        self.fresh = scores
        return scores

    def _drafts(self, req: Request, rt: Runtime, main: State) -> tuple[list[State], list[int], list[int]]:
        """Rows [main + drafts], their parent rows and graph nodes (drafts need the freshest logits)."""
        rows, parents, nodes = [main], [-1], [-1]
        if self.fresh is None:
            return rows, parents, nodes
        ranking = Ranking.of(self.fresh, max(n.vocab_rank for n in self.nodes) + 1)
        states = expand(self.nodes, main, ranking, lambda b: candidates(b, rt.mask, req.params["sub_block"]))
        row_of = {main: 0}
        for node, state in zip(self.nodes, states, strict=True):
            if state is None or state in row_of or rt.mask not in state:
                continue   # nothing to fill, a duplicate, or a full block (refreshed, never denoised)
            parent = main if node.parent < 0 else states[node.parent]
            row_of[state] = len(rows)
            parents.append(row_of[cast(State, parent)])   # a valid node's parent is valid
            rows.append(state)
            nodes.append(node.id)
        return rows, parents, nodes

    def _verify(self, req: Request, rt: Runtime, block: BlockState, main: State) -> Generator[BranchAsk, Any, Scores]:
        rows, parents, nodes = self._drafts(req, rt, main)
        scores = yield from self.verify(req, rt, block.start, rows, parents)
        self.verifies += 1
        self.drafts += len(rows) - 1
        if len(rows) > 1:
            self.steps[req.round] = DraftStep(len(rows) - 1, len(rows) - 1)
            req.draft_steps.append(self.steps[req.round])
        for r in range(1, len(rows)):
            self.cache[rows[r]] = Branch(scores[r], r, parents[r], nodes[r], req.round)
        if req.tracer.enabled:
            self.trace = [{"id": r, "parent": parents[r] if r else None, "node": nodes[r] if r else None,
                           "tokens": list(rows[r]), "cache_hit": False} for r in range(len(rows))]
        return scores[0]

    def block_done(self) -> None:
        self.cache.clear()
        self.steps.clear()
        self.fresh = None

    def annotate(self, view: RoundEvent) -> None:
        view.branches = self.trace
        view.extra["forwards_saved"] = self.hits
        if self.verified:
            self.verify.annotate(view)

    def metrics(self) -> dict[str, Any]:
        own = {"cache_hits": self.hits, "forwards_saved": self.hits, "verify_forwards": self.verifies,
               "drafts_verified": self.drafts, "draft_hit_rate": self.hits / self.drafts if self.drafts else None}
        return {**own, **self.verify.metrics()}


def graph_nodes(rt: Runtime, branches: int, mode: str) -> tuple[Node, ...]:
    """The first `branches` nodes of the checkpoint's draft graph; ParamError saying how to calibrate."""
    path = rt.loaded.shipped_file(GRAPH_FILE)   # beside the weights, else with the adapter it was calibrated on
    if path is None:
        raise ParamError(f"{mode} needs a calibrated draft graph ({GRAPH_FILE} beside the weights or the adapter): "
                         f"{CALIBRATE_HINT}")
    try:
        graph = load_graph(path)
    except GraphError as e:
        raise ParamError(f"{mode} needs a calibrated draft graph: {e}") from None
    vocab = rt.model.cfg.vocab_size
    if graph.max_vocab_rank >= vocab - 1:
        raise ParamError(f"draft graph vocab_rank {graph.max_vocab_rank} is out of range for vocab {vocab}")
    return graph.nodes[:branches]


@register
class Spiffy(BlockMode):
    name = "spiffy"
    summary = "Spiffy: block_diffusion + calibrated draft graph verified in one batched pass, draft-logit cache"
    nfe_note = "forwards run (cache hits cost none) + one refresh pass per block; prefill not counted"
    explain = ("Block diffusion with drafted future states: a verify forward denoises the main state and every "
               "drafted branch at once; when the next main state equals a drafted branch it is a cache hit and "
               "that round costs no forward (forwards saved). Accepted = unmasked this round.")
    color = "#10b981"
    lossless_vs = "block_diffusion"
    drafter = ("forwards_saved", 0.25)
    params = BLOCK_PARAMS + (Param("branches", int, 7, 1, 16, "draft branches per verify (graph nodes used)"),)

    def check(self, params: dict, rt: Runtime) -> None:
        super().check(params, rt)
        graph_nodes(rt, params["branches"], self.name)

    def source(self, req: Request, rt: Runtime) -> DraftCache:
        return DraftCache(graph_nodes(rt, req.params["branches"], self.name), self.batch_verify(req, rt))

    def batch_verify(self, req: Request, rt: Runtime) -> BatchVerify:
        """How the main state and its drafts are verified together: the dense batched forward."""
        return DenseVerify()
