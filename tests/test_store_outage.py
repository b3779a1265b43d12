"""A run store that stops answering mid-run (PostgreSQL stopped, then started again): no acknowledged run is lost,
reads say 503 meanwhile, and the server recovers without a restart. A PostgreSQL server of this module's own, so
stopping it touches no other test's database."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from support.postgres import Cluster, own_cluster
from support.store_runs import N_ROUNDS, PROMPT, finish, play_round, start

from specscope.backend.server import create_app
from specscope.backend.store import Store, StoreUnavailable, StoreWriter

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with own_cluster() as cluster:
        yield cluster


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_writer_waits_out_an_outage_and_stores_every_event_in_order(cluster: Cluster) -> None:
    store = Store(cluster.new_database(), batch_size=4)
    with StoreWriter(store) as writer:
        before = start(writer.put)           # begun and partly stored before the outage
        play_round(before, 0)
        writer.settle()
        cluster.pg_ctl("-m", "fast", "stop")
        with pytest.raises(StoreUnavailable):
            store.list_runs()
        play_round(before, 1)
        during = start(writer.put)           # begun while the database is down
        for r in range(N_ROUNDS):
            play_round(during, r)
        finish(during)
        wait_for(lambda: writer.outage_s is not None)
        with pytest.raises(StoreUnavailable):  # a read does not hang on an outage
            writer.settle()
        play_round(before, 2)
        finish(before)
        time.sleep(0.5)                      # a few failed tries, with backoff
        cluster.start()
        wait_for(lambda: writer.outage_s is None, timeout=60)  # its next try finds the database back
        writer.settle()
        assert not writer.failed
    for tracer in (before, during):
        assert store.events(tracer.run_id) == tracer.events
        assert store.get_run(tracer.run_id)["status"] == "done"
        assert len(store.rounds(tracer.run_id)) == N_ROUNDS
    store.close()


def test_server_answers_503_through_an_outage_and_recovers_without_restart(cluster: Cluster, engine) -> None:
    store = Store(cluster.new_database(), server="127.0.0.1:1")
    with TestClient(create_app(engine, store)) as client:
        assert client.get("/api/health").json()["store"]["status"] == "ok"
        cluster.pg_ctl("-m", "fast", "stop")
        health = client.get("/api/health").json()
        assert health["status"] == "degraded" and health["store"]["status"] == "unavailable"
        listed = client.get("/api/runs")
        assert listed.status_code == 503 and "does not answer" in listed.json()["detail"]
        with client.websocket_connect("/ws/generate") as ws:   # a run goes on while the store is down
            ws.send_json({"type": "generate", "prompt": PROMPT, "mode": "ar", "params": {"max_new_tokens": 6}})
            events = [ws.receive_json()]
            while events[-1]["type"] not in ("run_end", "error"):
                events.append(ws.receive_json())
        assert events[-1]["type"] == "run_end" and events[-1]["status"] == "done"
        chat = client.post("/v1/chat/completions", json={
            "model": engine.model_name, "max_tokens": 6, "messages": [{"role": "user", "content": PROMPT}]})
        assert chat.status_code == 200, chat.text
        v1_run = chat.headers["x-specscope-run-id"]
        late = client.get("/v1/models")
        assert late.status_code == 200       # what needs no store still answers
        assert client.get(f"/api/runs/{v1_run}").status_code == 503
        with client.websocket_connect(f"/ws/replay/{v1_run}") as replay:
            assert replay.receive_json()["code"] == "store_unavailable"
        cluster.start()
        run_id = events[0]["run_id"]
        wait_for(lambda: client.get(f"/api/runs/{run_id}").status_code == 200, timeout=60)
        assert client.get("/api/health").json()["store"] == {"status": "ok", "unavailable_s": None}
        assert store.events(run_id) == events
        assert client.get(f"/api/runs/{v1_run}").json()["status"] == "done"
        assert engine.rt.pool.used == 0
