"""Trace schema v1: typed events, a null tracer (free when off) and a recording tracer.

Every event is one JSON object {"v": 1, "run_id", "seq", "t_ms", "type", ...payload}; `seq` is dense per run.
Event types: run_start, round, kv, run_end, error (DESIGN §6). JSON never holds NaN or Infinity.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
EVENT_TYPES = ("run_start", "round", "kv", "run_end", "error")
STATES = ("prompt", "committed", "mask", "draft", "accepted", "rejected", "bonus", "pending", "padding")
RUN_STATUSES = ("done", "cancelled", "error")


@dataclass(slots=True)
class Phase:
    """One model forward inside a round."""
    kind: str                           # prefill | draft | denoise | verify | refresh | decode
    attn: str
    lora: bool
    n_query: int
    ms: float


@dataclass(slots=True)
class RoundEvent:
    """One round as the trace shows it. The mode fills what its round did (block layout, states, confidences,
    its own facts); the run recorder fills the bookkeeping (round number, forwards, accepted and committed
    tokens, NFE, text delta)."""
    block_start: int
    tokens: list[int]
    states: list[str]
    conf: list[float | None] | None = None
    case: str | None = None
    pq: list[dict[str, Any]] | None = None
    branches: list[dict[str, Any]] | None = None
    fold: list[list[int]] | None = None
    block_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    round: int = 0
    phases: Sequence[Phase] = ()        # the bookkeeping fields are the recorder's, set when it emits the round
    accepted_len: int = 0
    committed: Sequence[int] = ()
    nfe: int = 0
    text_delta: str = ""

    def cut_after(self, index: int) -> None:
        """Drop every position after `index` (nothing after the first EOS is shown as drafted or accepted)."""
        self.tokens, self.states = self.tokens[:index + 1], self.states[:index + 1]
        if self.conf is not None:
            self.conf = self.conf[:index + 1]


@dataclass(slots=True)
class KVEvent:
    op: str                             # alloc | write | commit | free | refresh
    slots: list[int]
    positions: Sequence[int]
    round: int
    reason: str | None = None           # free: mask | rejected | trim | finished | cancelled | error


PLAIN = frozenset({int, str, bool, type(None)})
"""Types that sanitize hands back as they are, without a call per value."""


def sanitize(value: Any) -> Any:
    """A copy with NaN/Infinity replaced by None, recursively, so the JSON is valid everywhere."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: v if type(v) in PLAIN else sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [v if type(v) in PLAIN else sanitize(v) for v in value]
    return value


STRICT_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
"""Compact JSON that refuses NaN and Infinity; one encoder for every event (json.dumps with options builds a new
one per call, a third of the time of encoding a kv event)."""


def to_json(event: dict[str, Any] | list[dict[str, Any]]) -> str:
    """Compact JSON of an event or a list of them; one that still holds NaN or Infinity is sanitized first (a
    tracer's never does)."""
    try:
        return STRICT_JSON.encode(event)
    except ValueError:
        return STRICT_JSON.encode(sanitize(event))


def new_run_id() -> str:
    return "r_" + uuid.uuid4().hex[:16]


class NullTracer:
    """Tracing off: modes check `enabled` before building any payload, so nothing is computed."""
    enabled = False
    run_id = ""

    def emit(self, type: str, payload: dict[str, Any]) -> None:
        pass

    def round(self, event: RoundEvent) -> None:
        pass

    def kv(self, event: KVEvent) -> None:
        pass


NULL_TRACER = NullTracer()


class RecordingTracer:
    """Numbers events densely per run and hands each to an optional sink as it is made. It keeps them in `events`
    unless `keep` is False: a tracer whose sink is their only reader (the store's, a socket's, the engine
    process's pipe) need not hold a run's events a second time, nor touch that memory on every token."""
    enabled = True

    def __init__(self, run_id: str | None = None, sink: Callable[[dict[str, Any]], None] | None = None,
                 keep: bool = True):
        self.run_id = run_id or new_run_id()
        self.events: list[dict[str, Any]] = []
        self.sink = sink
        self.keep = keep
        self.seq = 0
        """The next event's seq: how many events this run has made so far."""
        self.ended = False
        """Whether run_end has been made."""
        self._t0 = time.perf_counter()

    def emit(self, type: str, payload: dict[str, Any]) -> None:
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}")
        self.ended = self.ended or type == "run_end"
        self._keep({"v": SCHEMA_VERSION, "run_id": self.run_id, "seq": self.seq, "t_ms": self._ms(), "type": type,
                    **sanitize(payload)})

    def round(self, event: RoundEvent) -> None:
        """The event's int and string lists are copied as they are; only the fields that may hold floats are
        sanitized (an ar token's round is on the critical path: one dict, built once)."""
        e = event
        out = {"v": SCHEMA_VERSION, "run_id": self.run_id, "seq": self.seq, "t_ms": self._ms(), "type": "round",
               "block_start": e.block_start, "tokens": list(e.tokens), "states": list(e.states),
               "conf": None if e.conf is None else sanitize(e.conf), "case": e.case,
               "pq": None if e.pq is None else sanitize(e.pq),
               "branches": None if e.branches is None else sanitize(e.branches),
               "fold": None if e.fold is None else [list(rows) for rows in e.fold],
               "block_size": e.block_size, "round": e.round,
               "phases": [{"kind": p.kind, "attn": p.attn, "lora": p.lora, "n_query": p.n_query, "ms": p.ms}
                          for p in e.phases],
               "accepted_len": e.accepted_len, "committed": list(e.committed), "nfe": e.nfe,
               "text_delta": e.text_delta}
        if e.extra:
            out["extra"] = sanitize(e.extra)
        self._keep(out)

    def kv(self, event: KVEvent) -> None:
        """Ints and strings only, so no sanitizing; the slot lists are copied (callers reuse theirs)."""
        self._keep({"v": SCHEMA_VERSION, "run_id": self.run_id, "seq": self.seq, "t_ms": self._ms(), "type": "kv",
                    "op": event.op, "slots": list(event.slots), "positions": list(event.positions),
                    "round": event.round, "reason": event.reason})

    def relay(self, event: dict[str, Any]) -> None:
        """Keep and hand on an event of this run made by another tracer (the engine process's): later events made
        here continue its numbering."""
        self.ended = self.ended or event["type"] == "run_end"
        self._keep(event)

    def _ms(self) -> float:
        return round((time.perf_counter() - self._t0) * 1000, 3)

    def _keep(self, event: dict[str, Any]) -> None:
        self.seq += 1
        if self.keep:
            self.events.append(event)
        if self.sink is not None:
            self.sink(event)


Tracer = NullTracer | RecordingTracer
