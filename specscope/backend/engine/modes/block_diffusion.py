"""`block_diffusion`: Nemotron `generate` / Fast-dLLM v2 block decoding (the block loop of
backend/engine/blocks.py with dense logits).

One round = one denoise pass of the open block in `block` attention (prefix KV read-only): commit the most
confident masked position plus every one with confidence >= threshold. The pass that completes the block, or
lets the run stop inside it, is followed by the block's `causal` refresh. NFE = denoise passes + one refresh
per block started, the last one included (as the reference counts); prefill not counted.
"""
from __future__ import annotations

from specscope.backend.engine.blocks import BlockMode
from specscope.backend.engine.modes import register


@register
class BlockDiffusion(BlockMode):
    name = "block_diffusion"
    color = "#f59e0b"
    picked = {"compare": 1, "race": 3}
    summary = "block diffusion: confidence-threshold denoising in blocks, causal refresh per block"
    nfe_note = "denoise passes + one refresh pass per block (the last one too); prefill not counted"
    explain = ("A block of masks is denoised in several rounds: every round unmasks (accepts) the positions "
               "whose confidence passes τ (at least one); the block is committed once no mask is left.")
