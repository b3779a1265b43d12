"""Trace events as rows: envelope checks, the dense-seq rule (over records and the KV operations folded into them),
and the event <-> row mapping: one row per record, its operations in its payload."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specscope.backend.store.db import EncodedJSON
from specscope.backend.store.errors import DuplicateSeqError, SeqGapError, TraceError
from specscope.backend.tracing import EVENT_TYPES, SCHEMA_VERSION, STRICT_JSON

COLUMNS = ("run_id", "seq", "t_ms", "type")


def check_envelope(event: Any) -> None:
    """Raise TraceError unless `event` has a valid v1 envelope (the rest is checked as it becomes a row)."""
    if not isinstance(event, dict):
        raise TraceError(f"an event must be a JSON object, got {type(event).__name__}")
    if event.get("v") != SCHEMA_VERSION:
        raise TraceError(f"event schema version {event.get('v')!r} is not {SCHEMA_VERSION}")
    if not isinstance(event.get("run_id"), str) or not event["run_id"]:
        raise TraceError("event has no run_id")
    if not isinstance(event.get("seq"), int) or isinstance(event["seq"], bool):
        raise TraceError(f"event seq {event.get('seq')!r} is not an integer")
    t_ms = event.get("t_ms")
    if not isinstance(t_ms, (int, float)) or isinstance(t_ms, bool) or not math.isfinite(t_ms):
        raise TraceError(f"event {event['seq']}: t_ms {t_ms!r} is not a finite number")
    if event.get("type") not in EVENT_TYPES:
        raise TraceError(f"event {event['seq']}: unknown type {event.get('type')!r}")
    ops = event.get("kv")
    if ops is not None and (event["type"] in ("kv", "run_start") or type(ops) is not list
                            or not all(type(op) is dict and type(op.get("seq")) is int for op in ops)):
        raise TraceError(f"event {event['seq']}: kv must be a list of KV operations, each with an integer seq "
                         f"(none in a {event['type']} event)")


def check_seq(run_id: str, expected: int, seq: int) -> None:
    """Events of a run must arrive with seq 0, 1, 2, ... and nothing else."""
    if seq < expected:
        raise DuplicateSeqError(f"run {run_id}: duplicate seq {seq} (next expected {expected})")
    if seq > expected:
        raise SeqGapError(f"run {run_id}: seq gap, got {seq} but expected {expected}")


def check_record(run_id: str, expected: int, event: dict[str, Any]) -> int:
    """A record (with a checked envelope) must take the seqs from `expected` on: its folded KV operations in turn,
    then its own. Returns the next seq expected."""
    ops = event.get("kv") or ()
    for i, op in enumerate(ops):
        check_seq(run_id, expected + i, op["seq"])
    check_seq(run_id, expected + len(ops), event["seq"])
    return int(event["seq"]) + 1


def check_stream(run_id: str, events: Sequence[Any]) -> None:
    """A complete stored stream: valid envelopes of one run, dense seq from 0, opened by run_start (to_row checks
    the rest)."""
    expected = 0
    for event in events:
        check_envelope(event)
        if event["run_id"] != run_id:
            raise TraceError(f"event {event['seq']} belongs to run {event['run_id']}, not {run_id}")
        expected = check_record(run_id, expected, event)
    if not events or events[0]["type"] != "run_start":
        raise TraceError(f"run {run_id}: the first event must be run_start")


def to_row(event: dict[str, Any]) -> dict[str, Any]:
    """The `events` row of an event with a checked envelope: envelope columns, the round (round and kv events),
    the rest as the payload's strict JSON, encoded once here (TraceError for NaN, Infinity or a value JSON has
    no form for, such as a numpy scalar)."""
    round_ = event.get("round") if event["type"] in ("round", "kv") else None
    try:
        payload = EncodedJSON(STRICT_JSON.encode({k: v for k, v in event.items() if k not in COLUMNS}))
    except (TypeError, ValueError) as exc:
        raise TraceError(f"event {event['seq']} is not strict JSON: {exc}") from exc
    return {"run_id": event["run_id"], "seq": event["seq"], "t_ms": event["t_ms"], "type": event["type"],
            "round": round_, "payload": payload}


def from_row(run_id: str, seq: int, t_ms: float, type_: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The event as emitted, keys in envelope order."""
    return {"v": payload["v"], "run_id": run_id, "seq": seq, "t_ms": t_ms, "type": type_} | payload
