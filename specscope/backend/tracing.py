"""Trace schema v1: typed events, a null tracer (free when off) and a recording tracer.

Every event is one JSON object {"v": 1, "run_id", "seq", "t_ms", "type", ...payload}. Event types: run_start, round,
kv, run_end, error. A run is one record per round: the KV operations since the previous record are folded into the
next round, run_end or error as its `kv` list, each operation {"seq", "t_ms", "op", "slots", "positions", "round",
"reason"}, a kv event less its envelope. The operations are numbered with the records, before the record that holds
them, so `seq` is dense per run over records and their operations, and `unfold` gives the stream as runs stored
before the folding hold it: every operation a kv event of its own, just before its record. JSON never holds NaN or
Infinity.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
EVENT_TYPES = ("run_start", "round", "kv", "run_end", "error")
STATES = {  # a round cell's state -> what it means; the order is the legend's
    "prompt": "a prompt token",
    "committed": "a token kept before this round (a block's seed, or a position unmasked in an earlier round)",
    "mask": "a position still masked",
    "draft": "a drafted token not yet verified (the next round checks it)",
    "accepted": "a drafted or unmasked token this round's check kept (ar and the prefill: the model's own pick)",
    "rejected": "a drafted token the check refused (its KV is freed)",
    "bonus": "the verifier's own token after the accepted drafts: the correction where a draft was rejected, "
             "else the bonus (a block's next seed in the block modes)",
    "pending": "the last committed token, fed again so this round writes its KV",
    "padding": "an unused mask position of the round's input",
    "cut": "a token the mode kept (accepted, bonus, or unmasked earlier) that the run dropped: it lies past "
           "max_new_tokens",
}
ROUND_COUNTS = {  # a round event's two counts, as the visualizer names them
    "accepted": "the round's cells in state accepted: drafts the verifier kept, or positions unmasked this round "
                "(the block modes), after the cut at EOS and max_new_tokens; the event's `accepted`",
    "committed": "the tokens the round appended to the output, after the cut at EOS and max_new_tokens: the "
                 "accepted drafts plus the correction or bonus token, or in the block modes a whole block once "
                 "its last mask is filled (the event's `committed` list; its length here)",
}
RUN_STATUSES = ("done", "cancelled", "error", "interrupted")
"""How a run ends (run_end's status): interrupted when the engine replica serving it died."""


@dataclass(slots=True)
class Phase:
    """One model forward inside a round: the request's own row group (`n_query` rows) and the forward it shared."""
    kind: str                           # prefill | draft | denoise | verify | refresh | decode
    attn: str
    lora: bool
    n_query: int
    ms: float
    forward_id: int = 0
    """The engine's forward counter: phases of one forward share it."""
    batch_requests: int = 1
    """Requests whose row groups shared the forward."""
    batch_rows: int = 0
    """Query rows of the forward, every request's."""
    pool_used: int = 0
    """KV slots in use in the engine's pool as the forward ran."""


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
    topk: list[list[dict[str, Any]] | None] | None = None  # per cell, with params.trace_topk: each forward's top-k
    round: int = 0
    phases: Sequence[Phase] = ()        # the bookkeeping fields are the recorder's, set when it emits the round
    accepted_len: int = 0
    accepted: int = 0
    committed: Sequence[int] = ()
    nfe: int = 0
    text_delta: str = ""

    def positions(self) -> Sequence[int]:
        """Each cell's position: block_start + its index, or + `extra.offsets` where cells share positions."""
        offsets = self.extra.get("offsets") or range(len(self.tokens))
        return [self.block_start + int(off) for off in offsets[:len(self.tokens)]]

    def cut_after(self, index: int) -> None:
        """Drop every position after `index` (nothing after the first EOS is shown as drafted or accepted)."""
        self.tokens, self.states = self.tokens[:index + 1], self.states[:index + 1]
        if self.conf is not None:
            self.conf = self.conf[:index + 1]
        if self.topk is not None:
            self.topk = self.topk[:index + 1]


PLAIN = frozenset({int, str, bool, type(None)})
"""Types that sanitize hands back as they are, without a call per value (finite floats too)."""
isfinite = math.isfinite


def sanitize(value: Any) -> Any:
    """A copy with NaN/Infinity replaced by None, recursively, so the JSON is valid everywhere."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: v if type(v) in PLAIN or type(v) is float and isfinite(v) else sanitize(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [v if type(v) in PLAIN or type(v) is float and isfinite(v) else sanitize(v) for v in value]
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


def kv_ops(events: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Every KV operation of a run's events, in order, each with its seq, t_ms, op, slots, positions, round and
    reason: the operations folded into records, and the kv events of a run stored before the folding (as they
    are, no copies)."""
    for event in events:
        if event["type"] == "kv":
            yield event
        elif "kv" in event:
            yield from event["kv"]


def kv_events(event: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The KV operations a record holds (its `kv`), each as the kv event of its own that a run stored before the
    folding holds; a kv event is its own."""
    if event["type"] == "kv":
        return [dict(event)]
    return [{"v": event["v"], "run_id": event["run_id"], "seq": op["seq"], "t_ms": op["t_ms"], "type": "kv",
             **{k: v for k, v in op.items() if k not in ("seq", "t_ms")}} for op in event.get("kv") or ()]


def unfold(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A run's events as they were before the KV operations were folded into records: each operation a kv event
    just before its record, and the record without `kv`. A run stored before the folding comes back as it is."""
    out: list[dict[str, Any]] = []
    for event in events:
        if event.get("kv") and event["type"] != "kv":
            out += kv_events(event)
            out.append({k: v for k, v in event.items() if k != "kv"})
        else:
            out.append(dict(event))
    return out


def new_run_id() -> str:
    """64 random bits (os.urandom: a few times cheaper than a uuid4 right after a decode step)."""
    return "r_" + os.urandom(8).hex()


class NullTracer:
    """Tracing off: modes check `enabled` before building any payload, so nothing is computed."""
    enabled = False
    run_id = ""

    def emit(self, type: str, payload: dict[str, Any]) -> None:
        pass

    def round(self, event: RoundEvent, complete: Callable[..., None] | None = None, *args: Any) -> None:
        pass

    def kv(self, op: str, slots: list[int], positions: Sequence[int], round: int, reason: str | None = None) -> None:
        pass


NULL_TRACER = NullTracer()


HOLD_S = 0.05
"""How long a recording tracer holds rounds and KV operations before making them (a round past it makes them all);
read when a tracer is made. A live viewer sees a batch at most every 50 ms (20 a second): every batch costs a
cold start and, in the engine process, a pipe message (20 ms batches cost 128-token runs through the engine
process ~1 % more)."""


class RecordingTracer:
    """Numbers events (and the KV operations folded into them) densely per run and hands each to an optional sink.
    It keeps them in `events` unless `keep` is False: a tracer whose sink is their only reader (the store's, a
    socket's, the engine process's pipe) need not hold a run's events a second time, nor touch that memory on every
    token.

    Rounds and KV operations are taken as they happen (their time now) and made into event dicts in batches: at the
    first round `hold_s` after the last batch (or the tracer's start), before any other event, and on `flush()` or
    a read of `events`. A made round holds the operations taken before it (`kv`); operations taken after the last
    round wait for the next round, or go with the next event emitted (run_end, error), so the sink gets one record
    per round and never a kv event of its own. Made one at a time between two decode steps, an event ran from
    caches the step's weights had just evicted; made in a batch it costs about a third less (measured by pairing
    traced and untraced ar runs with HOLD_S = 0 against the default; docs/performance.md). Sinks see events in
    order, a batch at most every hold_s (a run's first round too: its t_ms still says when it was made); a round
    made within hold_s of the last batch waits for the next round (as the engine process's messages do). What a
    round or KV operation holds is the caller's own: nothing changes it once handed over (tests/test_engine.py
    checks every mode)."""
    enabled = True

    def __init__(self, run_id: str | None = None, sink: Callable[[dict[str, Any]], None] | None = None,
                 keep: bool = True, hold_s: float | None = None, batch_end: Callable[[], None] | None = None,
                 tags: dict[str, Any] | None = None):
        self.run_id = run_id or new_run_id()
        self.tags = tags or {}
        """Fields added to run_start (a sweep's id and grid cell: `{"sweep": {"id", "cell"}}`)."""
        self.sink = sink
        self.batch_end = batch_end
        """Called after a round's batch of held events has gone to the sink (a sink that sends in messages sends
        then); a batch ended by an emitted event (run_end, error) goes with that event instead."""
        self.keep = keep
        self.hold_s = HOLD_S if hold_s is None else hold_s
        self.seq = 0
        """The next seq: how many events and KV operations this run has made so far (held ones not counted)."""
        self.ended = False
        """Whether run_end has been made."""
        self._events: list[dict[str, Any]] = []
        self._held: list[tuple[Any, ...]] = []
        """Rounds as (t, event, complete, args), KV operations as (t, op, slots, positions, round, reason)."""
        self._t0 = self._made = time.perf_counter()

    @property
    def events(self) -> list[dict[str, Any]]:
        """The events kept so far, held rounds made first (mid-run, only on the thread that runs the engine)."""
        self._make_held()
        return self._events

    def emit(self, type: str, payload: dict[str, Any]) -> None:
        """Make the held rounds, then this event with the KV operations taken since the last round: together one
        batch for the sink."""
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}")
        self._make_held()
        ops = [self._kv(*item) for item in self._held]
        self._held = []
        self.ended = self.ended or type == "run_end"
        if type == "run_start" and self.tags:
            payload = {**payload, **self.tags}
        event = {"v": SCHEMA_VERSION, "run_id": self.run_id, "seq": self.seq, "t_ms": self._ms(time.perf_counter()),
                 "type": type, **sanitize(payload)}
        if ops:
            event["kv"] = ops
        self._keep(event)

    def round(self, event: RoundEvent, complete: Callable[..., None] | None = None, *args: Any) -> None:
        """Hold the round; `complete(*args, event)`, when given, fills in the rest of it when the event is made (in
        order: the run recorder's bookkeeping and text delta). The event and its lists are the round's own:
        nothing changes them once handed over."""
        now = time.perf_counter()
        self._held.append((now, event, complete, args))
        if now - self._made >= self.hold_s:
            self.flush()

    def kv(self, op: str, slots: list[int], positions: Sequence[int], round: int, reason: str | None = None) -> None:
        """Hold a KV operation: op alloc | write | commit | free | refresh, reason (free only) mask | rejected |
        trim | finished | cancelled | error; the next record made holds it. As with a round, nothing may change its
        lists until it is made."""
        self._held.append((time.perf_counter(), op, slots, positions, round, reason))

    def flush(self) -> None:
        """Make the held rounds, in order, hand them on and end the batch."""
        if self._make_held() and self.batch_end is not None:
            self.batch_end()

    def _make_held(self) -> bool:
        """Make the held rounds, each with the KV operations held before it, and hand them on; operations held
        after the last round stay held. Whether any round was made."""
        rounds = [i for i, item in enumerate(self._held) if len(item) != 6]
        if not rounds:
            return False
        held, self._held = self._held[:rounds[-1] + 1], self._held[rounds[-1] + 1:]
        ops: list[dict[str, Any]] = []
        for item in held:
            if len(item) == 6:
                ops.append(self._kv(*item))
            else:
                t, event, complete, args = item
                if complete is not None:
                    complete(*args, event)
                self._keep(self._round(t, event, ops))
                ops = []
        self._made = time.perf_counter()
        return True

    def relay(self, event: dict[str, Any]) -> None:
        """Keep and hand on an event of this run made by another tracer (the engine process's): later events made
        here continue its numbering."""
        self._make_held()
        self.ended = self.ended or event["type"] == "run_end"
        self._keep(event)

    def _round(self, t: float, e: RoundEvent, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """The round's event, with the KV operations `ops` folded in: its lists (the round's own) as they are, only
        the fields that may hold floats sanitized."""
        out = {"v": SCHEMA_VERSION, "run_id": self.run_id, "seq": self.seq, "t_ms": self._ms(t), "type": "round",
               "block_start": e.block_start, "tokens": e.tokens, "states": e.states,
               "conf": None if e.conf is None else sanitize(e.conf), "case": e.case,
               "pq": None if e.pq is None else sanitize(e.pq),
               "branches": None if e.branches is None else sanitize(e.branches),
               "fold": None if e.fold is None else [list(rows) for rows in e.fold],
               "block_size": e.block_size, "round": e.round,
               "phases": [{"kind": p.kind, "attn": p.attn, "lora": p.lora, "n_query": p.n_query, "ms": p.ms,
                           "forward_id": p.forward_id, "batch_requests": p.batch_requests, "batch_rows": p.batch_rows,
                           "pool_used": p.pool_used}
                          for p in e.phases],
               "accepted_len": e.accepted_len, "accepted": e.accepted, "committed": e.committed, "nfe": e.nfe,
               "text_delta": e.text_delta}
        if e.extra:
            out["extra"] = sanitize(e.extra)
        if e.topk is not None:
            out["topk"] = sanitize(e.topk)
        if ops:
            out["kv"] = ops
        return out

    def _kv(self, t: float, op: str, slots: list[int], positions: Sequence[int], round: int,
            reason: str | None) -> dict[str, Any]:
        """A KV operation as a record holds it, numbered next: ints and strings only, nothing to sanitize; the lists
        copied (positions may be a range)."""
        self.seq += 1
        return {"seq": self.seq - 1, "t_ms": self._ms(t), "op": op, "slots": list(slots),
                "positions": list(positions), "round": round, "reason": reason}

    def _ms(self, t: float) -> float:
        """Milliseconds since the tracer's start, to the microsecond (truncated: a third of round()'s time)."""
        return int((t - self._t0) * 1e6) / 1000

    def _keep(self, event: dict[str, Any]) -> None:
        self.seq = event["seq"] + 1
        if self.keep:
            self._events.append(event)
        if self.sink is not None:
            self.sink(event)


Tracer = NullTracer | RecordingTracer
