"""REST under /api: health, modes, vocab, runs (list, get, delete, rounds, KV intervals, export, the served model's
rating of a run's answer), import, comparisons, and the stored benchmark results (bench).

Handlers are plain functions, so FastAPI runs their store reads in its thread pool, off the event loop. Every
handler that reads or changes stored runs first waits until the events the server has taken are stored (the store
writer's `settle`; at once when it holds none), since /ws/generate sends run_end without waiting for that. While the
database does not answer, they are a 503 (StoreUnavailable), and /api/health says so.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Body, HTTPException, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from specscope.backend.engine.kv import OutOfSlots
from specscope.backend.engine.modes import describe_modes, picks
from specscope.backend.engine.params import ParamError
from specscope.backend.server.bench_here import BenchTimeout, bench_here
from specscope.backend.server.protocol import MAX_FORWARDS, MAX_INDEX, MAX_NEW_TOKENS
from specscope.backend.server.service import EngineService
from specscope.backend.server.worker import Busy
from specscope.backend.store import (
    DocumentError,
    RunExistsError,
    Store,
    StoreError,
    StoreUnavailable,
    StoreWriter,
    TraceError,
    UnknownRunError,
    export_json,
    export_perfetto,
    import_json,
)

Row = dict[str, Any]
BENCH_DIR = Path(__file__).resolve().parents[3] / "docs" / "bench"
BENCH_FILES = {"modes": "bench.json", "kernels": "kernels.json"}   # specscope bench, specscope bench-kernels


def read_bench(folder: Path) -> Row:
    """Each benchmark's JSON (None when it has not been run), and what was wrong with any unreadable one."""
    out: Row = {"folder": str(folder), "problems": []}
    for key, name in BENCH_FILES.items():
        path = folder / name
        out[key] = None
        if path.exists():
            try:
                out[key] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                out["problems"].append(f"{name}: {exc}")
    return out


def served_limits(mode: Row) -> Row:
    """A mode's description with max_new_tokens bounded by what this server accepts (MAX_NEW_TOKENS)."""
    params = [{**p, "max": min(p["max"], MAX_NEW_TOKENS)} if p["name"] == "max_new_tokens" else p
              for p in mode["params"]]
    return {**mode, "params": params}


class BenchHere(BaseModel):
    mode: str = Field(default_factory=lambda: picks("bench")[0], max_length=64)   # the mode Bench picks first


class NewComparison(BaseModel):
    label: str = Field("", max_length=256)
    prompt: str
    run_ids: list[str] = Field(min_length=1)


def api_router(store: Store, engine: EngineService, writer: StoreWriter, bench_dir: Path = BENCH_DIR) -> APIRouter:
    """The routes; the served model is always read through `engine` (it changes when the model is switched), and
    `writer` is the one storing the server's runs into `store`."""
    router = APIRouter(prefix="/api")
    settle = writer.settle

    def run_or_404(run_id: str) -> Row:
        settle()
        run = store.get_run(run_id)
        if run is None:
            raise HTTPException(404, f"no run {run_id}")
        return run

    @router.get("/health")
    def health() -> Row:
        try:
            stats = engine.stats()
        except RuntimeError as e:   # the engine process is gone
            raise HTTPException(503, str(e)) from None
        try:
            store.ping()
            outage = writer.outage_s
        except StoreUnavailable:
            outage = writer.outage_s or 0.0
        return {"status": "ok" if outage is None else "degraded", "model": engine.model.name,
                "active_runs": stats["active"], "queued_runs": stats["held"], "max_queued_runs": engine.max_queued,
                "pool": stats["pool"], "cost_curve": engine.model.cost_curve,
                **({"replicas": stats["replicas"]} if "replicas" in stats else {}),
                "store": {"status": "ok" if outage is None else "unavailable",
                          "unavailable_s": None if outage is None else round(outage, 1)}}

    @router.get("/forwards")
    def forwards(since: int = Query(0, ge=0, le=MAX_INDEX), limit: int = Query(500, ge=1, le=MAX_FORWARDS),
                 replica: int = Query(0, ge=0, le=MAX_INDEX)) -> Row:
        """The engine's latest forwards after id `since` (oldest first, at most `limit`): when, how long, the rows
        of each request and mode it served, and the KV pool's occupancy; `next` is the `since` of the next page.
        With engine replicas (`serve --ray`), replica `replica`'s (each counts its own forwards)."""
        try:
            records = engine.forwards(since, limit, replica)
        except LookupError as e:
            raise HTTPException(404, str(e)) from None
        except RuntimeError as e:
            raise HTTPException(503, str(e)) from None
        return {"forwards": records, "next": records[-1]["id"] if records else since}

    @router.get("/modes")
    def modes() -> list[Row]:
        """Every registered mode, and whether the served model can run it (`available`, else `unavailable`
        says why); max_new_tokens' bound is this server's cap."""
        return [served_limits(m) for m in describe_modes(mask_token=engine.model.mask_token)]

    @router.get("/model_card")
    def model_card() -> Row:
        """The served checkpoint's model card (model_card.json beside its weights: task families with example
        prompts, what is out of its domain); card None when it ships none."""
        model = engine.model
        card = json.loads(model.card.read_text()) if model.card is not None else None
        return {"model": model.name, "card": card, "cost_curve": model.cost_curve, "matmul": model.matmul}

    @router.get("/vocab")
    def vocab() -> Row:
        """Display text of every token id, as run_start's `pieces` shows the prompt's."""
        model = engine.model
        return {"model": model.name, "pieces": model.pieces}

    @router.get("/bench")
    def bench() -> Row:
        return read_bench(bench_dir)

    @router.post("/bench/here")
    def bench_on_this_server(body: BenchHere) -> Row:
        """A short benchmark on the served model (backend/server/bench_here.py): `ar` and `mode`, a few prompts of
        a few tokens each, one run at a time; 400 for a mode it cannot run, 503 when the engine is full or slow."""
        try:
            return bench_here(engine, body.mode)
        except ParamError as e:
            raise HTTPException(400, str(e)) from None
        except (Busy, BenchTimeout) as e:
            raise HTTPException(503, str(e)) from None

    @router.get("/runs")
    def list_runs(mode: str | None = None, status: str | None = None, limit: int = Query(50, ge=1, le=1000),
                  offset: int = Query(0, ge=0, le=MAX_INDEX),
                  sweep: str | None = Query(None, max_length=128)) -> list[Row]:
        """Stored runs, newest first (of one mode, status or sweep)."""
        settle()
        return store.list_runs(mode, status, limit, offset, sweep)

    @router.get("/runs/{run_id}")
    def get_run(run_id: str) -> Row:
        return run_or_404(run_id)

    @router.delete("/runs/{run_id}", status_code=204)
    def delete_run(run_id: str) -> Response:
        settle()
        try:
            deleted = store.delete_run(run_id)
        except StoreError as e:  # still being recorded
            raise HTTPException(409, str(e)) from None
        if not deleted:
            raise HTTPException(404, f"no run {run_id}")
        return Response(status_code=204)

    @router.get("/runs/{run_id}/rounds")
    def rounds(run_id: str, start: int = Query(0, ge=0, le=MAX_INDEX),
               stop: int | None = Query(None, ge=0, le=MAX_INDEX)) -> list[Row]:
        run_or_404(run_id)
        return store.rounds(run_id, start, stop)

    @router.get("/runs/{run_id}/fit")
    def fit(run_id: str) -> Row:
        """The served model's rating of the run's answer, teacher-forced on its prompt and answer: at each token
        its own greedy pick and the token's NLL, the share of tokens that are its pick, and the mean NLL."""
        run = run_or_404(run_id)
        if run["status"] == "running":
            raise HTTPException(409, f"run {run_id} is still running; rate it once it has ended")
        ends = {e["type"]: e for e in store.events_of_type(run_id, "run_start", "run_end")}
        if "run_start" not in ends or "run_end" not in ends:
            raise HTTPException(409, f"run {run_id} has no stored start and end to rate")
        served = engine.model
        if ends["run_start"].get("model_hash") != served.weights_hash:
            raise HTTPException(409, f"run {run_id} was made by {run['model']} (weights {run['model_hash']}); this "
                                     f"server serves {served.name} (weights {served.weights_hash}): switch to the "
                                     f"run's model to rate it")
        made_in = ends["run_start"].get("matmul", served.matmul)   # runs older than the field: as served
        if made_in != served.matmul:
            raise HTTPException(409, f"run {run_id} was made with {made_in} matmuls; this server's are "
                                     f"{served.matmul}, whose ratings of it would differ from its own numbers: "
                                     f"serve it with --matmul {made_in} to rate it")
        ran_on = ends["run_start"].get("forward", served.forward)   # runs older than the field: as served
        if ran_on != served.forward:
            raise HTTPException(409, f"run {run_id} ran on the {ran_on} forward; this server's is {served.forward}, "
                                     f"whose ratings of it would differ from its own numbers: serve it with "
                                     f"--forward {ran_on} to rate it")
        try:
            rated = engine.rate(ends["run_start"]["prompt_ids"], ends["run_end"]["output_ids"])
        except ParamError as e:
            raise HTTPException(400, str(e)) from None
        except OutOfSlots:
            raise HTTPException(503, "the runs in flight leave the KV pool no room to rate this run; try again "
                                     "when fewer are running") from None
        return {"run_id": run_id, "model": served.name, **rated.summary(), "picks": rated.picks, "nll": rated.nll}

    @router.get("/runs/{run_id}/forwards")
    def run_forwards(run_id: str) -> Row:
        """A stored run's forwards replayed: its engine's forwards from the run's first to its last, as /forwards
        showed them live, each with every stored run that took part; `runs` lists them, and `complete` says whether
        stored runs account for every forward and row of that span."""
        settle()
        replay = store.shared_forwards(run_id)
        if replay is None:
            raise HTTPException(404, f"no run {run_id}")
        return replay

    @router.get("/runs/{run_id}/kv")
    def kv(run_id: str) -> list[Row]:
        run_or_404(run_id)
        return store.kv_intervals(run_id)

    @router.get("/runs/{run_id}/export")
    def export(run_id: str, format: Literal["json", "perfetto"] = "json") -> JSONResponse:
        settle()
        try:
            doc = export_json(store, run_id) if format == "json" else export_perfetto(store, run_id)
        except UnknownRunError:
            raise HTTPException(404, f"no run {run_id}") from None
        name = re.sub(r"[^\w.-]", "_", run_id) + (".json" if format == "json" else ".perfetto.json")
        return JSONResponse(doc, headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @router.post("/import", status_code=201)
    def import_run(doc: Any = Body(...)) -> Row:
        try:
            return {"run_id": import_json(store, doc)}
        except RunExistsError as e:
            raise HTTPException(409, str(e)) from None
        except (DocumentError, TraceError) as e:
            raise HTTPException(422, str(e)) from None
        except (KeyError, TypeError) as e:  # an event without a field its type needs
            raise HTTPException(422, f"malformed event in the document: {type(e).__name__} {e}") from None

    @router.post("/comparisons", status_code=201)
    def new_comparison(body: NewComparison) -> Row:
        settle()
        try:
            comparison_id = store.create_comparison(body.label, body.prompt, body.run_ids)
        except UnknownRunError as e:
            raise HTTPException(404, str(e)) from None
        except ValueError as e:
            raise HTTPException(422, str(e)) from None
        comparison = store.get_comparison(comparison_id)
        assert comparison is not None, "a comparison just created is missing"
        return comparison

    @router.get("/comparisons")
    def comparisons() -> list[Row]:
        return store.list_comparisons()

    @router.get("/comparisons/{comparison_id}")
    def comparison(comparison_id: str) -> Row:
        found = store.get_comparison(comparison_id)
        if found is None:
            raise HTTPException(404, f"no comparison {comparison_id}")
        return found

    return router
