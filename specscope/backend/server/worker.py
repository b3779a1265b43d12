"""The one thread that owns the engine: it validates submissions, admits them and steps the scheduler.

Everything that touches the engine (tokenizer, scheduler, KV pool, model) runs here, never on the event loop.
Trace events leave through each request's tracer sink, called on this thread. Switching the served model
(`replace_engine`) happens here too, between steps, so a run only ever sees one engine.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from specscope.backend.engine.answer_fit import AnswerFit, answer_fit
from specscope.backend.engine.engine import Engine, freeze_long_lived
from specscope.backend.engine.messages import Prompt
from specscope.backend.engine.request import Request
from specscope.backend.server.protocol import MAX_QUEUED_RUNS
from specscope.backend.tracing import RecordingTracer, Tracer

log = logging.getLogger(__name__)


class Busy(Exception):
    """The server already holds its limit of queued and running runs."""


@dataclass
class Submission:
    prompt: Prompt
    mode: str
    params: dict[str, Any]
    tracer: Tracer
    cancel: threading.Event
    future: Future[Request] = field(default_factory=Future)


@dataclass
class Swap:
    """A new engine to serve once the current one has no runs left."""
    engine: Engine
    future: Future[Engine] = field(default_factory=Future)


@dataclass
class Rating:
    """A stored answer for the served model to rate (engine/answer_fit.py), between two steps."""
    prompt_ids: list[int]
    answer: list[int]
    future: Future[AnswerFit] = field(default_factory=Future)


@dataclass
class EngineCall:
    """Work on the served engine between two steps (re-scoring stored runs' rows: backend/engine/diverge.py)."""
    work: Callable[[Engine], Any]
    future: Future[Any] = field(default_factory=Future)


def end_failed_run(tracer: RecordingTracer, message: str) -> None:
    """End a run that cannot end itself: an error event, then run_end with status error."""
    tracer.emit("error", {"code": "run_failed", "message": message})
    tracer.emit("run_end", {"status": "error", "output_ids": [], "text": "", "metrics": {}})


def end_lost_run(tracer: RecordingTracer, message: str) -> None:
    """End a run whose engine replica died under it: an `interrupted` error event, then run_end with status
    interrupted (the replica held its tokens)."""
    tracer.emit("error", {"code": "interrupted", "message": message})
    tracer.emit("run_end", {"status": "interrupted", "output_ids": [], "text": "", "metrics": {}})


class Worker:
    def __init__(self, engine: Engine, max_queued: int = MAX_QUEUED_RUNS):
        self.engine = engine
        self.max_queued = max_queued
        self.active = 0  # requests waiting or running, as of the last step
        self._held = 0  # submissions not ended yet (inbox, waiting, running); guarded by _held_lock
        self._held_lock = threading.Lock()
        self._live: list[Request] = []  # admitted requests not finished yet (worker thread only)
        self._inbox: queue.SimpleQueue[Submission | Swap | Rating | EngineCall | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="specscope-engine", daemon=True)
        self._closed = False

    @property
    def held(self) -> int:
        """Runs submitted and not ended yet: in the inbox, waiting or running."""
        return self._held

    def start(self) -> None:
        """Step the engine on a thread of its own (`run` steps it on the calling thread instead)."""
        self._thread.start()

    def run(self) -> None:
        """Step the engine on the calling thread until `stop` (or `close`) and the runs it cancels have ended. The
        thread that loaded the model should call it: OpenMP keeps a thread team for each thread that opens a
        parallel region, and once two teams hold more threads than there are cores, libgomp's waiting threads spin
        ~3,000 times less before they sleep (its throttled spin count). A forward's short parallel regions then
        wake sleeping threads each time, and a run stepped on a thread other than the loader's runs far slower
        (docs/performance.md, "Serving")."""
        self._loop()

    def close(self) -> None:
        """Cancel every request and end the loop once they have ended, without waiting for it."""
        self._closed = True
        self._inbox.put(None)

    def submit(self, prompt: Prompt, mode: str, params: dict[str, Any], tracer: Tracer,
               cancel: threading.Event) -> Future[Request]:
        """Queue a generation; the future holds the admitted request, or the ParamError that refused it. Busy when
        `max_queued` runs are already queued or running."""
        if self._closed:
            raise RuntimeError("the server is shutting down")
        with self._held_lock:
            if self._held >= self.max_queued:
                raise Busy(f"the server has {self._held} runs queued or running, its limit; try again when one "
                           f"has ended")
            self._held += 1
        sub = Submission(prompt, mode, params, tracer, cancel)
        self._inbox.put(sub)
        return sub.future

    def replace_engine(self, engine: Engine) -> Future[Engine]:
        """Serve `engine` from now on: runs waiting or running on the current one are cancelled (each ends as a
        cancelled run, KV freed, run_end sent), then the engines are swapped; submissions after this call run on
        the new one. The future holds the new engine once it is served. Read what you need of `engine` (its
        tokenizer above all) before: from this call on it belongs to the worker thread."""
        if self._closed:
            raise RuntimeError("the server is shutting down")
        swap = Swap(engine)
        self._inbox.put(swap)
        return swap.future

    def rate(self, prompt_ids: list[int], answer: list[int]) -> Future[AnswerFit]:
        """The served model's rating of an answer (its greedy pick and NLL at each token), made between two steps:
        ParamError for ids it cannot read, OutOfSlots when the runs leave the KV pool no room for it."""
        if self._closed:
            raise RuntimeError("the server is shutting down")
        rating = Rating(prompt_ids, answer)
        self._inbox.put(rating)
        return rating.future

    def call(self, work: Callable[[Engine], Any]) -> Future[Any]:
        """`work(engine)` done between two steps on the engine's thread; the future holds what it returns or
        raises."""
        if self._closed:
            raise RuntimeError("the server is shutting down")
        call = EngineCall(work)
        self._inbox.put(call)
        return call.future

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel every request (each ends as a cancelled run, KV freed), then end the thread."""
        self.close()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        stopping = False
        while not stopping or self.engine.scheduler.has_work:
            for item in self._take(block=not self.engine.scheduler.has_work and not stopping):
                if item is None:
                    stopping = True
                    self._cancel_all("shutdown")
                elif isinstance(item, Swap):
                    self._swap(item)
                elif isinstance(item, Rating):
                    self._rate(item)
                elif isinstance(item, EngineCall):
                    self._call(item)
                else:
                    self._admit(item)
            if self.engine.scheduler.has_work:
                self._step()

    def _swap(self, swap: Swap) -> None:
        """Cancel the current engine's runs, step until they have ended, then serve the new engine."""
        self._cancel_all("model_switch")
        while self.engine.scheduler.has_work:
            self._step()
        self.engine = swap.engine
        freeze_long_lived()   # the old engine's objects, frozen when it loaded, can be collected now
        swap.future.set_result(swap.engine)

    def _rate(self, rating: Rating) -> None:
        if not rating.future.set_running_or_notify_cancel():
            return
        try:
            rating.future.set_result(answer_fit(self.engine, rating.prompt_ids, rating.answer))
        except Exception as e:  # ParamError, OutOfSlots: the caller's to report
            rating.future.set_exception(e)

    def _call(self, call: EngineCall) -> None:
        if not call.future.set_running_or_notify_cancel():
            return
        try:
            call.future.set_result(call.work(self.engine))
        except Exception as e:  # ParamError, OutOfSlots: the caller's to report
            call.future.set_exception(e)

    def _take(self, block: bool) -> list[Submission | Swap | Rating | EngineCall | None]:
        """Everything in the inbox, waiting for the first item if `block`."""
        items = [self._inbox.get()] if block else []
        while not self._inbox.empty():   # this thread is the only reader: not empty means get() returns at once
            items.append(self._inbox.get())
        return items

    def _admit(self, sub: Submission) -> None:
        if not sub.future.set_running_or_notify_cancel():
            return self._release(1)
        try:
            req = self.engine.new_request(sub.prompt, sub.mode, sub.params, sub.tracer, sub.cancel)
        except Exception as e:  # ParamError for bad input; anything else is reported to the submitter too
            sub.future.set_exception(e)
            return self._release(1)
        if self._closed:
            req.cancel_reason = "shutdown"
            req.cancel.set()
        self.engine.scheduler.add(req)
        self._live.append(req)
        sub.future.set_result(req)

    def _release(self, n: int) -> None:
        with self._held_lock:
            self._held -= n

    def _cancel_all(self, reason: str) -> None:
        scheduler = self.engine.scheduler
        for req in [*scheduler.waiting, *scheduler.running]:
            req.cancel_reason = reason
            req.cancel.set()

    def _step(self) -> None:
        scheduler = self.engine.scheduler
        try:
            scheduler.step()
        except Exception:  # the scheduler fails runs itself, so this is a bug in it; keep the server alive
            log.exception("scheduler step failed; ending every run with an error")
            self._abandon_all()
        self.active = len(scheduler.waiting) + len(scheduler.running)
        ended = [r for r in self._live if r.finished]
        if ended:
            self._live = [r for r in self._live if not r.finished]
            self._release(len(ended))

    def _abandon_all(self) -> None:
        """End every admitted run with an error. A run the scheduler cannot end (finish raises, perhaps after it
        was dequeued) still gets its KV freed and a run_end, so no client waits forever and no slot stays held."""
        scheduler = self.engine.scheduler
        for req in self._live:
            if not req.finished:
                try:
                    scheduler.finish(req, "error")
                except Exception:
                    log.exception("could not end run %s cleanly", req.rid)
                    self.engine.rt.release_all(req, "error")
            tracer = req.tracer
            if isinstance(tracer, RecordingTracer) and not tracer.ended:
                req.status = "error"
                end_failed_run(tracer, "the scheduler failed; see the server log")
        scheduler.waiting.clear()
        scheduler.running.clear()
