"""The engine in a process of its own (vLLM's EngineCore layout), as `specscope serve` runs it.

In one process the event loop, the store writer and the engine thread would share one GIL: every websocket frame
and store batch would make the engine wait (docs/performance.md, "Serving"). Here the
server process only receives, stores and streams events; the engine process runs the same `Worker` as
`LocalEngine` and sends each run's events over a pipe, a tracer's batch of them in one message.

Messages, server → engine: ("submit", sid, run_id, prompt, mode, params), ("cancel", sid), ("call", token, name,
arg) for "stats", "forwards", "rate", "rescore" and "switch", ("stop",). Engine → server: ("ready", ServedModel)
or ("failed", exception) once, then ("events", [(sid, event), ...]), ("admitted", sid, exception | None),
("reply", token, ok, value), ("stopped",). The engine process exits when the server's end of the pipe closes (a
killed server included).
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
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
from specscope.backend.server.protocol import MAX_QUEUED_RUNS
from specscope.backend.server.service import (
    RATE_TIMEOUT_S,
    Run,
    ServedModel,
    engine_stats,
    forward_records,
    one_engine,
    served_model,
)
from specscope.backend.server.worker import Busy, Worker, end_failed_run
from specscope.backend.tracing import RecordingTracer

log = logging.getLogger(__name__)
Event = dict[str, Any]
Build = Callable[[str | Path | None], Engine]   # None: the model the server was started with


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class Link(Protocol):
    """One end of the server-engine link: a pipe's Connection, or a Ray replica's pair of queues."""

    def send(self, message: Any) -> None: ...

    def recv(self) -> Any: ...


FLUSH_S = 0.05
"""A message goes at most every FLUSH_S: each run's tracer hands on its events in batches at least ~50 ms apart
(`RecordingTracer.hold_s`), and the batches of concurrent runs that end within FLUSH_S of the last message go with
the next one. Each message costs the engine thread more than its pickling, so a message per round would slow the
engine, and a shorter FLUSH_S costs more than it gains (measured: docs/performance.md, "Serving"). run_end and
errors go at once."""


# ---- the engine process ----

class Outbound:
    """The engine process's sending end. Trace events wait for the end of their tracer's batch (sent right after
    they were made, while they are still in cache), a run_end or an error; other messages flush what waits first,
    keeping order."""

    def __init__(self, conn: Link):
        self.conn = conn
        self._lock = threading.Lock()
        self._events: list[tuple[int, Event]] = []
        self._sent = 0.0

    def event(self, sid: int, event: Event) -> None:
        with self._lock:
            self._events.append((sid, event))
            if event["type"] in ("run_end", "error"):
                self._flush()

    def batch_end(self) -> None:
        with self._lock:
            if time.perf_counter() - self._sent >= FLUSH_S:
                self._flush()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._flush()
            self.conn.send(message)

    def _flush(self) -> None:
        if self._events:
            self.conn.send(("events", self._events))
            self._events = []
            self._sent = time.perf_counter()


class EngineSide:
    """Carries out the server's messages on the engine process's inbox thread; the main thread steps the engine."""

    def __init__(self, worker: Worker, build: Build, out: Outbound):
        self.worker = worker
        self.build = build
        self.out = out
        self.cancels: dict[int, threading.Event] = {}

    def submit(self, sid: int, run_id: str, prompt: Prompt, mode: str, params: dict[str, Any]) -> None:
        cancel = self.cancels[sid] = threading.Event()

        def sink(event: Event) -> None:
            if event["type"] == "run_end":
                self.cancels.pop(sid, None)
            self.out.event(sid, event)

        def admitted(f: Future[Any]) -> None:
            exc = f.exception()
            if exc is not None:
                self.cancels.pop(sid, None)
            self.out.send(("admitted", sid, None if exc is None else portable(exc)))

        # the server process keeps the run's events
        tracer = RecordingTracer(run_id, sink, keep=False, batch_end=self.out.batch_end)
        self.worker.submit(prompt, mode, params, tracer, cancel).add_done_callback(admitted)

    def cancel(self, sid: int) -> None:
        if (cancel := self.cancels.get(sid)) is not None:
            cancel.set()

    def call(self, token: int, name: str, arg: Any) -> None:
        """stats answers at once; switch, rate and rescore wait on a thread of their own, so cancels and submissions
        keep flowing."""
        if name == "stats":
            self._reply(token, lambda: engine_stats(self.worker))
        elif name == "forwards":
            self._reply(token, lambda: forward_records(self.worker, *arg))
        elif name == "rate":
            threading.Thread(target=self._reply, args=(token, lambda: self.worker.rate(*arg).result(RATE_TIMEOUT_S)),
                             daemon=True).start()
        elif name == "rescore":
            threading.Thread(target=self._reply, daemon=True, args=(
                token, lambda: self.worker.call(partial(rescore, probes=arg)).result(RATE_TIMEOUT_S))).start()
        else:
            threading.Thread(target=self._reply, args=(token, lambda: self._switch(arg)), daemon=True).start()

    def _switch(self, folder: str | Path) -> ServedModel:
        engine = self.build(folder)
        model = served_model(engine)
        self.worker.replace_engine(engine).result()
        return model

    def _reply(self, token: int, answer: Callable[[], Any]) -> None:
        try:
            self.out.send(("reply", token, True, answer()))
        except Exception as e:
            self.out.send(("reply", token, False, portable(e)))


def engine_main(conn: Link, build: Build) -> None:
    """The engine process: build the engine, serve the server's messages until "stop" or until the server is gone."""
    if threading.current_thread() is threading.main_thread():   # a Ray replica's actor thread may be another
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the whole process group: the server decides
    out = Outbound(conn)
    try:
        engine = build(None)
    except Exception as e:
        out.send(("failed", portable(e)))
        return
    worker = Worker(engine, max_queued=sys.maxsize)   # the server process enforces the limit
    side = EngineSide(worker, build, out)
    out.send(("ready", served_model(engine)))
    threading.Thread(target=receive, args=(conn, side), name="specscope-inbox", daemon=True).start()
    worker.run()   # on the thread that built the engine (Worker.run says why), until "stop"
    out.send(("stopped",))


def receive(conn: Link, side: EngineSide) -> None:
    """Hand the server's messages to `side` until "stop" (which closes the worker) or until the server is gone."""
    handlers: dict[str, Callable[..., None]] = {"submit": side.submit, "cancel": side.cancel, "call": side.call}
    while True:
        try:
            kind, *args = conn.recv()
        except (EOFError, OSError):   # the server is gone (killed, perhaps): nothing is left to serve
            os._exit(0)
        if kind == "stop":
            side.worker.close()
            return
        handlers[kind](*args)


# ---- the server process ----

@dataclass
class RunLink:
    """A run as the server process follows it: its tracer (which relays the engine's events) and its admission."""
    tracer: RecordingTracer
    admitted: Future[None]


class EngineProcess:
    """An `EngineService` whose engine runs in a child process; `build` (picklable) loads a checkpoint folder,
    or with None the model to start with."""

    def __init__(self, build: Build, max_queued: int = MAX_QUEUED_RUNS):
        self.build = build
        self.max_queued = max_queued
        self._model: ServedModel | None = None
        self._runs: dict[int, RunLink] = {}
        self._calls: dict[int, Future[Any]] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._conn: Link | None = None
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._reader: threading.Thread | None = None
        self._gone = False

    @property
    def model(self) -> ServedModel:
        assert self._model is not None, "the engine process has not started"
        return self._model

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Launch the engine and wait until it serves; raise what its build raised. Once only: a second call (the
        app's lifespan after `specscope serve` started it) does nothing."""
        if self._reader is not None:
            return
        self._conn = self._launch()
        try:
            kind, value = self._conn.recv()
        except EOFError:
            self._join(5)
            raise RuntimeError(f"the engine exited ({self._exit_status()})") from None
        if kind == "failed":
            self._join(5)
            raise value
        self._model = value
        self._gone = False
        self._reader = threading.Thread(target=self._receive, name="specscope-engine-link", daemon=True)
        self._reader.start()

    def stop(self, timeout: float = 60.0) -> None:
        if self._reader is None:
            return
        self._send_quietly(("stop",))
        self._reader.join(timeout)
        self._join(timeout)
        self._kill()

    # -- the transport: a child process and a pipe (a Ray replica overrides these) --
    def _launch(self) -> Link:
        """Start the engine; the server's end of its link."""
        ctx = multiprocessing.get_context("spawn")
        conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=engine_main, args=(child, self.build), name="specscope-engine",
                                 daemon=True)
        self._proc.start()
        child.close()
        return conn

    def _join(self, timeout: float) -> None:
        if self._proc is not None:
            self._proc.join(timeout)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()

    def _exit_status(self) -> str:
        return f"status {None if self._proc is None else self._proc.exitcode}"

    def submit(self, prompt: Prompt, mode: str, params: dict[str, Any], tracer: RecordingTracer) -> Run:
        if len(self._runs) >= self.max_queued:
            raise Busy(f"the server has {len(self._runs)} runs queued or running, its limit; try again when one "
                       f"has ended")
        sid = next(self._ids)
        link = self._runs[sid] = RunLink(tracer, Future())
        try:
            self._send(("submit", sid, tracer.run_id, prompt, mode, params))
        except BaseException:
            self._runs.pop(sid, None)
            raise
        return Run(link.admitted, lambda: self._send_quietly(("cancel", sid)))

    def switch(self, folder: str | Path) -> ServedModel:
        self._model = self._call("switch", folder, timeout=None)
        return self._model

    def rate(self, prompt_ids: list[int], answer: list[int]) -> AnswerFit:
        return self._call("rate", (prompt_ids, answer), timeout=RATE_TIMEOUT_S + 10)

    def rescore(self, probes: list[Probe]) -> list[Rescored]:
        return self._call("rescore", probes, timeout=RATE_TIMEOUT_S + 10)

    def stats(self) -> dict[str, Any]:
        return {**self._call("stats", None, timeout=30), "held": len(self._runs)}

    def forwards(self, since: int, limit: int, replica: int = 0) -> list[dict[str, Any]]:
        one_engine(replica)
        return self._call("forwards", (since, limit), timeout=30)

    def _call(self, name: str, arg: Any, timeout: float | None) -> Any:
        token = next(self._ids)
        answer = self._calls[token] = Future()
        try:
            self._send(("call", token, name, arg))
        except BaseException:
            self._calls.pop(token, None)
            raise
        return answer.result(timeout)

    def _send(self, message: tuple[Any, ...]) -> None:
        if self._gone or self._conn is None:
            raise RuntimeError("the engine process is not running; restart the server")
        with self._send_lock:
            self._conn.send(message)

    def _send_quietly(self, message: tuple[Any, ...]) -> None:
        try:
            self._send(message)
        except (OSError, RuntimeError):   # the engine is gone: its runs have ended already
            pass

    def _receive(self) -> None:
        """The link thread: hand each event to its run's sink, settle admissions and calls."""
        assert self._conn is not None
        while True:
            try:
                kind, *args = self._conn.recv()
            except (EOFError, OSError):
                self._join(5)
                log.error("the engine exited (%s); its runs end with an error", self._exit_status())
                break
            if kind == "events":
                for sid, event in args[0]:
                    self._deliver(sid, event)
            elif kind == "admitted":
                self._admitted(*args)
            elif kind == "reply":
                token, ok, value = args
                answer = self._calls.pop(token)
                answer.set_result(value) if ok else answer.set_exception(value)
            elif kind == "stopped":
                break
        self._orphan_all()

    def _deliver(self, sid: int, event: Event) -> None:
        self._runs[sid].tracer.relay(event)
        if event["type"] == "run_end":
            del self._runs[sid]

    def _admitted(self, sid: int, exc: BaseException | None) -> None:
        if exc is None:
            self._runs[sid].admitted.set_result(None)
        else:
            self._runs.pop(sid).admitted.set_exception(exc)

    def _orphan_all(self) -> None:
        """The engine is gone: every run it held ends (`_end_lost`: run_end sent), every call fails."""
        self._gone = True
        gone = RuntimeError("the engine process exited")
        for token in list(self._calls):
            self._calls.pop(token).set_exception(gone)
        for sid in list(self._runs):
            link = self._runs.pop(sid)
            if link.admitted.done():
                self._end_lost(link.tracer)
            else:
                link.admitted.set_exception(gone)

    def _end_lost(self, tracer: RecordingTracer) -> None:
        end_failed_run(tracer, "the engine process exited; see the server log")
