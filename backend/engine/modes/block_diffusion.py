"""`block_diffusion`: Nemotron `generate` / Fast-dLLM v2 block decoding (the block loop of
backend/engine/blocks.py with dense logits).

One round = one denoise pass of the open block in `block` attention (prefix KV read-only): commit the most
confident masked position plus every one with confidence >= threshold. The pass that completes the block, or
lets the run stop inside it, is followed by the block's `causal` refresh. NFE = denoise passes + one refresh
per block started, the last one included (as the reference counts); prefill not counted.
"""
from __future__ import annotations

from backend.engine.blocks import BLOCK_PARAMS, BlockState, Dense, LogitsSource, check_block_params, denoise_round
from backend.engine.modes import register
from backend.engine.modes.base import Mode, RoundResult
from backend.engine.request import Request
from backend.engine.runtime import Runtime


@register
class BlockDiffusion(Mode):
    name = "block_diffusion"
    summary = "block diffusion: confidence-threshold denoising in blocks, causal refresh per block"
    nfe_note = "denoise passes + one refresh pass per block (the last one too); prefill not counted"
    explain = ("A block of masks is denoised in several rounds: every round unmasks (accepts) the positions "
               "whose confidence passes τ (at least one); the block is committed once no mask is left.")
    params = BLOCK_PARAMS

    def check(self, params: dict, rt: Runtime) -> None:
        check_block_params(params, rt)

    def source(self, req: Request, rt: Runtime) -> LogitsSource:
        """Where this mode's block states get their logits."""
        return Dense()

    def start(self, req: Request, rt: Runtime) -> BlockState:
        return BlockState(self.source(req, rt))

    def round(self, req: Request, rt: Runtime) -> RoundResult:
        return denoise_round(req, rt, req.state)

    def metrics(self, req: Request) -> dict:
        return req.state.source.metrics() if isinstance(req.state, BlockState) else {}
