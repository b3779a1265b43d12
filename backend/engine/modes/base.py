"""What a decoding mode is: declared parameters, per-request state, and a round that returns a result."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from backend.engine.params import Param

if TYPE_CHECKING:
    from backend.engine.request import Request
    from backend.engine.runtime import Runtime


@dataclass
class RoundView:
    """What the tracer shows of a round; built only when tracing is on."""
    block_start: int
    tokens: list[int]
    states: list[str]
    conf: list[float | None] | None = None
    case: str | None = None
    pq: list[dict[str, Any]] | None = None
    branches: list[dict[str, Any]] | None = None
    fold: list[list[int]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SlotRelease:
    slots: list[int]
    positions: list[int]
    reason: str


@dataclass
class RoundResult:
    """One round's outcome, applied by the engine: emit tokens, commit and free slots."""
    emitted: list[int]
    accepted_len: int
    commit: list[int] = field(default_factory=list)
    free: list[SlotRelease] = field(default_factory=list)
    view: RoundView | None = None


class Mode:
    """Base of every decoding mode. Subclasses register themselves with @register."""
    name: ClassVar[str]
    summary: ClassVar[str] = ""
    nfe_note: ClassVar[str] = ""
    lossless_vs: ClassVar[str | None] = None
    """The mode whose greedy output this one must reproduce token for token, if any."""
    params: ClassVar[tuple[Param, ...]] = ()
    needs_mask: ClassVar[bool] = True
    batchable: ClassVar[bool] = False

    def check(self, params: dict[str, Any], rt: Runtime) -> None:
        """Refuse parameters this model cannot run (raise ParamError naming the parameter)."""

    def extra_positions(self, params: dict[str, Any]) -> int:
        """How many positions past the emitted ones a round may touch (for context and KV sizing)."""
        return params.get("block_size", 1)

    def start(self, req: Request, rt: Runtime) -> None:
        """Set up mode state after the prefill."""

    def round(self, req: Request, rt: Runtime) -> RoundResult:
        raise NotImplementedError

    def metrics(self, req: Request) -> dict[str, Any]:
        """Mode-specific run metrics merged into run_end (e.g. ISD case frequencies)."""
        return {}

    def round_batch(self, reqs: list[Request], rt: Runtime) -> list[RoundResult]:
        """One round for several requests of this mode; batched where the mode allows it."""
        return [self.round(r, rt) for r in reqs]
