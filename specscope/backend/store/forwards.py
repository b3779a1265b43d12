"""A stored run's forwards, rebuilt from the round events of every stored run of its engine that shared them: the
records the engine's forward log held live (GET /api/forwards), for a run whose server has long moved on."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from specscope.backend.store.derive import counted_phases, forward_span
from specscope.backend.store.events import from_row
from specscope.backend.store.models import Event, Run, utc

Record = dict[str, Any]
MAX_SHARING_RUNS = 200
"""At most this many other runs are read to rebuild one run's forwards (the earliest that overlap it)."""


def shared_forwards(session: Session, run_id: str) -> Record | None:
    """Its engine's forwards over a stored run's span (its first forward to its last), each with every stored run of
    that engine that took part in it (None for an unknown run). `complete` says whether every forward of the span
    and every row of each belongs to a stored run (a run still running, or one its server did not store, leaves
    forwards or rows unaccounted: a record's `rows` stays the forward's own count)."""
    run = session.get(Run, run_id)
    if run is None:
        return None
    own = rounds_of(session, [run])
    lo, hi = forward_span([event for _, event in own]).values()
    if lo is None or hi is None:
        return {"run_id": run_id, "engine": run.engine, "forwards": [], "runs": [run_id], "complete": True}
    others: list[Run] = []
    if run.engine is not None:
        query = (select(Run).where(Run.engine == run.engine, Run.run_id != run_id, Run.first_forward <= hi,
                                   Run.last_forward >= lo).order_by(Run.first_forward).limit(MAX_SHARING_RUNS))
        others = list(session.scalars(query))
    records = rebuilt(own + rounds_of(session, others), lo, hi, kv_slots(session, run_id))
    return {"run_id": run_id, "engine": run.engine, "forwards": records,
            "runs": sorted({g["run_id"] for r in records for g in r["groups"]}),
            "complete": len(records) == hi - lo + 1
                        and all(sum(g["rows"] for g in r["groups"]) == r["rows"] for r in records)}


def rebuilt(rounds: Iterable[tuple[Run, Record]], lo: int, hi: int, pool_slots: int | None) -> list[Record]:
    """A record per forward id from `lo` to `hi` that these rounds took part in, as the engine's log holds it: id,
    t (when the round that ran it was made), ms, rows, pool_used, pool_slots, and a group per request (run, mode,
    round, kind, its rows)."""
    records: dict[int, Record] = {}
    for run, event in rounds:
        made = utc(run.created_at).timestamp() + event["t_ms"] / 1000
        for phase in counted_phases(event):
            if not lo <= phase["forward_id"] <= hi:
                continue
            record = records.setdefault(phase["forward_id"], {
                "id": phase["forward_id"], "t": made, "ms": phase.get("ms"), "rows": phase.get("batch_rows"),
                "pool_used": phase.get("pool_used"), "pool_slots": pool_slots, "groups": []})
            record["groups"].append({"run_id": run.run_id, "mode": run.mode, "round": event.get("round"),
                                     "kind": phase.get("kind"), "rows": phase.get("n_query")})
    return [records[i] for i in sorted(records)]


def rounds_of(session: Session, runs: list[Run]) -> list[tuple[Run, Record]]:
    """The runs' round events, each with its run."""
    by_id = {run.run_id: run for run in runs}
    query = (select(Event.run_id, Event.seq, Event.t_ms, Event.type, Event.payload)
             .where(Event.run_id.in_(by_id), Event.type == "round").order_by(Event.run_id, Event.seq))
    return [(by_id[row[0]], from_row(*row)) for row in session.execute(query)] if by_id else []


def kv_slots(session: Session, run_id: str) -> int | None:
    """The engine's KV pool size, from the run's run_start (None for a run stored before it was recorded)."""
    payload = session.scalar(select(Event.payload).where(Event.run_id == run_id, Event.seq == 0))
    slots = payload.get("kv_slots") if isinstance(payload, dict) else None
    return slots if type(slots) is int else None
