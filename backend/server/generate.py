"""One /ws/generate connection: read client messages, run one generation at a time, stream its trace events."""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected

from backend.engine.params import ParamError
from backend.server.outbox import Outbox, SlowClient
from backend.server.protocol import Cancel, Generate, ProtocolError, error_event, parse_message
from backend.server.worker import Worker
from backend.store import Store
from backend.tracing import RecordingTracer, to_json

log = logging.getLogger(__name__)
WS_TRY_AGAIN_LATER = 1013


class RunSink:
    """Tracer sink of one live run, called on the worker thread: store the event, then pass it to the loop."""

    def __init__(self, store: Store, deliver: Callable[[dict[str, Any]], None], loop: asyncio.AbstractEventLoop):
        self.store = store
        self.deliver = deliver
        self.loop = loop
        self.storing = True

    def __call__(self, event: dict[str, Any]) -> None:
        if self.storing:
            try:
                self.store.record(event)
            except Exception:  # a store failure must not fail the run or the engine
                log.exception("storing run %s failed; it goes on unrecorded", event["run_id"])
                self.storing = False
        try:
            self.loop.call_soon_threadsafe(self.deliver, event)
        except RuntimeError:  # the event loop has closed: server shutdown
            pass


class GenerateSession:
    def __init__(self, ws: WebSocket, store: Store, worker: Worker):
        self.ws = ws
        self.store = store
        self.worker = worker
        self.outbox = Outbox()
        self.cancel: threading.Event | None = None  # the active run's cancel flag; None when idle

    async def serve(self) -> None:
        """Read and write concurrently until the client leaves or falls too far behind; then cancel its run."""
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._read, tasks.cancel_scope)
                tasks.start_soon(self._write, tasks.cancel_scope)
        finally:
            if self.cancel is not None:
                self.cancel.set()

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
                    self.cancel.set()
            else:
                await self._generate(msg)

    async def _write(self, scope: anyio.CancelScope) -> None:
        try:
            while True:
                event = await self.outbox.get()
                await self.ws.send_text(to_json(event))
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
        self.cancel = threading.Event()
        tracer = RecordingTracer(sink=RunSink(self.store, self._deliver, asyncio.get_running_loop()))
        try:
            await asyncio.wrap_future(self.worker.submit(msg.prompt, msg.mode, msg.params, tracer, self.cancel))
        except ParamError as e:
            self.cancel = None
            self.outbox.put(error_event("bad_params", str(e)))

    def _deliver(self, event: dict[str, Any]) -> None:
        self.outbox.put(event)
        if event["type"] == "run_end":
            self.cancel = None
