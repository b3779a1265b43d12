"""`spiffy`: lossless multi-branch speculation over block_diffusion's own policy (Spiffy, calibrated graph).

Every round needs the logits of the current block state S_t. If S_t is in the request's draft-logit cache
they are reused: no forward, 0 NFE (a cache hit). Otherwise one batched read-only `block` forward verifies
[S_t + B drafts]: the calibrated draft graph's nodes expanded on S_t with the ranks of the freshest logits
(those of S_{t-1}); each draft's logits are cached under its exact state and the main row's are used.
Candidates, unmask step, stop rule and refresh are block_diffusion's, and the logits of a state are a pure
function of (prefix, state), so the output equals block_diffusion's token for token, up to the last bits of
batched against single-row arithmetic. The cache keeps only states the block can still reach and is
cleared at block end (the refresh changes the prefix). A block's first state has no freshest logits and is
denoised alone. The graph is `draft_graph.json` in the checkpoint folder (`specscope calibrate`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from backend.engine.draft_graph import GRAPH_FILE, GraphError, Node, Ranking, State, expand, load_graph
from backend.engine.modes import register
from backend.engine.modes.base import RoundResult, RoundView
from backend.engine.modes.block_diffusion import BLOCK_PARAMS, BlockDiffusion, BlockState, candidates
from backend.engine.params import Param, ParamError
from backend.engine.request import Request
from backend.engine.runtime import Runtime


@dataclass
class Branch:
    """A verified draft branch waiting in the cache: its logits and where it came from (for the trace)."""
    logits: Tensor
    row: int             # row in its verify batch (0 = main)
    parent: int          # parent row
    node: int            # graph node id
    round: int           # round of the verify forward


@dataclass
class SpiffyState(BlockState):
    cache: dict[State, Branch] = field(default_factory=dict)
    cache_start: int = -1                 # block the cache belongs to
    fresh: Tensor | None = None           # logits of the previous main state of this block
    hits: int = 0
    verifies: int = 0
    drafts: int = 0
    trace: list[dict[str, Any]] = field(default_factory=list)   # this round's branches


def reachable(draft: State, main: State, mask_id: int) -> bool:
    """Whether the main trajectory can still reach `draft`: it only fills masks of `main`."""
    return draft != main and all(m == mask_id or d == m for d, m in zip(draft, main, strict=True))


def graph_nodes(rt: Runtime, branches: int, mode: str) -> tuple[Node, ...]:
    """The first `branches` nodes of the checkpoint's draft graph; ParamError saying how to calibrate."""
    if rt.loaded.folder is None:
        raise ParamError(f"{mode} needs a draft graph, but this model was not loaded from a folder")
    try:
        graph = load_graph(rt.loaded.folder / GRAPH_FILE)
    except GraphError as e:
        raise ParamError(f"{mode} needs a calibrated draft graph: {e}") from None
    vocab = rt.model.cfg.vocab_size
    if graph.max_vocab_rank >= vocab - 1:
        raise ParamError(f"draft graph vocab_rank {graph.max_vocab_rank} is out of range for vocab {vocab}")
    return graph.nodes[:branches]


@register
class Spiffy(BlockDiffusion):
    name = "spiffy"
    summary = "Spiffy: block_diffusion + calibrated draft graph verified in one batched pass, draft-logit cache"
    nfe_note = "forwards run (cache hits cost none) + one refresh pass per block; prefill not counted"
    lossless_vs = "block_diffusion"
    params = BLOCK_PARAMS + (Param("branches", int, 7, 1, 16, "draft branches per verify (graph nodes used)"),)

    def __init__(self) -> None:
        self.nodes: tuple[Node, ...] = ()

    def check(self, params: dict, rt: Runtime) -> None:
        super().check(params, rt)
        self.nodes = graph_nodes(rt, params["branches"], self.name)

    def start(self, req: Request, rt: Runtime) -> None:
        req.state = SpiffyState()

    def metrics(self, req: Request) -> dict:
        st = req.state
        if not isinstance(st, SpiffyState):
            return {}
        return {"cache_hits": st.hits, "forwards_saved": st.hits, "verify_forwards": st.verifies,
                "drafts_verified": st.drafts, "draft_hit_rate": st.hits / st.drafts if st.drafts else None}

    def denoise_logits(self, req: Request, rt: Runtime, st: BlockState) -> Tensor:
        """Cached logits of the current state if a draft predicted it, else one batched verify forward."""
        st = cast(SpiffyState, st)
        if st.cache_start != st.start:
            self._clear(st)
            st.cache_start = st.start
        main = tuple(st.tokens)
        hit = st.cache.pop(main, None)
        if hit is None:
            logits = self._verify(req, rt, st, main)
        else:
            st.hits += 1
            logits = hit.logits
            if req.tracer.enabled:
                st.trace = [{"id": hit.row, "parent": hit.parent, "node": hit.node, "tokens": list(main),
                             "cache_hit": True, "verified_round": hit.round}]
        st.cache = {s: b for s, b in st.cache.items() if reachable(s, main, rt.mask)}
        st.fresh = logits
        return logits

    def _verify(self, req: Request, rt: Runtime, st: SpiffyState, main: State) -> Tensor:
        rows, parents, nodes = [main], [-1], [-1]
        if st.fresh is not None:
            ranking = Ranking.from_logits(st.fresh, rt.mask, max(n.vocab_rank for n in self.nodes) + 1)
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
        logits = self.verify_forward(req, rt, st, torch.tensor(rows), parents)
        st.verifies += 1
        st.drafts += len(rows) - 1
        for r in range(1, len(rows)):
            st.cache[rows[r]] = Branch(logits[r], r, parents[r], nodes[r], req.round)
        if req.tracer.enabled:
            st.trace = [{"id": r, "parent": parents[r] if r else None, "node": nodes[r] if r else None,
                         "tokens": list(rows[r]), "cache_hit": False} for r in range(len(rows))]
        return logits[0]

    def verify_forward(self, req: Request, rt: Runtime, st: SpiffyState, ids: Tensor,
                       parents: list[int]) -> Tensor:
        """Logits [R, N, V] of the rows (row 0 = main); the dense batched forward. SpecFold folds it."""
        r = ids.shape[0]
        return rt.forward([req] * r, ids, [st.start] * r, "block", kind="verify" if r > 1 else "denoise")

    @staticmethod
    def _clear(st: SpiffyState) -> None:
        st.cache.clear()
        st.fresh = None

    def _refresh(self, req: Request, rt: Runtime, st: BlockState, accepted: int,
                 view: RoundView | None) -> RoundResult:
        self._clear(cast(SpiffyState, st))
        return super()._refresh(req, rt, st, accepted, view)

    @staticmethod
    def _view(req: Request, rt: Runtime, before: list[int], block: list[int], guess: list[int],
              conf: list[float], chosen: list[int]) -> RoundView:
        view = BlockDiffusion._view(req, rt, before, block, guess, conf, chosen)
        view.branches = req.state.trace
        view.extra["forwards_saved"] = req.state.hits
        return view
