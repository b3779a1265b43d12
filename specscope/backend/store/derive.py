"""Pure functions from a run's event stream to its derived rows: rounds, KV intervals and the run summary. A stream
is read in either form: records with their KV operations folded in, or (runs stored before the folding) kv events of
their own."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specscope.backend.store.errors import TraceError
from specscope.backend.tracing import kv_ops

Event = dict[str, Any]


def round_rows(run_id: str, events: Sequence[Event]) -> list[dict[str, Any]]:
    """One row per round event, its payload the round less its folded KV operations (the KV intervals hold them);
    a round number seen twice is a TraceError."""
    rows: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["type"] != "round":
            continue
        if e["round"] in rows:
            raise TraceError(f"run {run_id}: round {e['round']} appears twice")
        rows[e["round"]] = {"run_id": run_id, "round": e["round"], "seq": e["seq"], "block_start": e["block_start"],
                            "accepted_len": e["accepted_len"], "nfe": e["nfe"], "case": e.get("case"),
                            "payload": {k: v for k, v in e.items() if k != "kv"} if "kv" in e else e}
    return list(rows.values())


def kv_interval_rows(run_id: str, events: Sequence[Event]) -> list[dict[str, Any]]:
    """Occupancy intervals per slot, from alloc to free (write/commit/refresh do not change occupancy).

    An interval still open at the end has no free (a leak). An alloc of a slot that is already open closes the
    old interval with end_reason "realloc"; a free of a slot that is not open has no interval to close.
    """
    rows: list[dict[str, Any]] = []
    open_: dict[int, dict[str, Any]] = {}

    def close(slot: int, e: Mapping[str, Any], reason: str | None) -> None:
        open_.pop(slot).update(free_seq=e["seq"], free_round=e["round"], end_reason=reason)

    for e in kv_ops(events):
        if e["op"] not in ("alloc", "free"):
            continue
        positions = e.get("positions") or []
        for i, slot in enumerate(e["slots"]):
            if e["op"] == "free":
                if slot in open_:
                    close(slot, e, e.get("reason"))
                continue
            if slot in open_:
                close(slot, e, "realloc")
            open_[slot] = {"run_id": run_id, "slot": slot, "alloc_seq": e["seq"],
                           "position": positions[i] if i < len(positions) else None, "alloc_round": e["round"],
                           "free_seq": None, "free_round": None, "end_reason": None}
            rows.append(open_[slot])
    return rows


def run_summary(events: Sequence[Event]) -> dict[str, Any]:
    """Status, output, metrics and counts of a run; a run without run_end was interrupted."""
    n_rounds = sum(e["type"] == "round" for e in events)
    committed = sum(len(e.get("committed") or []) for e in events if e["type"] == "round")
    span = forward_span(events)
    end = next((e for e in reversed(events) if e["type"] == "run_end"), None)
    if end is None:
        return {"status": "interrupted", "output": None, "metrics": None, "n_rounds": n_rounds, "n_tokens": committed,
                **span}
    metrics = end.get("metrics") or {}
    return {"status": end["status"], "output": end.get("text"), "metrics": end.get("metrics"), "n_rounds": n_rounds,
            "n_tokens": metrics.get("tokens", committed), **span}


def forward_span(events: Sequence[Event]) -> dict[str, int | None]:
    """The first and last of its engine's forwards a run's rounds took part in (None without any)."""
    ids = [p["forward_id"] for e in events if e["type"] == "round" for p in counted_phases(e)]
    return {"first_forward": min(ids, default=None), "last_forward": max(ids, default=None)}


def counted_phases(event: Event) -> list[Event]:
    """A round's phases that name their forward (runs stored before forwards were counted name none)."""
    return [p for p in event.get("phases") or []
            if isinstance(p, dict) and type(p.get("forward_id")) is int and 0 < p["forward_id"] < 2**31]
