"""The contract of SpecFold's folded verify backends (backend/forward/folded.py, packed.py): a plan with a `fold`,
block attention over one read-only prefix shared by one row group per branch, and the helpers every backend
reads that prefix and the adapter map with. The float64 oracle the backends are tested against is
tests/support/fold_oracle.py."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from specscope.backend.forward.plan import Fold, ForwardPlan, ForwardResult
from specscope.backend.model.transformer import KVContext, LoRA, Transformer


@dataclass
class FoldedForward:
    """A folded verify backend: `run(plan)` of a plan with a `fold` (block attention over one read-only shared
    prefix, one row group per branch of the fold's tree), its ForwardResult carrying the fold counts."""
    model: Transformer

    @staticmethod
    def check(plan: ForwardPlan) -> Fold:
        """The plan's fold; a ValueError for a plan this backend cannot run."""
        if plan.fold is None or plan.attn != "block" or plan.mask is not None:
            raise ValueError("the folded forward verifies block states: a fold, block attention, no custom mask")
        if len(plan.fold.parents) != plan.ids.shape[0]:
            raise ValueError(f"the fold's tree has {len(plan.fold.parents)} branches for {plan.ids.shape[0]} rows")
        return plan.fold

    def run(self, plan: ForwardPlan) -> ForwardResult:
        raise NotImplementedError


def adapter_rows(lora: LoRA, rows: Tensor) -> LoRA:
    """The adapter map at flat (branch · N + position) rows, in their shape: a [R, N] map's entries there; on or
    off everywhere stays as it is."""
    return lora.reshape(-1)[rows] if isinstance(lora, Tensor) else lora


def shared_prefix(kv: KVContext | None, slots: Tensor | None, layer: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """The prefix K/V [P, Hkv, hd] every row reads at `slots` (from `shared_slots`), empty without a KV
    context; like [..., Hkv, hd] gives the empty one's shape."""
    if kv is None or slots is None:
        empty = like.new_zeros(0, *like.shape[-2:])
        return empty, empty
    return kv.cache.k[layer][slots], kv.cache.v[layer][slots]


def shared_slots(kv: KVContext) -> Tensor:
    """The slot list [P] of the one read-only prefix that all rows share: the row groups of one request
    (`KVContext.shared`, Runtime.branches), else a ValueError."""
    if kv.write_slots is not None or kv.prefix_valid is not None or not (kv.shared or kv.prefix_slots.shape[0] == 1):
        raise ValueError("the folded forward needs one shared, read-only prefix for all rows (Runtime.branches)")
    return kv.prefix_slots[0]
