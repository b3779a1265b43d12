"""One generation request: its tokens, committed KV slots, mode state and counters."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from specscope.backend.engine.spec_counts import DraftStep
from specscope.backend.tracing import NULL_TRACER, Phase, Tracer

if TYPE_CHECKING:
    from specscope.backend.model.tokenizer import TextStream


@dataclass
class Request:
    """Token and KV bookkeeping of one run.

    `tokens` holds prompt + emitted tokens. `slots[i]` holds the committed KV of position i. Every emitted
    token has committed KV except possibly the last one (the seed / pending / bonus token), whose KV the
    next round writes: len(tokens) - len(slots) is 0 or 1 between rounds.
    """
    rid: str
    prompt_ids: list[int]
    mode: str                                # the mode's name; its policy is the scheduler's (Scheduler.policy)
    params: dict[str, Any]
    eos_id: int | None
    tracer: Tracer = NULL_TRACER
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = "client"
    """Who cancelled it, when it is: the client (Stop, a disconnect), a model switch or a server shutdown."""
    tokens: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    slot_index: torch.Tensor | None = None   # slots mirrored on the device (Runtime keeps it in step)
    state: Any = None                        # the mode's per-request state (Mode.start)
    status: str = "waiting"
    round: int = 0
    nfe: int = 0
    accept_lens: list[int] = field(default_factory=list)
    draft_steps: list[DraftStep] = field(default_factory=list)
    """Its drafts (engine/spec_counts.py): the scheduler adds each round's `RoundResult.draft`; a branching mode,
    whose drafts are accepted rounds later, adds its own."""
    phases: list[Phase] = field(default_factory=list)
    alternatives: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # position -> this round's top-k
    block_size: int | None = None
    draft_rows: int | None = None
    """Extra rows this step's draft tier allows a round (engine.draft_tiers; None: the request's own parameters)."""
    tier: dict[str, Any] | None = None
    """The tiers in force this step, as the round records them (None when the engine has none)."""
    tier_log: list[dict[str, Any] | None] = field(default_factory=list)
    """The tier each round after the prefill ran under (run_end's metrics say which of them cut its drafting)."""
    forward_ms: float = 0.0
    """Wall ms of the round forwards it took part in (prefill left out)."""
    forward_rows: dict[int, int] = field(default_factory=dict)
    """How many of those forwards computed each number of its rows."""
    confidence: float = 0.0
    """The model's probability of the last token a round committed (set by the modes that draft by cost)."""
    kv_peak: int = 0
    error: str | None = None
    text: TextStream | None = None           # the output's text deltas (the recorder's, made on first use)
    outcome: dict[str, Any] | None = None    # output_ids, text and metrics, made once the run has ended
    generator: torch.Generator | None = None
    t_start: float = field(default_factory=time.perf_counter)
    t_end: float | None = None

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt_ids)
        if self.params.get("temperature", 0.0) > 0:
            self.generator = torch.Generator().manual_seed(self.params.get("seed", 0))

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    @property
    def cached(self) -> int:
        """Number of positions whose KV is committed (= the next position to write)."""
        return len(self.slots)

    @property
    def temperature(self) -> float:
        return self.params.get("temperature", 0.0)

    @property
    def finished(self) -> bool:
        return self.status in ("done", "cancelled", "error")
