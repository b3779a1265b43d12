"""`specfold`: spiffy with the batched verification folded across branches (SpecFold).

Same drafts, graph, draft-logit cache and block loop as `spiffy`; only the verify forward changes. Per layer,
draft branch and position, the relative residual of the layer input against the parent branch gates the
work: ρ ≤ δ folds the position (its q/k/v, attention state and FFN output come from the nearest ancestor that
recomputed it, the attention corrected exactly for the keys this branch changed); residual streams are never
folded. `ffn_gate=paper` (default): that one gate also decides FFN reuse, as in the paper. `ffn_gate=strict`
adds a second gate on the post-attention stream for the FFN; only then does δ = 0 give the dense logits and
spiffy's output. A verify of the main state alone runs the dense forward. NFE as spiffy.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from specscope.backend.engine.ask import BranchAsk
from specscope.backend.engine.draft_graph import State
from specscope.backend.engine.modes import register
from specscope.backend.engine.modes.base import Column
from specscope.backend.engine.modes.spiffy import BatchVerify, DenseVerify, Spiffy
from specscope.backend.engine.params import Param
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.scores import Scores
from specscope.backend.forward.folded import FOLD_BACKENDS
from specscope.backend.forward.plan import Fold
from specscope.backend.tracing import RoundEvent
from specscope.kernels.gate import FFN_GATES


@dataclass
class FoldedVerify:
    """SpecFold's batched verify: the folded forward, with its fold counts for the trace and metrics."""
    delta: float
    ffn_gate: str
    backend: str
    recomputed: list[list[int]] | None = None       # last forward: per layer x row, QKV recomputed positions
    ffn_recomputed: list[list[int]] | None = None   # the same for the FFN
    folded: list[int] | None = None                 # draft (layer, position) rows folded: [QKV, FFN]
    draft_rows: int = 0                             # draft (layer, position) rows gated, per kind

    def __call__(self, req: Request, rt: Runtime, start: int, states: list[State],
                 parents: list[int]) -> Generator[BranchAsk, Any, list[Scores]]:
        r, n = len(states), len(states[0])
        if r == 1:
            self.recomputed = self.ffn_recomputed = None
            return (yield from DenseVerify()(req, rt, start, states, parents))
        fold = Fold(tuple(parents), self.delta, self.ffn_gate)
        scores, counts = yield BranchAsk(req, states, start, fold, self.backend)
        self.recomputed, self.ffn_recomputed = counts.qkv, counts.ffn
        rows = (r - 1) * n * len(counts.qkv)
        self.draft_rows += rows
        self.folded = [a + rows - drafted(c) for a, c in zip(self.folded or [0, 0], (counts.qkv, counts.ffn),
                                                                strict=True)]
        return scores

    def annotate(self, view: RoundEvent) -> None:
        if self.recomputed is None or self.ffn_recomputed is None:
            return
        rows = (len(self.recomputed[0]) - 1) * len(view.tokens) * len(self.recomputed)
        view.fold = self.recomputed
        view.extra["fold_ffn"] = self.ffn_recomputed
        view.extra["fold_ratio_qkv"] = 1 - drafted(self.recomputed) / rows if rows else None
        view.extra["fold_ratio_ffn"] = 1 - drafted(self.ffn_recomputed) / rows if rows else None

    def metrics(self) -> dict[str, Any]:
        if not self.draft_rows or self.folded is None:
            return {"fold_ratio": None, "fold_ratio_qkv": None, "fold_ratio_ffn": None}
        qkv, ffn = (f / self.draft_rows for f in self.folded)
        return {"fold_ratio": (qkv + ffn) / 2, "fold_ratio_qkv": qkv, "fold_ratio_ffn": ffn}


def drafted(counts: list[list[int]]) -> int:
    """Recomputed draft positions summed over layers (row 0, the main branch, always recomputes)."""
    return sum(sum(layer[1:]) for layer in counts)


@register
class SpecFold(Spiffy):
    name = "specfold"
    summary = "SpecFold: spiffy's drafts verified by a folded batched pass (parent-residual gate per position)"
    explain = ("spiffy whose verify forward folds work across branches: per layer and position, a branch whose "
               "input is within δ of its parent's reuses the parent's Q/K/V and FFN output. Fold ratio = share "
               "of draft rows not recomputed (QKV and FFN).")
    color = "#8b5cf6"
    lossless_vs = "spiffy"
    lossless_params = {"delta": 0.0, "ffn_gate": "strict"}
    columns = (Column("fold_ratio", "fold ratio", "share of the draft rows of a verify forward that folding did not "
                                                  "recompute (QKV and FFN, averaged)", "%"),)
    drafter = ("fold_ratio", 0.3)
    verify_matmul = "float32"    # the folded verify's ops (backend/forward/folded.py) are float32 only
    params = Spiffy.params + (
        Param("delta", float, 0.1, 0.0, 1.0,
              "fold a position when its relative residual to the parent branch is <= delta"),
        Param("ffn_gate", str, "paper", help="paper: the layer-input gate also decides FFN reuse; strict: a "
                                             "second gate on the post-attention stream (δ=0 == spiffy)",
              choices=FFN_GATES),
        Param("backend", str, "torch", help="torch: the PyTorch folded forward; triton: the kernels (their "
                                            "PyTorch twins off CUDA)", choices=FOLD_BACKENDS),
    )

    def batch_verify(self, req: Request, rt: Runtime) -> BatchVerify:
        p = req.params
        return FoldedVerify(p["delta"], p["ffn_gate"], p["backend"])
