"""/ws/replay/{run_id}: a stored run's events with their recorded timing, scaled by speed."""
from __future__ import annotations

import asyncio

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketDisconnected

from backend.server.protocol import ProtocolError, parse_replay_options
from backend.store import Store
from backend.tracing import to_json


async def replay(ws: WebSocket, store: Store, run_id: str) -> None:
    """Send events from since_seq on, then close; a bad query or an unknown run gets one error event."""
    try:
        opts = parse_replay_options(dict(ws.query_params))
        if await asyncio.to_thread(store.get_run, run_id) is None:
            raise ProtocolError("unknown_run", f"no run {run_id}")
        events = await asyncio.to_thread(store.events, run_id, opts.since_seq)
    except ProtocolError as e:
        await ws.send_text(to_json(e.event()))
        await ws.close()
        return
    try:
        clock = events[0]["t_ms"] if events else 0.0
        for event in events:
            if opts.speed > 0:
                await asyncio.sleep(max(0.0, event["t_ms"] - clock) / opts.speed / 1000)
            clock = event["t_ms"]
            await ws.send_text(to_json(event))
        await ws.close()
    except (WebSocketDisconnect, WebSocketDisconnected):
        pass
