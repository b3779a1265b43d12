"""Running a forward backend the way the model's own forward is called, for the backend tests."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from specscope.backend.forward.plan import ForwardPlan


def forward(backend: Any, ids: Tensor, positions: Tensor, attn: str = "causal", kv: Any = None,
            mask: Tensor | None = None, lora: bool | Tensor = False) -> Tensor:
    """backend.run of the plan of these arguments: its logits."""
    return backend.run(ForwardPlan(ids, positions, attn, kv, mask, lora)).logits
