"""What a decoding mode is: a stateless policy with declared parameters, whose `start` returns the request's
mode state and whose `round` (a generator of the forwards it needs) turns that state into a result the scheduler
applies."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from specscope.backend.engine.draft_tiers import fitted_length
from specscope.backend.engine.params import Param

if TYPE_CHECKING:
    from specscope.backend.engine.ask import Round
    from specscope.backend.engine.request import Request
    from specscope.backend.engine.runtime import Runtime


PICKERS = ("chat", "race", "compare", "bench")
"""The app's mode pickers a mode may be a default of (`Mode.picked`): the chat's mode, the race's rival of the
baseline, the modes Compare ticks, and Bench's "run it here" rival of the baseline (also /api/bench/here's default)."""


@dataclass(frozen=True)
class Column:
    """A run metric of the mode's (a key of its run_end metrics) that the comparison table and the bench tab show as
    a column of their own: its label, what it means (the label's hover) and its format (`%`: a share; else digits)."""
    key: str
    label: str
    definition: str
    format: str = "2"

    def schema(self) -> dict[str, str]:
        return asdict(self)


class Mode:
    """Base of every decoding mode. Subclasses register themselves with @register.

    A mode holds no request data: everything a run needs between rounds lives in the state `start` returns
    (stored on the request), so requests of one mode with different parameters can share a step."""
    name: ClassVar[str]
    color: ClassVar[str]
    """Its colour, the same in every chart and table that tells modes apart (each mode its own)."""
    summary: ClassVar[str] = ""
    nfe_note: ClassVar[str] = ""
    explain: ClassVar[str] = ""          # what a round, "accepted" and "committed" mean here (the visualizer shows it)
    lossless_vs: ClassVar[str | None] = None
    """The mode whose greedy output this one must reproduce token for token, if any."""
    exact: ClassVar[bool] = False
    """Its greedy output is the model's own greedy decode (the baseline that lossless claims lead back to)."""
    lossless_params: ClassVar[dict[str, Any]] = {}
    """Parameters under which the lossless claim holds (e.g. SpecFold: δ = 0 with the strict FFN gate)."""
    drafter: ClassVar[tuple[str, float] | None] = None
    """(run metric, minimum of its mean over held-out prompts) that shows the drafting side works."""
    drafter_params: ClassVar[dict[str, Any]] = {}
    """Parameters at which the drafter metric is checked (a cost-aware verify may rightly draft little where rows
    are dear, so the drafter shows its work at the fixed length)."""
    heldout_layout: ClassVar[str | None] = None
    """The draft layout of the model card's held-out figures (`block` or `causal`, train/heldout.py) that this
    mode's acceptance is checked against (engine/spec_alarm.py); None: none applies."""
    params: ClassVar[tuple[Param, ...]] = ()
    needs_mask: ClassVar[bool] = True
    verify_matmul: ClassVar[str | None] = None
    """The matmul precision its verify forwards run in whatever the engine's, where they have a path of their own
    (None: the engine's). A run in another precision records both, so no lossless verdict is given across them."""
    draft_param: ClassVar[str | None] = None
    """The parameter that sets how much a round drafts (a draft tier shrinks it under load); None: draft tiers leave
    the mode alone."""
    min_draft: ClassVar[int] = 1
    """The shortest `draft_param` value that still drafts; a tier that leaves room for less makes the round a plain
    decode step."""
    picked: ClassVar[Mapping[str, int]] = {}
    """The app's pickers (PICKERS) that choose this mode by default, each with its place in that picker's preference
    (0 first; the first the served model can run is picked)."""
    columns: ClassVar[tuple[Column, ...]] = ()
    """Its own run metrics that the comparison table and the bench tab show as columns."""

    def check(self, params: dict[str, Any], rt: Runtime) -> None:
        """Refuse parameters this model cannot run (raise ParamError naming the parameter)."""

    def extra_positions(self, params: dict[str, Any]) -> int:
        """How many positions past the emitted ones a round may touch (for context and KV sizing)."""
        return params.get("block_size", 1)

    def draft_rows(self, length: int) -> int:
        """The extra rows (beyond a decode step's one) a round runs when `draft_param` is `length`; increasing in
        `length`. Only a mode with a `draft_param` has them."""
        raise NotImplementedError(f"{self.name} has no draft_param")

    def tier_rows(self, params: dict[str, Any]) -> int:
        """The extra rows a round runs at the request's own parameters, which a draft tier's budget is weighed
        against (0: draft tiers leave the mode alone)."""
        return self.draft_rows(params[self.draft_param]) if self.draft_param else 0

    def draft_length(self, length: int, rows: int | None) -> int | None:
        """`draft_param` as a round may use it within `rows` extra rows of a draft tier (`length`: the request's
        own value; rows None: no tier in force, the own value); None: a plain decode step."""
        return fitted_length(length, rows, self.draft_rows, self.min_draft)

    def start(self, req: Request, rt: Runtime) -> Any:
        """The request's mode state, set up after the prefill."""
        return None

    def round(self, req: Request, rt: Runtime) -> Round:
        """One round: yields each forward it needs (`rt.ask`, or a BranchAsk), receives that forward's rows, and
        returns the round's result. The scheduler runs the asks of every running round together, so a round
        shares its forwards with other requests' rounds of any mode."""
        raise NotImplementedError

    def metrics(self, req: Request) -> dict[str, Any]:
        """Mode-specific run metrics merged into run_end (e.g. ISD case frequencies, SpecFold's fold ratio)."""
        return {}
