"""What a forward computes, apart from how: the runtime builds one `ForwardPlan` per forward and hands it to a
`ForwardBackend`, which owns a weight layout (made once, when the runtime is built) and runs plans on it."""
from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from specscope.backend.model.transformer import KVContext, Transformer, normed_hidden
from specscope.kernels.gate import FFN_GATES


@dataclass(frozen=True)
class Fold:
    """SpecFold's folding of a branched verify: the branch tree (parents[0] = -1, parents[i] < i, one row group
    each) and the gate (kernels.gate.FFN_GATES)."""
    parents: tuple[int, ...]
    delta: float
    ffn_gate: str = "paper"

    def __post_init__(self) -> None:
        if self.ffn_gate not in FFN_GATES:
            raise ValueError(f"ffn_gate {self.ffn_gate!r}: expected one of {FFN_GATES}")


@dataclass(frozen=True)
class ForwardPlan:
    """One forward: query rows `ids` [R, Q] at `positions` [R, Q]. `kv` holds each row group's prefix slots, the
    rows' write slots (None: read-only) and whether the groups share one request's prefix; `attn` the attention
    kind, `mask` [R, 1, Q, P+Q] an override of it; `adapter` where the adapter is on (everywhere, nowhere, or a
    boolean [R, Q] map); `fold` a folded verify of branch row groups; `hidden` whether the rows' final hidden
    states (the normed states the LM head reads) come back too."""
    ids: Tensor
    positions: Tensor
    attn: str
    kv: KVContext | None
    mask: Tensor | None = None
    adapter: bool | Tensor = False
    fold: Fold | None = None
    hidden: bool = False


@dataclass(frozen=True)
class FoldCounts:
    """After a folded verify: per layer and branch, the positions whose QKV (`qkv`) and FFN (`ffn`) were
    recomputed rather than taken from an ancestor."""
    qkv: list[list[int]]
    ffn: list[list[int]]


@dataclass(frozen=True)
class ForwardResult:
    """Logits [R, Q, V] of a plan's rows, a folded verify's counts, and the rows' final hidden states [R, Q, D]
    where the plan asked for them (a folded verify never gives them)."""
    logits: Tensor
    folds: FoldCounts | None = None
    hidden: Tensor | None = None


class ForwardBackend(Protocol):
    def run(self, plan: ForwardPlan) -> ForwardResult: ...


@dataclass
class Eager:
    """The model's own modules (in the layout the model keeps, Transformer.store_weights_input_major on the CPU)."""
    model: Transformer

    def run(self, plan: ForwardPlan) -> ForwardResult:
        if plan.fold is not None:
            raise ValueError("the eager forward does not fold; pick a folded backend")
        with ExitStack() as stack:
            seen = stack.enter_context(normed_hidden(self.model)) if plan.hidden else []
            logits = self.model(plan.ids, plan.positions, attn=plan.attn, kv=plan.kv, mask=plan.mask,
                                lora=plan.adapter)
        return ForwardResult(logits, hidden=seen[-1] if plan.hidden else None)
