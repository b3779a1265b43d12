"""`block_diffusion`: Nemotron `generate` / Fast-dLLM v2 block decoding.

A block [seed, M, ..., M] of B positions is denoised in `block` attention against the read-only prefix KV.
Each denoise pass commits the most confident masked position plus every masked position whose confidence is
>= threshold (within the current sub-block, if sub-blocks are on). When no mask is left, one `causal` refresh
pass writes the block's KV and its last logits give the next seed. One round = one denoise pass (the
refresh joins the pass that completes the block). NFE = denoise passes + refresh passes; prefill not counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from backend.engine.modes import register
from backend.engine.modes.base import Mode, RoundResult, RoundView
from backend.engine.params import Param, ParamError
from backend.engine.request import Request
from backend.engine.runtime import Runtime

BLOCK_PARAMS: tuple[Param, ...] = (
    Param("block_size", int, 32, 2, 256, "positions per block, seed included"),
    Param("threshold", float, 0.9, 0.0, 1.0, "commit every masked position with confidence >= threshold"),
    Param("sub_block", int, 0, 0, 256, "denoise sub-blocks of this size left to right (0 = off)"),
)


@dataclass
class BlockState:
    start: int = -1                       # position of the seed
    tokens: list[int] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.start >= 0


def check_block_params(params: dict, rt: Runtime) -> None:
    if rt.mask_id is None:
        raise ParamError("this model has no mask token; block modes need one (mask_token_id)")
    if params["block_size"] > rt.context:
        raise ParamError(f"block_size {params['block_size']} exceeds the context {rt.context}")
    if params.get("sub_block", 0) and params["block_size"] % params["sub_block"]:
        raise ParamError(f"sub_block {params['sub_block']} must divide block_size {params['block_size']}")


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


def block_logits(req: Request, rt: Runtime, block: list[int], start: int, kind: str,
                 lora: bool = False) -> torch.Tensor:
    """Logits [B, V] of one read-only `block`-attention forward of a block state."""
    return rt.forward([req], torch.tensor([block]), [start], "block", kind=kind, lora=lora)[0]


def guesses(req: Request, rt: Runtime, logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """Per block position i >= 1 the guessed token (from logits[i-1]) and its probability."""
    ids, probs = rt.pick(req, logits[:-1])
    return [0] + ids.tolist(), [0.0] + probs.tolist()


def denoise(req: Request, rt: Runtime, block: list[int], start: int, kind: str,
            lora: bool = False) -> tuple[list[int], list[float]]:
    """One read-only `block` forward: per position i >= 1, the guess for i and its probability."""
    return guesses(req, rt, block_logits(req, rt, block, start, kind, lora))


def finished_prefix(block: list[int], mask_id: int, eos_id: int | None, need: int) -> int | None:
    """Length of block[1:] that can be emitted now if the run can stop inside this block, else None:
    an EOS with no mask before it, or the first `need` positions all filled."""
    for i in range(1, len(block)):
        if block[i] == mask_id:
            return None
        if block[i] == eos_id or i >= need:
            return i
    return None


@register
class BlockDiffusion(Mode):
    name = "block_diffusion"
    summary = "block diffusion: confidence-threshold denoising in blocks, causal refresh per block"
    nfe_note = "denoise passes + one refresh pass per block; prefill not counted"
    params = BLOCK_PARAMS

    def check(self, params: dict, rt: Runtime) -> None:
        check_block_params(params, rt)

    def start(self, req: Request, rt: Runtime) -> None:
        req.state = BlockState()

    def round(self, req: Request, rt: Runtime) -> RoundResult:
        st: BlockState = req.state
        size = req.block_size or req.params["block_size"]
        if not st.active:
            st.start, st.tokens = req.cached, [req.tokens[-1]] + [rt.mask] * (size - 1)
        block = st.tokens
        before = list(block)
        guess, conf = guesses(req, rt, self.denoise_logits(req, rt, st))
        chosen = unmask_step(block, guess, conf,
                             candidates(block, rt.mask, req.params["sub_block"]), req.params["threshold"])
        need = req.params["max_new_tokens"] - len(req.generated)
        stop_at = finished_prefix(block, rt.mask, req.eos_id, need)
        view = self._view(req, rt, before, block, guess, conf, chosen) if req.tracer.enabled else None
        if stop_at is not None:
            st.start = -1
            return RoundResult(block[1:stop_at + 1], len(chosen), view=view)
        if rt.mask in block:
            return RoundResult([], len(chosen), view=view)
        return self._refresh(req, rt, st, len(chosen), view)

    def denoise_logits(self, req: Request, rt: Runtime, st: BlockState) -> torch.Tensor:
        """Logits of the current block state; multi-branch modes override this (cache, batched verify)."""
        return block_logits(req, rt, st.tokens, st.start, "denoise")

    def _refresh(self, req: Request, rt: Runtime, st: BlockState, accepted: int,
                 view: RoundView | None) -> RoundResult:
        """Causal pass over the full block: writes its KV and yields the next seed."""
        positions = list(range(st.start, st.start + len(st.tokens)))
        slots = rt.alloc(req, positions)
        logits = rt.forward([req], torch.tensor([st.tokens]), [st.start], "causal", kind="refresh",
                            write=[slots], kv_op="refresh")
        seed = int(rt.pick(req, logits[0, -1])[0])
        emitted = st.tokens[1:] + [seed]
        if view is not None:
            view.tokens.append(seed)
            view.states.append("bonus")
            if view.conf is not None:
                view.conf.append(None)
        st.start = -1
        return RoundResult(emitted, accepted + 1, commit=slots, view=view)

    @staticmethod
    def _view(req: Request, rt: Runtime, before: list[int], block: list[int], guess: list[int],
              conf: list[float], chosen: list[int]) -> RoundView:
        states, shown_conf = [], []
        for i, tok in enumerate(block):
            if i == 0:
                states.append("committed")
            elif i in chosen:
                states.append("accepted")
            else:
                states.append("mask" if tok == rt.mask else "committed")
            shown_conf.append(conf[i] if i and before[i] == rt.mask else None)
        return RoundView(req.state.start, list(block), states, shown_conf,
                         extra={"guess": guess[1:], "threshold": req.params["threshold"]})
