"""Which backend runs a runtime's forwards (`--forward`): the fused CPU step or the batch-invariant torch forward.
Both take a ragged plan of several requests' row groups, and in both a row's numbers never depend on the rows beside
it; they are not each other's numbers, so runs record the one they ran on."""
from __future__ import annotations

from specscope.backend.forward.fused_step import AUTO, FusedDecode, MatmulUnavailable, fused_decode, supported
from specscope.backend.forward.invariant import InvariantForward
from specscope.backend.forward.plan import ForwardBackend
from specscope.backend.model.transformer import PagedKV, Transformer
from specscope.kernels.native import ENABLED

FORWARDS = ("auto", "fused", "torch")
"""auto: the fused step where it takes the model (float32 on the CPU, a C compiler), else torch."""


class ForwardUnavailable(ValueError):
    """The asked-for forward backend cannot run this model here (the message says why)."""


def forward_backend(model: Transformer, cache: PagedKV, fallback: ForwardBackend, matmul: str,
                    forward: str = "auto") -> tuple[str, FusedDecode | InvariantForward]:
    """The forward backend `forward` (FORWARDS) names, and its name as runs record it ("fused" or "torch"). The
    fused step runs plans it cannot take on `fallback`; `matmul` is its precision (MATMULS or AUTO), which the torch
    forward has no choice of (it computes in the weights' dtype): asked for there, MatmulUnavailable."""
    if forward not in FORWARDS:
        raise ForwardUnavailable(f"--forward {forward}: expected one of {FORWARDS}")
    if forward == "torch":
        if matmul not in (AUTO, "float32"):
            raise MatmulUnavailable(f"--matmul {matmul} is the fused CPU step's; --forward torch computes in the "
                                    "weights' dtype (leave --matmul at auto)")
        return "torch", InvariantForward(model)
    fused = fused_decode(model, cache, fallback, matmul)
    if fused is not None:
        return "fused", fused
    if forward == "fused":
        why = supported(model, cache) or ("SPECSCOPE_FUSED_DECODE=0" if not ENABLED else "no C compiler")
        raise ForwardUnavailable(f"--forward fused: {why}")
    return "torch", InvariantForward(model)
