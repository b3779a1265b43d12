"""Reading a run's trace events back."""
from __future__ import annotations

from typing import Any

from specscope.backend.tracing import kv_events


def replay_kv(events: list[dict[str, Any]]) -> tuple[set[int], list[int]]:
    """Rebuild slot ownership from a run's KV operations (folded into its records, or kv events of their own);
    returns (held slots, committed slots) at the end."""
    held: set[int] = set()
    committed: list[int] = []
    for e in (op for event in events for op in kv_events(event)):
        if e["op"] == "alloc":
            assert not held & set(e["slots"]), "slot allocated twice"
            held |= set(e["slots"])
        elif e["op"] in ("write", "refresh"):
            assert set(e["slots"]) <= held, "write to a slot the run does not hold"
        elif e["op"] == "commit":
            committed += e["slots"]
        elif e["op"] == "free":
            assert set(e["slots"]) <= held
            held -= set(e["slots"])
            committed = [s for s in committed if s not in e["slots"]]
    return held, committed
