"""kill -9 of `specscope serve` mid-run, on SQLite and on PostgreSQL: once its lease expires the run is interrupted
with every event stored before the crash, marked by a restart on another port or by another live server (which
never marks a live peer's runs), the other runs are untouched, and the token never reached the logs."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.serve_process import OPTIONS, TOKEN, generate, receive, serving, wait_status
from websockets.exceptions import ConnectionClosed

from specscope.backend.store import Store
from specscope.backend.tracing import unfold

pytest_plugins = ["support.postgres"]  # the pg_cluster and store_url fixtures
pytestmark = [pytest.mark.extended, pytest.mark.slow]
CODE = "import os\n\n\nclass Config:\n    def __init__(self, path):\n        "
SETTLE_S = 2.0  # far above the StoreWriter's bound (interval_s = 0.05 plus one batch write)
LONG_RUN = "block_diffusion"  # 900 tokens of it take ~9 s on one core (ar's fused decode: ~1.5 s, too short)
LEASE_S = 2.0
LEASED = (*OPTIONS, "--lease-timeout", str(LEASE_S))
MARKED_WITHIN_S = 2 * LEASE_S + 3   # the timeout, a renewal beat (timeout / 5), a store write and REST polling


def snapshot(store_url: str, run_id: str) -> tuple[dict, list[dict]]:
    with Store(store_url) as store:
        return store.get_run(run_id), store.events(run_id)


def test_kill_9_mid_run_leaves_an_interrupted_run_with_its_stored_events(store_url: str, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serving(store_url, log, options=LEASED) as server:
        finished = generate(server, "What is 12 + 30?", max_new_tokens=8)
        server.get(f"/api/runs/{finished[0]['run_id']}")   # a REST read waits until the server has stored the run
        before = snapshot(store_url, finished[0]["run_id"])
        with server.ws("/ws/generate") as ws:
            ws.send(json.dumps({"type": "generate", "prompt": CODE, "mode": LONG_RUN,
                                "params": {"max_new_tokens": 900, "raw": True}}))
            streamed = receive(ws, "run_start")
            for _ in range(5):
                streamed += receive(ws, "round")
            emitted_before = len(streamed)  # these were emitted at least SETTLE_S before the kill
            settled = time.monotonic() + SETTLE_S
            while time.monotonic() < settled and streamed[-1]["type"] != "run_end":  # keep reading: a client
                streamed.append(json.loads(ws.recv(timeout=30)))  # that stops reading has rounds dropped
            _, stored_at_kill = snapshot(store_url, streamed[0]["run_id"])
            server.kill()
            try:
                while True:
                    streamed.append(json.loads(ws.recv(timeout=5)))
            except (ConnectionClosed, TimeoutError):  # the connection died with the server
                pass
    run_id = streamed[0]["run_id"]
    assert streamed[-1]["type"] != "run_end", "the run finished before the kill; make it longer"

    with serving(store_url, log, options=LEASED) as restarted:   # on another port: a new instance
        assert restarted.port != server.port
        wait_status(restarted, run_id, "interrupted", MARKED_WITHIN_S)
        run = restarted.get(f"/api/runs/{run_id}")
        assert run["server"].endswith(f":{server.port}")
        _, stored = snapshot(store_url, run_id)
        # the store and the client saw the same emitted records, each a prefix of them, nothing lost
        common = min(len(stored), len(streamed))
        assert stored[:common] == streamed[:common]
        assert [e["seq"] for e in unfold(stored)] == list(range(len(unfold(stored))))
        assert len(stored) >= max(emitted_before, len(stored_at_kill))
        assert run["n_rounds"] == sum(e["type"] == "round" for e in stored)
        assert restarted.get(f"/api/runs/{finished[0]['run_id']}") == before[0]
        assert snapshot(store_url, finished[0]["run_id"]) == before
        with restarted.ws(f"/ws/replay/{run_id}?speed=0") as ws:  # the stored part, why it ended, then closes
            replayed = []
            try:
                while True:
                    replayed.append(json.loads(ws.recv(timeout=30)))
            except ConnectionClosed:
                pass
        assert replayed[:-1] == stored
        assert (replayed[-1]["type"], replayed[-1]["code"], replayed[-1]["run_id"]) == ("error", "interrupted", run_id)
    text = log.read_text()
    assert "/ws/generate" in text and "token=***" in text  # uvicorn logged the requests, redacted
    assert TOKEN not in text


def long_run(ws) -> str:
    ws.send(json.dumps({"type": "generate", "prompt": CODE, "mode": LONG_RUN,
                        "params": {"max_new_tokens": 900, "raw": True}}))
    return receive(ws, "run_start")[0]["run_id"]


def read_for(sockets: list, seconds: float) -> list[dict]:
    """Keep reading every socket for `seconds` (a client that stops reading has rounds dropped)."""
    got, until = [], time.monotonic() + seconds
    while time.monotonic() < until:
        for ws in sockets:
            try:
                got.append(json.loads(ws.recv(timeout=0.02)))
            except TimeoutError:
                pass
    return got


def test_a_live_server_marks_a_killed_peers_run_and_never_a_live_ones(store_url: str, tmp_path: Path) -> None:
    with serving(store_url, tmp_path / "a.log", options=LEASED) as a, \
            serving(store_url, tmp_path / "b.log", options=LEASED) as b:
        with a.ws("/ws/generate") as on_a, b.ws("/ws/generate") as on_b:
            a_run, b_run = long_run(on_a), long_run(on_b)
            with b.ws(f"/ws/replay/{a_run}?speed=0") as follower:
                seen = read_for([on_a, on_b, follower], 1.5 * LEASE_S)   # past the timeout: both leases renewed
                assert not any(e["type"] == "run_end" for e in seen), "a run ended early; make it longer"
                assert [b.get(f"/api/runs/{r}")["status"] for r in (a_run, b_run)] == ["running", "running"]
                a.kill()
                assert wait_status(b, a_run, "interrupted", MARKED_WITHIN_S) <= MARKED_WITHIN_S
                while (event := json.loads(follower.recv(timeout=30)))["type"] != "error":
                    assert event["type"] != "run_end"
                assert (event["code"], event["run_id"]) == ("interrupted", a_run)
            assert b.get(f"/api/runs/{b_run}")["status"] == "running"   # b's own run goes on
            on_b.send(json.dumps({"type": "cancel"}))
            assert receive(on_b)[-1]["status"] == "cancelled"
