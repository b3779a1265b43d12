"""One /ws/generate connection: read client messages, run one generation at a time, stream its trace events."""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected

from specscope.backend.engine.params import ParamError
from specscope.backend.server.outbox import Outbox, SlowClient
from specscope.backend.server.prometheus import Watch
from specscope.backend.server.protocol import Cancel, Generate, ProtocolError, error_event, parse_message
from specscope.backend.server.service import EngineService
from specscope.backend.server.worker import Busy
from specscope.backend.store import StoreWriter, Tee
from specscope.backend.tracing import to_json

log = logging.getLogger(__name__)
Event = dict[str, Any]
Listener = Callable[[Event], None]
WS_TRY_AGAIN_LATER = 1013


class LoopHandoff:
    """A listener that hands a run's events to `deliver` on the event loop, in order, waking the loop at most once
    per record (a round with its KV operations folded in): an event that finds a hand-off already scheduled just
    joins it. It is called on the thread that receives the engine's events (the engine process's link thread, or
    the in-process worker, whose GIL per-event wake-ups taxed)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver: Listener):
        self.loop = loop
        self.deliver = deliver
        self._events: deque[Event] = deque()
        self._scheduled = False

    def __call__(self, event: Event) -> None:
        self._events.append(event)
        if self._scheduled:
            return
        self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the event loop has closed: server shutdown
            pass

    def _drain(self) -> None:
        self._scheduled = False   # before draining: an event appended from now on schedules a new drain
        while self._events:
            self.deliver(self._events.popleft())


class GenerateSession:
    def __init__(self, ws: WebSocket, writer: StoreWriter, engine: EngineService, watch: Watch, batch: bool = False):
        self.ws = ws
        self.writer = writer
        self.engine = engine
        self.watch = watch   # makes each run's metrics listener (server/prometheus.py)
        self.batch = batch   # every message a JSON array of the events ready (?frames=batch)
        self.outbox = Outbox()
        self.cancel: Callable[[], None] | None = None  # cancels the active run; None when idle

    async def serve(self) -> None:
        """Read and write concurrently until the client leaves or falls too far behind; then cancel its run."""
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._read, tasks.cancel_scope)
                tasks.start_soon(self._write, tasks.cancel_scope)
        finally:
            if self.cancel is not None:
                self.cancel()

    async def _read(self, scope: anyio.CancelScope) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                scope.cancel()
                return
            try:
                msg = parse_message(message["text"] if message.get("text") is not None else message["bytes"])
            except ProtocolError as e:
                self.outbox.put(e.event())
                continue
            if isinstance(msg, Cancel):
                if self.cancel is not None:
                    self.cancel()
            else:
                await self._generate(msg)

    async def _write(self, scope: anyio.CancelScope) -> None:
        try:
            while True:
                if self.batch:
                    await self.ws.send_text(to_json(await self.outbox.get_all()))
                else:
                    await self.ws.send_text(to_json(await self.outbox.get()))
        except SlowClient as e:
            log.warning("closing a slow /ws/generate client: %s", e)
            await self.ws.close(WS_TRY_AGAIN_LATER, "client too slow")
        except (WebSocketDisconnect, WebSocketDisconnected):
            pass
        scope.cancel()

    async def _generate(self, msg: Generate) -> None:
        if self.cancel is not None:
            self.outbox.put(error_event("busy", "a run is in progress on this connection; cancel it or wait "
                                                "for its run_end"))
            return
        tracer = Tee(self.writer, self.watch(), LoopHandoff(asyncio.get_running_loop(), self._deliver)).tracer()
        try:
            run = self.engine.submit(msg.conversation, msg.mode, msg.params, tracer)
            self.cancel = run.cancel
            await asyncio.wrap_future(run.admitted)
        except ParamError as e:
            self.cancel = None
            self.outbox.put(error_event("bad_params", str(e)))
        except Busy as e:
            self.cancel = None
            self.outbox.put(error_event("busy", str(e)))
        except Exception as e:  # an engine bug on this input: report it, keep the connection
            log.exception("generate failed before its run started")
            self.cancel = None
            self.outbox.put(error_event("internal", f"{type(e).__name__}: {e}"))

    def _deliver(self, event: Event) -> None:
        """run_end goes out as soon as it comes, not once the run is stored: the writer has it already, and every read
        of a stored run waits for what the writer holds (`StoreWriter.flush`), so a client that sees run_end can
        still read the run back at once."""
        self.outbox.put(event)
        if event["type"] == "run_end":
            self.cancel = None
