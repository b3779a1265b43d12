"""One run as a Chrome Trace Event / Perfetto JSON trace (a pure function of its events).

Track layout (pid 1): tid 1 "rounds" holds a slice per round (from the previous round's end to this round's event)
with its phases nested inside, and an instant for each round that rejected drafts; tid 100+s holds KV slot s, one
slice per occupancy. Counters: accepted_len per round, kv_slots_in_use after each alloc/free. Times are integer
microseconds from t_ms, made non-decreasing in seq order so that slices on one track nest or are disjoint. The events
are read unfolded (`tracing.unfold`): a KV operation at its own seq and time, as runs stored before the folding hold
them.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from specscope.backend.store.derive import kv_interval_rows
from specscope.backend.tracing import unfold

PID = 1
ROUNDS_TID = 1
KV_TID = 100
Event = dict[str, Any]


def perfetto_trace(run: dict[str, Any], records: Sequence[Event]) -> dict[str, Any]:
    events = unfold(records)
    clock = dict(zip((e["seq"] for e in events), accumulate((round(e["t_ms"] * 1000) for e in events), max),
                     strict=True))
    trace = [metadata("process_name", f"{run['mode']} {run['run_id']}"),
             metadata("thread_name", "rounds", ROUNDS_TID)]
    trace += round_events(events, clock)
    trace += kv_events(run["run_id"], events, clock)
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def metadata(name: str, label: str, tid: int = 0) -> Event:
    return {"ph": "M", "name": name, "ts": 0, "pid": PID, "tid": tid, "args": {"name": label}}


def slice_(name: str, cat: str, begin: int, end: int, tid: int, args: dict[str, Any]) -> Event:
    return {"ph": "X", "name": name, "cat": cat, "ts": begin, "dur": end - begin, "pid": PID, "tid": tid,
            "args": args}


def counter(name: str, ts: int, value: int) -> Event:
    return {"ph": "C", "name": name, "ts": ts, "pid": PID, "tid": 0, "args": {name: value}}


def round_events(events: Sequence[Event], clock: dict[int, int]) -> list[Event]:
    out: list[Event] = []
    begin = clock[events[0]["seq"]] if events else 0
    for e in events:
        if e["type"] != "round":
            continue
        end = clock[e["seq"]]
        args = {"round": e["round"], "accepted_len": e["accepted_len"], "nfe": e["nfe"],
                "block_start": e["block_start"], "case": e.get("case"), "committed": len(e.get("committed") or [])}
        out.append(slice_(f"round {e['round']}", "round", begin, end, ROUNDS_TID, args))
        out += phase_slices(e.get("phases") or [], begin, end)
        out.append(counter("accepted_len", end, e["accepted_len"]))
        rejected = [i for i, state in enumerate(e.get("states") or []) if state == "rejected"]
        if rejected:
            out.append({"ph": "i", "s": "t", "name": f"rejected x{len(rejected)}", "cat": "rejection", "ts": end,
                        "pid": PID, "tid": ROUNDS_TID, "args": {"round": e["round"], "indices": rejected}})
        begin = end
    return out


def phase_slices(phases: Sequence[dict[str, Any]], begin: int, end: int) -> list[Event]:
    """The phases back to back, ending at the round's end; shrunk in proportion if they outlast the round."""
    widths = [max(float(p.get("ms") or 0.0), 0.0) * 1000 for p in phases]
    total = sum(widths)
    scale = min(1.0, (end - begin) / total) if total > 0 else 0.0
    edges = [round(x * scale) for x in accumulate(widths, initial=0.0)]
    base = end - edges[-1]
    return [slice_(p["kind"], "phase", base + a, base + b, ROUNDS_TID,
                   {k: p.get(k) for k in ("attn", "lora", "n_query", "ms")})
            for p, a, b in zip(phases, edges, edges[1:], strict=False)]


def kv_events(run_id: str, events: Sequence[Event], clock: dict[int, int]) -> list[Event]:
    intervals = kv_interval_rows(run_id, events)
    last = clock[events[-1]["seq"]] if events else 0
    out = [metadata("thread_name", f"KV slot {slot}", KV_TID + slot)
           for slot in sorted({iv["slot"] for iv in intervals})]
    for iv in intervals:
        leaked = iv["free_seq"] is None
        name = f"pos {iv['position']}" if iv["position"] is not None else f"slot {iv['slot']}"
        args = {k: iv[k] for k in ("position", "alloc_round", "free_round", "end_reason")} | {"leaked": leaked}
        end = last if leaked else clock[iv["free_seq"]]
        out.append(slice_(name, "kv", clock[iv["alloc_seq"]], end, KV_TID + iv["slot"], args))
    deltas: Counter[int] = Counter()
    for iv in intervals:
        deltas[iv["alloc_seq"]] += 1
        if iv["free_seq"] is not None:
            deltas[iv["free_seq"]] -= 1
    in_use = 0
    for e in events:
        if e["seq"] in deltas:
            in_use += deltas[e["seq"]]
            out.append(counter("kv_slots_in_use", clock[e["seq"]], in_use))
    return out
