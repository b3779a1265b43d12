"""What a round asks of the model and what it gives back. A mode's round is a generator that yields one `Ask` (or
`BranchAsk`) per forward it needs, receives that forward's rows and returns a `RoundResult`; the scheduler runs the
asks of every running round in waves, asks whose rows fit one plan share one forward, and applies the results."""
from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import Tensor

from specscope.backend.engine.spec_counts import DraftStep
from specscope.backend.forward.plan import Fold
from specscope.backend.tracing import RoundEvent

if TYPE_CHECKING:
    from specscope.backend.engine.request import Request


CAUSAL = ("causal", "strict_causal")
RAGGED = ("rows",)
"""The key of asks that pack flat into one forward whatever their shapes and attention."""


@dataclass
class Ask:
    """One request's query row group: `ids` at positions start + offsets (default 0..Q-1) in `attn` attention over
    the request's committed prefix, writing its K/V to `write` (None: read-only), `lora` asking for a draft-scope
    adapter, `mask` [1, 1, Q, P+Q] overriding the attention. Answered with the group's Scores."""
    req: Request
    ids: list[int]
    start: int
    attn: str
    kind: str
    write: list[int] | None = None
    lora: bool = False
    kv_op: str = "write"
    mask: Tensor | None = None
    offsets: Sequence[int] | None = None

    def key(self) -> tuple[Any, ...] | None:
        """Asks with equal keys share one forward, one row group each, packed flat whatever their lengths (RAGGED):
        rows that write their K/V and attend causally or under a mask override, and bidirectional blocks of any
        width, beside each other; None: this one runs alone."""
        if self.write is not None and (self.attn in CAUSAL or self.mask is not None):
            return RAGGED
        if self.attn == "block" and self.mask is None:
            return RAGGED
        return None


@dataclass
class BranchAsk:
    """A read-only `block` forward of several states of one request's open block (row 0 the main state) over its
    one committed prefix, folded along `fold`'s tree by the named folded backend when given (SpecFold). Answered
    with each state's Scores (and the fold counts, when folded). Unfolded, its states pack flat beside other asks'
    rows (RAGGED), one row group each; folded, it runs as a forward of its own (on the folded backend)."""
    req: Request
    states: Sequence[Sequence[int]]
    start: int
    fold: Fold | None = None
    backend: str | None = None

    def key(self) -> tuple[Any, ...] | None:
        return RAGGED if self.fold is None else None


@dataclass
class SlotRelease:
    slots: list[int]
    positions: list[int]
    reason: str


@dataclass
class RoundResult:
    """One round's outcome, applied by the scheduler: free and commit slots, emit tokens (cut at EOS and at
    max_new_tokens), record `view` (built only when tracing is on) and the round's `draft`, when its forward
    verified drafted tokens (engine/spec_counts.py)."""
    emitted: list[int]
    accepted_len: int
    commit: list[int] = field(default_factory=list)
    free: list[SlotRelease] = field(default_factory=list)
    view: RoundEvent | None = None
    draft: DraftStep | None = None


Round = Generator["Ask | BranchAsk", Any, "RoundResult"]
"""A mode's round: yields the forwards it needs, receives their rows, returns its result."""
