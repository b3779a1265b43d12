"""Export and import of stored runs: a JSON document (run + events) and a Chrome Trace / Perfetto trace."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from specscope.backend.store.errors import DocumentError, UnknownRunError
from specscope.backend.store.models import RUN_STATES
from specscope.backend.store.perfetto import perfetto_trace
from specscope.backend.store.store import Store

EXPORT_SCHEMA = 1
RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "run_id": (str,), "created_at": (str,), "mode": (str,), "model": (str, type(None)), "params": (dict,),
    "prompt": (str,), "status": (str,), "output": (str, type(None)), "metrics": (dict, type(None)),
    "n_rounds": (int,), "n_tokens": (int,),
}
OPTIONAL_RUN_FIELDS: dict[str, tuple[type, ...]] = {"server": (str, type(None)), "model_hash": (str, type(None)),
                                                    "sweep": (str, type(None)), "cell": (dict, type(None))}


def export_json(store: Store, run_id: str) -> dict[str, Any]:
    """{"schema": 1, "run": {...}, "events": [...]}: everything needed to rebuild the run elsewhere."""
    run = store.get_run(run_id)
    if run is None:
        raise UnknownRunError(f"no run {run_id}")
    return {"schema": EXPORT_SCHEMA, "run": run, "events": store.events(run_id)}


def import_json(store: Store, data: Any) -> str:
    """Store an exported run under its own id (RunExistsError if taken); returns the run id."""
    check_document(data)
    store.insert_run(data["run"], data["events"])
    return data["run"]["run_id"]


def export_perfetto(store: Store, run_id: str) -> dict[str, Any]:
    """The run as a Chrome Trace Event JSON object, for ui.perfetto.dev or chrome://tracing."""
    run = store.get_run(run_id)
    if run is None:
        raise UnknownRunError(f"no run {run_id}")
    return perfetto_trace(run, store.events(run_id))


def check_document(data: Any) -> None:
    """Raise DocumentError unless `data` looks like an export_json document (events are checked on insert)."""
    if not isinstance(data, dict) or set(data) != {"schema", "run", "events"}:
        raise DocumentError("an export is a JSON object with exactly the keys schema, run and events")
    if data["schema"] != EXPORT_SCHEMA:
        raise DocumentError(f"export schema {data['schema']!r} is not {EXPORT_SCHEMA}")
    run, events = data["run"], data["events"]
    if not isinstance(run, dict) or not set(RUN_FIELDS) <= set(run) <= set(RUN_FIELDS) | set(OPTIONAL_RUN_FIELDS):
        raise DocumentError(f"run must be an object with the keys {sorted(RUN_FIELDS)} (and optionally "
                            f"{sorted(OPTIONAL_RUN_FIELDS)})")
    for key, types in (RUN_FIELDS | OPTIONAL_RUN_FIELDS).items():
        if key in run and (not isinstance(run[key], types) or isinstance(run[key], bool)):
            raise DocumentError(f"run.{key} has the wrong type ({type(run[key]).__name__})")
    if run["status"] not in RUN_STATES:
        raise DocumentError(f"run.status {run['status']!r} is not one of {RUN_STATES}")
    try:
        datetime.fromisoformat(run["created_at"])
    except ValueError as exc:
        raise DocumentError(f"run.created_at {run['created_at']!r} is not an ISO date") from exc
    if not isinstance(events, list):
        raise DocumentError("events must be a list")
