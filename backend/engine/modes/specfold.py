"""`specfold`: spiffy with the batched verification folded across branches (SpecFold).

Same drafts, graph and draft-logit cache as `spiffy`; only the verify forward changes. Per layer, per
draft branch and position, the relative residual against the parent branch gates the work: ρ ≤ δ folds the
position (its q/k/v, attention state and FFN output come from the nearest ancestor that recomputed it, the
attention corrected exactly for the keys this branch changed); residual streams are never folded
(kernels/reference.py). ffn_gate=paper (default) lets that one gate cover the FFN too, as the paper does;
ffn_gate=strict gates the FFN again on its own input, and only strict at δ = 0 (bit-identical inputs only)
equals the dense forward, so the output equals spiffy's. A block's first state (no drafts) runs the dense
forward. NFE as spiffy. backend=torch runs the packed float32 PyTorch path (kernels/packed_forward.py);
backend=triton the kernel pipeline (kernels/folded_forward.py): Triton on CUDA, their PyTorch twins on CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from torch import Tensor

from backend.engine.modes import register
from backend.engine.modes.base import RoundView
from backend.engine.modes.block_diffusion import BlockState
from backend.engine.modes.spiffy import Spiffy, SpiffyState
from backend.engine.params import Param
from backend.engine.request import Request
from backend.engine.runtime import Runtime
from kernels.folded_forward import make_folded_forward
from kernels.gate import FFN_GATES
from kernels.reference import FoldedForward


@dataclass
class SpecFoldState(SpiffyState):
    folding: FoldedForward | None = None    # this round's folded forward (its recompute counts)
    folded: int = 0                          # draft (layer, position) rows folded, QKV + FFN
    draft_rows: int = 0                      # draft (layer, position) rows gated, QKV + FFN


@register
class SpecFold(Spiffy):
    name = "specfold"
    summary = "SpecFold: spiffy's drafts verified by a folded batched pass (parent-residual gate per position)"
    lossless_vs = "spiffy"
    params = Spiffy.params + (
        Param("delta", float, 0.1, 0.0, 1.0,
              "fold a position when its relative residual to the parent branch is <= delta"),
        Param("backend", str, "torch", help="torch: packed float32 PyTorch; triton: the kernels (their PyTorch "
                                            "twins off CUDA)", choices=("torch", "triton")),
        Param("ffn_gate", str, "paper", help="paper: the layer-input gate also reuses FFN outputs; strict: a "
                                             "second gate on the FFN input (δ=0 then equals spiffy)",
              choices=FFN_GATES),
    )

    def start(self, req: Request, rt: Runtime) -> None:
        req.state = SpecFoldState()

    def metrics(self, req: Request) -> dict:
        st = req.state
        if not isinstance(st, SpecFoldState):
            return {}
        return {**super().metrics(req), "fold_ratio": st.folded / st.draft_rows if st.draft_rows else None}

    def denoise_logits(self, req: Request, rt: Runtime, st: BlockState) -> Tensor:
        cast(SpecFoldState, st).folding = None
        return super().denoise_logits(req, rt, st)

    def verify_forward(self, req: Request, rt: Runtime, st: SpiffyState, ids: Tensor,
                       parents: list[int]) -> Tensor:
        st = cast(SpecFoldState, st)
        r = ids.shape[0]
        if r == 1:
            return super().verify_forward(req, rt, st, ids, parents)
        folded = make_folded_forward(rt.model, parents, req.params["delta"], ffn_gate=req.params["ffn_gate"],
                                     backend=req.params["backend"])
        logits = rt.forward([req] * r, ids, [st.start] * r, "block", kind="verify", model=folded)
        st.folding = folded
        for counts in (folded.recomputed, folded.ffn_recomputed):
            computed = sum(sum(layer[1:]) for layer in counts)
            st.draft_rows += (r - 1) * ids.shape[1] * len(counts)
            st.folded += (r - 1) * ids.shape[1] * len(counts) - computed
        return logits

    @staticmethod
    def _view(req: Request, rt: Runtime, before: list[int], block: list[int], guess: list[int],
              conf: list[float], chosen: list[int]) -> RoundView:
        view = Spiffy._view(req, rt, before, block, guess, conf, chosen)
        st: SpecFoldState = req.state
        if st.folding is not None:
            view.fold = st.folding.recomputed
            view.extra["fold_ffn"] = st.folding.ffn_recomputed
        return view
