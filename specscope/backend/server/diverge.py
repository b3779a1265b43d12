"""GET /api/diverge?a=RUN&b=RUN: why two stored runs of one prompt differ (backend/engine/diverge.py), their rows
re-scored by the served engine between its steps. `stored_run` reads a run from the store for this route and for
`specscope diverge`."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query

from specscope.backend.engine.diverge import TOP_K, RunConfig, Served, diverge
from specscope.backend.engine.kv import OutOfSlots
from specscope.backend.server.service import EngineService
from specscope.backend.store import Store, StoreWriter

MAX_TOP = 20


class RunNotReady(LookupError):
    """A run the store does not hold, or holds without its start and end."""


def stored_run(store: Store, run_id: str) -> RunConfig:
    """The run's configuration and tokens as stored; RunNotReady for an unknown, running or unfinished run."""
    if store.get_run(run_id) is None:
        raise RunNotReady(f"no run {run_id}")
    ends = {e["type"]: e for e in store.events_of_type(run_id, "run_start", "run_end")}
    if "run_start" not in ends or "run_end" not in ends:
        raise RunNotReady(f"run {run_id} has no stored start and end (still running?)")
    return RunConfig.from_events(run_id, ends["run_start"], ends["run_end"], store.rounds(run_id))


def diverge_router(store: Store, engine: EngineService, writer: StoreWriter) -> APIRouter:
    """The route; the served model is read through `engine` (it changes when the model is switched)."""
    router = APIRouter(prefix="/api")

    @router.get("/diverge")
    def diverge_runs(a: str = Query(..., max_length=128), b: str = Query(..., max_length=128),
                     k: int = Query(TOP_K, ge=2, le=MAX_TOP)) -> dict[str, Any]:
        """The first output position where runs a and b differ (null when identical) and why: each side's row
        there re-scored in its own configuration (token, top-k logits, margin), each differing setting (matmul,
        adapter, path) swapped alone (`attribution`), `near_tie`, `lossless_claim` and `cause` in words."""
        writer.settle()
        try:
            runs = stored_run(store, a), stored_run(store, b)
        except RunNotReady as e:
            raise HTTPException(404 if str(e).startswith("no run") else 409, str(e)) from None
        served = engine.model
        try:
            return diverge(*runs, Served(served.name, served.weights_hash), engine.rescore, k)
        except OutOfSlots:
            raise HTTPException(503, "the runs in flight leave the KV pool no room to re-score; try again when "
                                     "fewer are running") from None

    return router
