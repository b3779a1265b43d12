"""Two `specscope serve` processes, each with its own engine, on one PostgreSQL database: every run shows in both
runs lists with the server that made it, runs compare across servers, and one server follows the other's live run."""
from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from support.serve_process import TOKEN, generate, receive, serving

pytest_plugins = ["support.postgres"]  # the pg_cluster fixture
pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.extended]
PROMPT = "What is 12 + 30?"


def test_two_servers_share_one_postgresql_store(pg_cluster, tmp_path: Path) -> None:
    db = pg_cluster.new_database()
    with serving(db, tmp_path / "a.log") as a, serving(db, tmp_path / "b.log") as b:
        on_a = generate(a, PROMPT, max_new_tokens=8)
        with a.ws("/ws/generate") as live, b.ws("/ws/generate") as other:
            live.send(json.dumps({"type": "generate", "prompt": PROMPT, "mode": "linear_spec",
                                  "params": {"max_new_tokens": 24, "block_size": 4}}))
            start = receive(live, "run_start")[0]
            other.send(json.dumps({"type": "generate", "prompt": PROMPT, "mode": "ar",
                                   "params": {"max_new_tokens": 8}}))
            wait_listed(b, start["run_id"])  # as a user would: the run shows in b's list, then b follows it
            with b.ws(f"/ws/replay/{start['run_id']}?speed=0") as follower:  # b follows a's run as it records
                followed = receive(follower)
            streamed = [start, *receive(live)]
            on_b = receive(other)
        assert followed == streamed

        ids = {on_a[0]["run_id"]: a.port, start["run_id"]: a.port, on_b[0]["run_id"]: b.port}
        for server in (a, b):
            runs = {r["run_id"]: r for r in server.get("/api/runs")}
            assert set(runs) == set(ids)
            assert {r: int(runs[r]["server"].rsplit(":", 1)[1]) for r in ids} == ids
            assert all(r["status"] == "done" for r in runs.values())
        made = httpx.post(f"{b.http}/api/comparisons", params={"token": TOKEN}, timeout=30,
                          json={"label": "a vs b", "prompt": PROMPT, "run_ids": [on_a[0]["run_id"], on_b[0]["run_id"]]})
        assert made.status_code == 201
        assert a.get(f"/api/comparisons/{made.json()['comparison_id']}") == made.json()
        assert a.get(f"/api/runs/{on_b[0]['run_id']}/rounds") == [e for e in on_b if e["type"] == "round"]


def wait_listed(server, run_id: str, timeout: float = 30.0) -> None:
    """Until the store (written by the other server's writer thread, ~50 ms behind) lists the run."""
    deadline = time.monotonic() + timeout
    while not any(r["run_id"] == run_id for r in server.get("/api/runs", limit=50)):
        assert time.monotonic() < deadline, f"{run_id} never appeared in the shared store"
        time.sleep(0.05)
