"""What the server asks of the engine it serves, whether the engine runs in this process or in its own.

`LocalEngine` serves an Engine from a worker thread in this process (tests and embedding); `EngineProcess`
(engine_process.py) serves one from a process of its own, as `specscope serve` does. The routes and the websocket
sessions know only `EngineService`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from specscope.backend.engine.answer_fit import AnswerFit
from specscope.backend.engine.diverge import Probe, Rescored, rescore
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.messages import Prompt
from specscope.backend.model.checkpoint import CARD_FILE
from specscope.backend.server.protocol import MAX_QUEUED_RUNS
from specscope.backend.server.worker import Worker
from specscope.backend.tracing import RecordingTracer

RATE_TIMEOUT_S = 120.0
"""How long a rating may wait for the engine (it runs between two steps of the runs in flight)."""


@dataclass(frozen=True)
class ServedModel:
    """The served checkpoint as the routes show it (it changes when the model is switched)."""
    name: str
    folder: Path | None
    family: str
    weights_hash: str
    pieces: list[str]   # display text of every token id (/api/vocab)
    mask_token: bool = False      # whether the modes that draft with MASK can run
    card: Path | None = None      # its model_card.json, if it ships one
    matmul: str = "float32"       # the precision of its forwards' matmuls (Runtime.matmul)
    cost_curve: dict[str, Any] | None = None   # what its forwards cost by their rows here (CostCurve.to_json)
    forward: str = "fused"        # the forward backend that runs them (Runtime.backend_name: fused or torch)


def vocab_pieces(engine: Engine) -> list[str]:
    """Display text of every token id (the /api/vocab answer)."""
    tok = engine.rt.tokenizer
    return [tok.decode([i]) for i in range(len(tok))]


def served_model(engine: Engine) -> ServedModel:
    """Read before the engine is handed to a worker thread: the tokenizer is not shared between threads."""
    loaded = engine.rt.loaded
    return ServedModel(loaded.name, loaded.folder, loaded.family, loaded.weights_hash, vocab_pieces(engine),
                       loaded.mask_token_id is not None, loaded.shipped_file(CARD_FILE), engine.rt.matmul,
                       engine.cost_curve.to_json(), engine.rt.backend_name)


@dataclass
class Run:
    """A submitted generation: `admitted` holds None once the engine took it, or the ParamError that refused it;
    `cancel` ends it early (as a cancelled run: KV freed, run_end sent)."""
    admitted: Future[None]
    cancel: Callable[[], None]


class EngineService(Protocol):
    max_queued: int

    @property
    def model(self) -> ServedModel: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel every run (each ends as a cancelled run), then stop serving."""

    def submit(self, prompt: Prompt, mode: str, params: dict[str, Any], tracer: RecordingTracer) -> Run:
        """Queue a generation whose events go to `tracer.sink`, numbered under `tracer.run_id`; Busy when
        `max_queued` runs are already queued or running."""

    def switch(self, folder: str | Path) -> ServedModel:
        """Load `folder` and serve it once the current model's runs are cancelled; CheckpointError or ParamError
        when it cannot load (the current model stays)."""

    def rate(self, prompt_ids: list[int], answer: list[int]) -> AnswerFit:
        """The served model's greedy pick and NLL at each answer token (engine/answer_fit.py), made between two
        engine steps; ParamError for ids it cannot read, OutOfSlots when the runs leave no KV room for it."""

    def rescore(self, probes: list[Probe]) -> list[Rescored]:
        """Rows of stored runs re-scored by the served model (backend/engine/diverge.py), between two engine steps;
        OutOfSlots when the runs leave no KV room for them."""

    def stats(self) -> dict[str, Any]:
        """{"active": runs waiting or running, "held": runs submitted and not ended,
        "pool": {"used", "slots", "peak"}}."""

    def forwards(self, since: int, limit: int, replica: int = 0) -> list[dict[str, Any]]:
        """An engine's records of its forwards after id `since`, oldest first, at most `limit`: the engine replica's
        of that index (LookupError for one this service does not run; a single engine is replica 0)."""


def forward_records(worker: Worker, since: int, limit: int) -> list[dict[str, Any]]:
    """The engine side of `EngineService.forwards` (a copy: the engine's thread keeps appending)."""
    return [r for r in list(worker.engine.rt.log) if r["id"] > since][:limit]


def one_engine(replica: int) -> None:
    """A service of one engine has replica 0 only: LookupError for any other."""
    if replica:
        raise LookupError(f"no engine replica {replica}: this server runs one engine, replica 0")


def engine_stats(worker: Worker) -> dict[str, Any]:
    """The engine side of `EngineService.stats`; `held` is the submitter's count."""
    pool = worker.engine.rt.pool
    return {"active": worker.active, "held": worker.held,
            "pool": {"used": pool.used, "slots": pool.num_slots, "peak": pool.peak}}


class LocalEngine:
    """An Engine served by a worker thread of this process; `build` loads a checkpoint folder for `switch`. On the
    CPU its forwards run at about half the speed of the engine process's (`EngineProcess`, what `specscope serve`
    runs) once the loading thread has its own OpenMP team: `Worker.run` says why."""

    def __init__(self, engine: Engine, build: Callable[[str | Path], Engine] | None = None,
                 max_queued: int = MAX_QUEUED_RUNS):
        self.worker = Worker(engine, max_queued)
        self.max_queued = max_queued
        self.build = build
        self._model = served_model(engine)

    @property
    def model(self) -> ServedModel:
        return self._model

    def start(self) -> None:
        self.worker.start()

    def stop(self, timeout: float = 60.0) -> None:
        self.worker.stop(timeout)

    def submit(self, prompt: Prompt, mode: str, params: dict[str, Any], tracer: RecordingTracer) -> Run:
        cancel = threading.Event()
        admitted: Future[None] = Future()
        def settle(request: Future[Any]) -> None:
            exc = request.exception()
            admitted.set_result(None) if exc is None else admitted.set_exception(exc)

        self.worker.submit(prompt, mode, params, tracer, cancel).add_done_callback(settle)
        return Run(admitted, cancel.set)

    def switch(self, folder: str | Path) -> ServedModel:
        if self.build is None:
            raise RuntimeError("this server was given no way to load another model")
        engine = self.build(folder)
        model = served_model(engine)
        self.worker.replace_engine(engine).result()
        self._model = model
        return model

    def rate(self, prompt_ids: list[int], answer: list[int]) -> AnswerFit:
        return self.worker.rate(prompt_ids, answer).result(RATE_TIMEOUT_S)

    def rescore(self, probes: list[Probe]) -> list[Rescored]:
        return self.worker.call(partial(rescore, probes=probes)).result(RATE_TIMEOUT_S)

    def stats(self) -> dict[str, Any]:
        return engine_stats(self.worker)

    def forwards(self, since: int, limit: int, replica: int = 0) -> list[dict[str, Any]]:
        one_engine(replica)
        return forward_records(self.worker, since, limit)
