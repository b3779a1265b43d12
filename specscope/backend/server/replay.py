"""/ws/replay/{run_id}: a run's events with their recorded timing, scaled by speed; a run still recording is
followed live (by polling the store, so it works for runs that another server on the same database records)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected, WebSocketState

from specscope.backend.server.protocol import ProtocolError, error_event, parse_replay_options
from specscope.backend.store import Store, StoreUnavailable
from specscope.backend.tracing import to_json

POLL_S = 0.1      # how often a followed run's new events are looked for
OUTAGE_POLL_S = 1.0  # how often a database that does not answer is tried again while following
PAGE = 2000       # events read per query
T = TypeVar("T")


class Pacer:
    """Sends each event at its recorded time (t_ms) divided by speed after the first one; never earlier than it
    arrives. Speed 0: at once."""

    def __init__(self, speed: float):
        self.speed = speed
        self.origin: tuple[float, float] | None = None  # (first t_ms, wall clock when it was sent)

    async def wait(self, t_ms: float) -> None:
        if self.origin is None:
            self.origin = (t_ms, time.monotonic())
        if self.speed > 0:
            due = self.origin[1] + (t_ms - self.origin[0]) / 1000 / self.speed
            await asyncio.sleep(max(0.0, due - time.monotonic()))


async def read(fn: Callable[..., T], *args: Any) -> T:
    """A store read off the event loop; while the database does not answer, the follow waits for it."""
    while True:
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreUnavailable:
            await asyncio.sleep(OUTAGE_POLL_S)


async def follow(ws: WebSocket, store: Store, run_id: str, since_seq: int, pacer: Pacer) -> None:
    """Send stored events from since_seq on; while the run is still recording, wait for more, until its run_end
    is sent or it stops recording without one (interrupted: then an `interrupted` error event ends the stream)."""
    next_seq = since_seq
    while True:
        events: list[dict[str, Any]] = await read(store.events, run_id, next_seq, PAGE)
        for event in events:
            await pacer.wait(event["t_ms"])
            await ws.send_text(to_json(event))
            if event["type"] == "run_end":
                return
        if events:
            next_seq = events[-1]["seq"] + 1
            continue
        run = await read(store.get_run, run_id)
        if run is None or run["status"] != "running":  # deleted, or ended: a last look for its final events
            if not await read(store.events, run_id, next_seq, 1):
                if run is not None and run["status"] == "interrupted":
                    await ws.send_text(to_json(interrupted(run)))
                return
            continue
        await asyncio.sleep(POLL_S)


def interrupted(run: dict[str, Any]) -> dict[str, Any]:
    """The end of a run that has no run_end: an error event (no seq: it was never emitted) that says why."""
    where = f" (server {run['server']})" if run.get("server") else ""
    return {**error_event("interrupted", f"run {run['run_id']} was interrupted: its server{where} stopped "
                                         f"without ending it"), "run_id": run["run_id"]}


async def replay(ws: WebSocket, store: Store, run_id: str, settle: Callable[[], object]) -> None:
    """Send events from since_seq on (following a run that is still recording), then close; a bad query or an
    unknown run gets one error event. `settle()` returns once the events this server has taken are stored."""
    try:
        opts = parse_replay_options(dict(ws.query_params))
        await asyncio.to_thread(settle)
        if await asyncio.to_thread(store.get_run, run_id) is None:
            raise ProtocolError("unknown_run", f"no run {run_id}")
    except StoreUnavailable as e:
        await ws.send_text(to_json(error_event("store_unavailable", str(e))))
        await ws.close()
        return
    except ProtocolError as e:
        await ws.send_text(to_json(e.event()))
        await ws.close()
        return
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(until_disconnect, ws, tasks.cancel_scope)
            await follow(ws, store, run_id, opts.since_seq, Pacer(opts.speed))
            tasks.cancel_scope.cancel()
        if ws.client_state == WebSocketState.CONNECTED:
            await ws.close()
    except (WebSocketDisconnect, WebSocketDisconnected):
        pass


async def until_disconnect(ws: WebSocket, scope: anyio.CancelScope) -> None:
    """Read (and ignore) client messages; when the client leaves, stop following for it."""
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass
    scope.cancel()
