"""A real uvicorn server on a loopback port: concurrent websocket clients in mixed modes, each sees only its run."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.live_server import serving
from websockets.asyncio.client import connect

from specscope.backend.server import create_app
from specscope.backend.store import Store
from specscope.backend.tracing import unfold

MODES = ["ar", "block_diffusion", "linear_spec"]
CLIENTS = 8


@pytest.fixture
def served(engine, tmp_path: Path) -> Iterator[tuple[str, Store]]:
    """(host:port, store) of a live server, stopped (runs cancelled, worker joined) afterwards."""
    with Store(f"sqlite:///{tmp_path / 'specscope.db'}") as store, serving(create_app(engine, store)) as port:
        yield f"127.0.0.1:{port}", store


def strict(raw: str | bytes) -> dict[str, Any]:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} on the wire")
    return json.loads(raw, parse_constant=refuse)


async def one_run(address: str, i: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Client i: its generate request and every event it received up to run_end."""
    request = {"type": "generate", "prompt": f"What is {i} + {i + 3}?", "mode": MODES[i % len(MODES)],
               "params": {"max_new_tokens": 8 + i}}
    if request["mode"] != "ar":
        request["params"]["block_size"] = 4
    async with connect(f"ws://{address}/ws/generate") as ws:
        await ws.send(json.dumps(request))
        events = []
        async for raw in ws:
            events.append(strict(raw))
            if events[-1]["type"] in ("run_end", "error"):
                break
    return request, events


async def all_runs(address: str) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    return await asyncio.wait_for(asyncio.gather(*(one_run(address, i) for i in range(CLIENTS))), 120)


def test_concurrent_clients_each_get_only_their_own_run(served, engine):
    address, store = served
    results = asyncio.run(all_runs(address))
    listed = httpx.get(f"http://{address}/api/runs", params={"limit": 100}, timeout=10).json()   # REST reads wait
    assert len(listed) == CLIENTS   # for the store writer, so the database holds every run from here on

    run_ids = set()
    for request, events in results:
        assert events[0]["type"] == "run_start" and events[-1]["type"] == "run_end"
        assert events[-1]["status"] == "done"
        assert {e["run_id"] for e in events} == {events[0]["run_id"]}
        assert [e["seq"] for e in unfold(events)] == list(range(len(unfold(events))))
        assert events[0]["prompt"] == request["prompt"] and events[0]["mode"] == request["mode"]
        assert len(events[-1]["output_ids"]) <= request["params"]["max_new_tokens"]
        run_ids.add(events[0]["run_id"])
        assert store.events(events[0]["run_id"]) == events
    assert len(run_ids) == CLIENTS

    stored = store.list_runs(limit=100)
    assert {r["run_id"] for r in stored} == run_ids
    assert all(r["status"] == "done" for r in stored)
    assert engine.rt.pool.used == 0
    health = httpx.get(f"http://{address}/api/health", timeout=10).json()
    assert health["pool"]["used"] == 0 and health["active_runs"] == 0
