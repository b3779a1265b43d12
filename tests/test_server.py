"""The FastAPI server through TestClient: streaming, storage, replay, export, bad input, cancel, restart, auth."""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from specscope.app.trace import RunTrace
from specscope.backend import tracing
from specscope.backend.engine.cost_curve import FLAT, ROWS
from specscope.backend.engine.cost_measure import COST_PROMPT, machine_curve
from specscope.backend.engine.engine import Engine
from specscope.backend.server import BindError, check_bind, create_app
from specscope.backend.server import app as app_module
from specscope.backend.server.logs import redact_tokens
from specscope.backend.server.outbox import Outbox, SlowClient
from specscope.backend.server.protocol import MAX_MESSAGE_BYTES, MAX_NEW_TOKENS, MAX_PROMPT_CHARS
from specscope.backend.store import Store, StoreWriter
from specscope.backend.tracing import RecordingTracer, unfold

pytest_plugins = ["support.postgres"]  # the pg_cluster and store_url fixtures
PROMPT = "What is 12 + 30?"
SERVER = "testhost:7860"
Event = dict[str, Any]


@pytest.fixture
def engine(shared_engine):
    """One engine for the module (conftest's shared_engine checks that each test leaves it clean)."""
    return shared_engine


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """The server's store, on SQLite, then on PostgreSQL; its runs are stamped as made by SERVER."""
    with Store(store_url, server=SERVER) as s:
        yield s


@pytest.fixture
def client(engine, store) -> Iterator[TestClient]:
    with TestClient(create_app(engine, store)) as c:
        yield c


class StepGate:
    """Lets the worker run a scheduler step only when the test says so, to make timing deterministic. Tracers made
    meanwhile hand each round on as it ends (tracing.HOLD_S 0): a paused engine makes no next round for a held one
    to wait for."""

    def __init__(self, scheduler, monkeypatch: pytest.MonkeyPatch):
        self._allowed = threading.Semaphore(0)
        self._open = False
        step = scheduler.step
        monkeypatch.setattr(tracing, "HOLD_S", 0.0)

        def gated_step():
            if not self._open:
                self._allowed.acquire()
            return step()

        monkeypatch.setattr(scheduler, "step", gated_step)

    def allow(self, steps: int = 1) -> None:
        self._allowed.release(steps)

    def open(self) -> None:
        self._open = True
        self._allowed.release()


@pytest.fixture
def gate(client, engine, monkeypatch) -> Iterator[StepGate]:
    """Set up after `client`, so it opens before the app shuts its worker down."""
    g = StepGate(engine.scheduler, monkeypatch)
    yield g
    g.open()


def receive_run(ws) -> list[Event]:
    """Events up to and including run_end."""
    events = [ws.receive_json()]
    while events[-1]["type"] != "run_end":
        events.append(ws.receive_json())
    return events


def generate(ws, mode: str = "ar", prompt: str = PROMPT, **params: Any) -> list[Event]:
    ws.send_json({"type": "generate", "prompt": prompt, "mode": mode, "params": {"max_new_tokens": 12, **params}})
    return receive_run(ws)


def assert_one_dense_run(events: list[Event]) -> None:
    """One run's records, its KV operations folded in, numbered densely with them."""
    assert events[0]["type"] == "run_start" and events[-1]["type"] == "run_end"
    assert len({e["run_id"] for e in events}) == 1
    assert [e["seq"] for e in unfold(events)] == list(range(len(unfold(events))))


def read_back(client: TestClient, run_id: str) -> Event:
    """The run as REST serves it right after its run_end. run_end does not wait for the store, but a REST read
    waits for the store writer, so from here on the database holds the whole run."""
    response = client.get(f"/api/runs/{run_id}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- generation, storage, replay -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["ar", "linear_spec"])
def test_generate_streams_and_stores_the_same_events(client, store, engine, mode):
    with client.websocket_connect("/ws/generate") as ws:
        events = generate(ws, mode)
    assert_one_dense_run(events)
    types = {e["type"] for e in events}
    assert "round" in types and "kv" not in types and all(e.get("kv") for e in events if e["type"] == "round")
    assert events[-1]["status"] == "done" and events[-1]["metrics"]["kv_leaked"] == 0
    run_id = events[0]["run_id"]
    run = read_back(client, run_id)
    assert store.events(run_id) == events
    assert run["status"] == "done" and run["mode"] == mode and run["prompt"] == PROMPT
    rounds = client.get(f"/api/runs/{run_id}/rounds").json()   # the rounds less their KV operations
    assert rounds == [e for e in unfold(events) if e["type"] == "round"]
    assert client.get(f"/api/runs/{run_id}/rounds", params={"start": 1, "stop": 2}).json() == rounds[1:2]
    assert client.get(f"/api/runs/{run_id}/kv").json()
    assert engine.rt.pool.used == 0


def replayed(c: TestClient, run_id: str) -> list[Event]:
    with c.websocket_connect(f"/ws/replay/{run_id}?speed=0") as ws:
        return receive_run(ws)


READS_OF_A_RUN = {   # each read of a stored run: what it shows, and what it shows of a whole run's events
    "run": (lambda c, run_id: c.get(f"/api/runs/{run_id}").json()["status"], lambda events: "done"),
    "list": (lambda c, run_id: [r["status"] for r in c.get("/api/runs").json() if r["run_id"] == run_id],
             lambda events: ["done"]),
    "rounds": (lambda c, run_id: c.get(f"/api/runs/{run_id}/rounds").json(),
               lambda events: [e for e in unfold(events) if e["type"] == "round"]),
    "kv": (lambda c, run_id: len(c.get(f"/api/runs/{run_id}/kv").json()),
           lambda events: sum(len(e["slots"]) for e in unfold(events) if e["type"] == "kv" and e["op"] == "alloc")),
    "export": (lambda c, run_id: c.get(f"/api/runs/{run_id}/export").json()["events"], lambda events: events),
    "replay": (replayed, lambda events: events),
}


@pytest.mark.parametrize("read", sorted(READS_OF_A_RUN))
def test_every_read_right_after_run_end_sees_the_whole_run(engine, store, monkeypatch, read):
    """run_end goes out without waiting for the store; each read of a run waits for the store writer instead.
    Here the writer writes a batch every 5 s at most, so a read that did not wait would find the run still
    recording (only its run_start stored)."""
    monkeypatch.setattr(app_module, "StoreWriter", functools.partial(StoreWriter, interval_s=5.0))
    shown, whole = READS_OF_A_RUN[read]
    with TestClient(create_app(engine, store)) as c:
        with c.websocket_connect("/ws/generate") as ws:
            events = generate(ws, "ar", max_new_tokens=8)
        assert shown(c, events[0]["run_id"]) == whole(events)


def test_a_round_arrives_as_one_frame_and_is_stored_as_one_record(client, store, engine):
    """One record per round, engine to socket to store: each round is one websocket frame holding its KV
    operations (never a kv frame of its own), and one row of the store's events table, the frame as it was sent;
    unfolded, the records are the run's events as runs stored before the folding have them."""
    with client.websocket_connect("/ws/generate") as ws:
        ws.send_json({"type": "generate", "prompt": PROMPT, "mode": "linear_spec", "params": {"max_new_tokens": 16}})
        frames = [ws.receive_text()]
        while '"type":"run_end"' not in frames[-1]:
            frames.append(ws.receive_text())
    events = [json.loads(f) for f in frames]
    assert all(isinstance(e, dict) for e in events) and [e["type"] for e in events].count("kv") == 0
    rounds = [e for e in events if e["type"] == "round"]
    assert len(rounds) == len(events) - 2 and all(r["kv"] for r in rounds)
    assert {op["op"] for r in rounds for op in r["kv"]} >= {"alloc", "commit"}
    run_id = events[0]["run_id"]
    run = read_back(client, run_id)
    assert store.events(run_id) == events      # a row per frame, each the frame as sent
    assert run["n_rounds"] == len(rounds)
    kv = client.get(f"/api/runs/{run_id}/kv").json()
    assert len(kv) == sum(len(op["slots"]) for r in events for op in r.get("kv") or () if op["op"] == "alloc")
    assert all(iv["free_round"] is not None for iv in kv)       # the final frees came folded into run_end
    assert [op["reason"] for op in events[-1]["kv"]] == ["finished"]


def test_a_run_stored_before_the_folding_still_replays(client, store):
    """A run stored as the server stored runs before KV operations were folded into records (a kv event of its
    own per operation) replays exactly as stored, and reads back alike: rounds, KV intervals, the UI's trace."""
    with client.websocket_connect("/ws/generate") as ws:
        folded = generate(ws, "ar", max_new_tokens=8)
    read_back(client, folded[0]["run_id"])
    run_id = "r_" + "1" * 16
    old = [{**e, "run_id": run_id} for e in unfold(folded)]
    for e in old:
        store.record(e)
    assert [e["type"] for e in old].count("kv") > 0
    assert replayed(client, run_id) == old
    with client.websocket_connect(f"/ws/replay/{run_id}?speed=0&since_seq={old[4]['seq']}") as ws:
        assert receive_run(ws) == old[4:]
    rounds = client.get(f"/api/runs/{run_id}/rounds").json()
    assert rounds == [{**e, "run_id": run_id} for e in client.get(f"/api/runs/{folded[0]['run_id']}/rounds").json()]
    assert client.get(f"/api/runs/{run_id}/kv").json() == client.get(f"/api/runs/{folded[0]['run_id']}/kv").json()
    new, before = RunTrace.from_events(folded), RunTrace.from_events(old)
    assert (before.rounds, before.text, before.status, before.next_seq) == (
        [{**r, "run_id": run_id} for r in new.rounds], new.text, new.status, new.next_seq)


def test_batched_frames_carry_the_same_events_as_arrays(client, store):
    """?frames=batch: every message is a JSON array of events, in order; together they are the run's events as a
    one-event-per-message client gets them (and as stored), and a bad query gets an error event before it closes."""
    with client.websocket_connect("/ws/generate?frames=batch") as ws:
        ws.send_json({"type": "generate", "prompt": PROMPT, "mode": "ar", "params": {"max_new_tokens": 24}})
        frames = [ws.receive_json()]
        while frames[-1][-1]["type"] != "run_end":
            frames.append(ws.receive_json())
        ws.send_json({"type": "nonsense"})   # errors outside a run come as arrays too
        assert ws.receive_json()[0]["type"] == "error"
    assert all(isinstance(f, list) and f for f in frames)
    events = [e for f in frames for e in f]
    assert_one_dense_run(events)
    read_back(client, events[0]["run_id"])
    assert store.events(events[0]["run_id"]) == events
    with client.websocket_connect("/ws/generate") as ws:
        single = generate(ws, max_new_tokens=24)

    def content(run: list[Event]) -> list[Event]:   # what two runs of one prompt share
        return [{k: v for k, v in e.items() if k not in ("run_id", "t_ms", "phases", "metrics", "slots")}
                for e in unfold(run)]
    assert content(events) == content(single)
    with client.websocket_connect("/ws/generate?frames=lots") as ws:
        error = ws.receive_json()
        assert error["type"] == "error" and error["code"] == "bad_request" and "frames" in error["message"]
        with pytest.raises(WebSocketDisconnect):
            ws.receive_json()


def test_socket_runs_one_generation_after_another(client):
    with client.websocket_connect("/ws/generate") as ws:
        first, second = generate(ws, "block_diffusion", block_size=4), generate(ws, "ar", max_new_tokens=8)
    assert_one_dense_run(first)
    assert_one_dense_run(second)
    assert first[0]["run_id"] != second[0]["run_id"]


def test_replay_streams_the_stored_events_in_order(client):
    with client.websocket_connect("/ws/generate") as ws:
        events = generate(ws, "linear_spec", block_size=4)
    run_id = events[0]["run_id"]
    with client.websocket_connect(f"/ws/replay/{run_id}?speed=0") as ws:
        assert receive_run(ws) == events
        with pytest.raises(WebSocketDisconnect):
            ws.receive_json()
    with client.websocket_connect(f"/ws/replay/{run_id}?speed=0&since_seq=5") as ws:
        assert receive_run(ws) == [e for e in events if e["seq"] >= 5]


def test_replay_keeps_recorded_timing_scaled_by_speed(client):
    with client.websocket_connect("/ws/generate") as ws:
        events = generate(ws, "ar", max_new_tokens=8)
    span_s = (events[-1]["t_ms"] - events[0]["t_ms"]) / 1000
    start = time.monotonic()
    with client.websocket_connect(f"/ws/replay/{events[0]['run_id']}?speed=2") as ws:
        assert receive_run(ws) == events
    assert time.monotonic() - start >= span_s / 2 * 0.9


def test_replay_of_an_unknown_run_or_bad_query_sends_one_error(client):
    for url, code in [("/ws/replay/r_nope", "unknown_run"), ("/ws/replay/r_nope?speed=-1", "bad_query"),
                      (f"/ws/replay/r_nope?since_seq={2**63}", "bad_query")]:
        with client.websocket_connect(url) as ws:
            event = ws.receive_json()
            assert event["type"] == "error" and event["code"] == code
            with pytest.raises(WebSocketDisconnect):
                ws.receive_json()


def test_indexes_past_the_stores_integers_are_refused(client):
    """An offset, round or seq no integer column holds is a 422, not the database's overflow as a 500."""
    for url in (f"/api/runs?offset={2**63}", f"/api/runs/r_nope/rounds?start={2**40}",
                f"/api/runs/r_nope/rounds?stop={2**40}"):
        assert client.get(url).status_code == 422, url


def test_replay_follows_a_run_that_is_still_recording(client, gate, store):
    """Opened after run_start, the replay gets what is stored, then each round as the engine makes it."""
    with client.websocket_connect("/ws/generate") as gen:
        gen.send_text(gen_msg(max_new_tokens=6))
        run_id = gen.receive_json()["run_id"]
        wait_for(lambda: store.get_run(run_id) is not None)
        with client.websocket_connect(f"/ws/replay/{run_id}?speed=0") as follower:
            followed = [follower.receive_json()]
            assert followed[0]["type"] == "run_start"
            gate.allow()  # one scheduler step: the prefill round arrives while the run is still going
            followed.append(follower.receive_json())
            while followed[-1]["type"] != "round":
                followed.append(follower.receive_json())
            assert store.get_run(run_id)["status"] == "running"
            gate.open()
            followed += receive_run(follower)
            with pytest.raises(WebSocketDisconnect):
                follower.receive_json()
        generated = receive_run(gen)
    assert followed == [e for e in store.events(run_id)] and followed[1:] == generated
    with client.websocket_connect(f"/ws/replay/{run_id}?speed=0&since_seq=3") as late:
        assert receive_run(late) == [e for e in followed if e["seq"] >= 3]


def test_replay_of_a_run_that_stops_recording_without_run_end_closes(client, store, store_url):
    """A server that crashed mid-run: the follower gets the stored events, then an `interrupted` error once a
    restart on the same host:port has marked the run, and is closed."""
    crashed = RecordingTracer(sink=(dead := Store(store_url, server="elsewhere:1")).record)
    crashed.emit("run_start", {"mode": "ar", "params": {}, "model": "tiny", "prompt": PROMPT, "prompt_ids": [1],
                               "pieces": ["W"]})
    crashed.emit("error", {"code": "x", "message": "still going"})
    dead.flush()
    with client.websocket_connect(f"/ws/replay/{crashed.run_id}?speed=0") as follower:
        assert [follower.receive_json(), follower.receive_json()] == crashed.events
        restarted = Store(store_url, server="elsewhere:1")
        assert restarted.mark_interrupted() == [crashed.run_id]
        restarted.close()
        notice = follower.receive_json()
        assert (notice["type"], notice["code"], notice["run_id"]) == ("error", "interrupted", crashed.run_id)
        assert "elsewhere:1" in notice["message"]
        with pytest.raises(WebSocketDisconnect):
            follower.receive_json()
    dead.engine.dispose()


def start_run(store: Store, prompt: str = PROMPT) -> str:
    """A run that `store`'s server began (run_start stored) and never ended."""
    tracer = RecordingTracer(sink=store.record)
    tracer.emit("run_start", {"mode": "ar", "params": {}, "model": "tiny", "prompt": prompt, "prompt_ids": [1],
                              "pieces": ["W"]})
    store.flush()
    return tracer.run_id


def test_leases_mark_the_runs_of_a_server_whose_lease_expired_and_only_those(store_url):
    """Two live servers renew their leases and never mark each other's runs; once one stops renewing, the other
    marks its running runs interrupted (kept, derived), once."""
    with Store(store_url, server="a:1") as a, Store(store_url, server="b:2") as b:
        a.renew_lease()
        b.renew_lease()
        on_a, on_b = start_run(a), start_run(b)
        assert a.mark_interrupted(0.5) == [] and b.mark_interrupted(0.5) == []
        time.sleep(0.6)
        a.renew_lease()                                  # a lives on; b stopped renewing
        assert b.get_run(on_a)["status"] == "running"
        assert a.mark_interrupted(0.5) == [on_b] and b.mark_interrupted(0.5) == []
        assert a.mark_interrupted(0.5) == []             # marked once
        assert [a.get_run(r)["status"] for r in (on_a, on_b)] == ["running", "interrupted"]
        a.drop_lease()                                   # a clean shutdown gives its lease up at once
        b.renew_lease()
        assert b.mark_interrupted(60) == [on_a]


def test_a_live_follower_of_a_dead_servers_run_gets_interrupted_within_the_lease_timeout(engine, store_url):
    timeout = 1.0
    with Store(store_url, server="dead:1") as dead:
        dead.renew_lease()
        run_id = start_run(dead)
        with Store(store_url, server="live:2") as store, \
                TestClient(create_app(engine, store, lease_timeout_s=timeout)) as c, \
                c.websocket_connect(f"/ws/replay/{run_id}?speed=0") as follower:
            assert follower.receive_json()["type"] == "run_start"
            started = time.monotonic()
            notice = follower.receive_json()
            assert time.monotonic() - started < 2 * timeout + 1
            assert (notice["code"], notice["run_id"]) == ("interrupted", run_id)
            assert c.get(f"/api/runs/{run_id}").json()["status"] == "interrupted"


# -- bad input, busy, cancel, disconnect ---------------------------------------------------------------------------

def gen_msg(mode: str = "ar", prompt: str = PROMPT, **params: Any) -> str:
    return json.dumps({"type": "generate", "prompt": prompt, "mode": mode, "params": params})


BAD_INPUT = [
    ("{not json", "bad_json", "JSON"),
    ('{"type": "launch"}', "bad_message", "launch"),
    ('{"type": "generate", "mode": "ar"}', "bad_message", "prompt"),
    ("x" * (MAX_MESSAGE_BYTES + 1), "too_large", str(MAX_MESSAGE_BYTES)),
    (gen_msg(prompt="a" * (MAX_PROMPT_CHARS + 1)), "bad_message", "prompt"),
    (gen_msg(max_new_tokens=MAX_NEW_TOKENS + 1), "bad_message", "max_new_tokens"),
    (gen_msg(mode="warp_drive"), "bad_params", "warp_drive"),
    (gen_msg(mode="block_diffusion", block_size=0), "bad_params", "block_size"),
    (gen_msg(temperature=-1), "bad_params", "temperature"),
    (gen_msg(top_k=5), "bad_params", "top_k"),
    (gen_msg(prompt="   "), "bad_params", "prompt"),
]


def test_bad_input_gets_error_events_and_the_socket_stays_usable(client, store):
    with client.websocket_connect("/ws/generate") as ws:
        for raw, code, named in BAD_INPUT:
            ws.send_text(raw)
            event = ws.receive_json()
            assert event["type"] == "error" and event["code"] == code, (raw[:80], event)
            assert named in event["message"], event
        ws.send_bytes(b"\xff\xfe")
        assert ws.receive_json()["code"] == "bad_json"
        ws.send_json({"type": "cancel"})  # nothing to cancel: no reply
        events = generate(ws, "ar", max_new_tokens=8)
    assert_one_dense_run(events)
    assert [r["run_id"] for r in client.get("/api/runs").json()] == [events[0]["run_id"]]


def test_second_generate_while_busy_is_refused_and_cancel_stops_the_run(client, gate, store, engine):
    with client.websocket_connect("/ws/generate") as ws:
        ws.send_text(gen_msg(max_new_tokens=64))
        start = ws.receive_json()
        assert start["type"] == "run_start"
        ws.send_text(gen_msg(max_new_tokens=8))
        busy = ws.receive_json()
        assert busy["type"] == "error" and busy["code"] == "busy"
        ws.send_json({"type": "cancel"})
        held = [*engine.scheduler.running, *engine.scheduler.waiting]
        deadline = time.monotonic() + 30     # the server takes the cancel on its own task: let it land first
        while not any(r.cancel.is_set() for r in held) and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.open()
        events = [start, *receive_run(ws)]
    assert_one_dense_run(events)
    assert events[-1]["status"] == "cancelled" and events[-1]["reason"] == "client"
    assert len(events[-1]["output_ids"]) < 64
    assert read_back(client, start["run_id"])["status"] == "cancelled"
    assert engine.rt.pool.used == 0


def test_server_wide_bound_on_queued_runs(engine, store, monkeypatch):
    """With max_queued=2, a third concurrent run (on any connection) gets `busy`; once one ends there is room."""
    with TestClient(create_app(engine, store, max_queued=2)) as c:
        gate = StepGate(engine.scheduler, monkeypatch)
        try:
            with c.websocket_connect("/ws/generate") as a, c.websocket_connect("/ws/generate") as b, \
                    c.websocket_connect("/ws/generate") as third:
                a.send_text(gen_msg(max_new_tokens=4))
                assert a.receive_json()["type"] == "run_start"  # admitted; the worker now waits in its first step
                b.send_text(gen_msg(max_new_tokens=4))  # queued in the worker's inbox
                wait_for(lambda: c.get("/api/health").json()["queued_runs"] == 2)
                third.send_text(gen_msg(max_new_tokens=4))
                busy = third.receive_json()
                assert busy["type"] == "error" and busy["code"] == "busy" and "limit" in busy["message"]
                a.send_json({"type": "cancel"})
                gate.open()
                assert receive_run(a)[-1]["status"] == "cancelled"
                assert receive_run(b)[-1]["status"] == "done"  # from its run_start on
                assert generate(third, max_new_tokens=4)[-1]["status"] == "done"
        finally:
            gate.open()
    assert engine.rt.pool.used == 0


def test_a_run_the_scheduler_cannot_end_still_ends_for_its_client(client, store, engine, monkeypatch):
    """A mode bug while ending a run (as isd's metrics had for a run cancelled before its first round): the client
    still gets run_end, the run is stored as an error, its KV is freed and it no longer counts as queued."""
    def broken_finish(req, status):
        raise RuntimeError("a mode bug while ending the run")

    monkeypatch.setattr(engine.scheduler, "finish", broken_finish)
    with client.websocket_connect("/ws/generate") as ws:
        events = generate(ws, "ar", max_new_tokens=4)
    assert_one_dense_run(events)
    assert events[-2]["code"] == "run_failed" and events[-1]["status"] == "error"
    assert read_back(client, events[0]["run_id"])["status"] == "error"
    assert engine.rt.pool.used == 0
    wait_for(lambda: client.get("/api/health").json()["queued_runs"] == 0)


def test_disconnect_mid_run_cancels_it_and_frees_its_kv(client, gate, store, engine):
    with client.websocket_connect("/ws/generate") as ws:
        ws.send_text(gen_msg(max_new_tokens=64))
        run_id = ws.receive_json()["run_id"]
        gate.allow()  # the prefill round
        while ws.receive_json()["type"] != "round":
            pass
        assert engine.rt.pool.used > 0
    gate.open()
    wait_for(lambda: (store.get_run(run_id) or {"status": "running"})["status"] != "running")   # not stored yet: wait
    run = store.get_run(run_id)
    assert run["status"] == "cancelled"
    assert store.events(run_id)[-1]["status"] == "cancelled"
    assert engine.rt.pool.used == 0


# -- backpressure ----------------------------------------------------------------------------------------------------

def event(seq: int, type_: str) -> Event:
    return {"seq": seq, "type": type_}


def test_outbox_drops_only_round_events_for_a_slow_client():
    stream = [event(0, "run_start"), *(event(s, "kv" if s % 5 == 1 else "round") for s in range(1, 21)),
              event(21, "run_end")]

    async def drain() -> list[Event]:
        box = Outbox(maxsize=8)
        for e in stream:
            box.put(e)
        assert box.dropped == len(stream) - 8
        return [await box.get() for _ in range(len(box))]

    got = asyncio.run(drain())
    assert [e["seq"] for e in got] == sorted(e["seq"] for e in got)
    durable = [e for e in stream if e["type"] != "round"]
    assert [e for e in got if e["type"] != "round"] == durable
    assert got[-2] == stream[-2]  # the newest round survives


def test_a_dropped_round_leaves_its_kv_operations_behind():
    """A slow client misses rounds, never KV operations: a dropped round's come as kv events of their own."""
    def record(seq: int, ops: int) -> Event:
        return {"v": 1, "run_id": "r_x", "seq": seq, "t_ms": 0.0, "type": "round",
                "kv": [{"seq": seq - ops + i, "t_ms": 0.0, "op": "alloc", "slots": [seq + i], "positions": [i],
                        "round": seq, "reason": None} for i in range(ops)]}

    async def drain() -> list[Event]:
        box = Outbox(maxsize=2)
        for seq in (2, 5, 8):
            box.put(record(seq, 2))
        return [await box.get() for _ in range(len(box))]

    got = asyncio.run(drain())
    assert [(e["type"], e["seq"]) for e in got] == [("kv", 0), ("kv", 1), ("round", 5), ("round", 8)]
    assert got[0] == {"v": 1, "run_id": "r_x", "seq": 0, "t_ms": 0.0, "type": "kv", "op": "alloc", "slots": [2],
                      "positions": [0], "round": 2, "reason": None}


def test_outbox_gives_up_on_a_client_too_far_behind():
    async def scenario() -> None:
        box = Outbox(maxsize=2, hard_limit=3)
        for seq in range(5):
            box.put(event(seq, "kv"))
        with pytest.raises(SlowClient):
            await box.get()

    asyncio.run(scenario())


# -- REST ------------------------------------------------------------------------------------------------------------

def test_health_and_the_model_card_say_how_the_cost_curve_was_measured(loaded, store, tmp_path):
    probe, kept = Engine(loaded, num_slots=512), tmp_path / "curves"
    measured = machine_curve(probe.rt, probe.encode_prompt(COST_PROMPT, raw=False), folder=kept,
                             load=lambda: 1000.0)          # a busy machine: used, not kept
    with TestClient(create_app(Engine(loaded, num_slots=512, cost_curve=measured), store)) as c:
        curve = c.get("/api/health").json()["cost_curve"]
        assert c.get("/api/model_card").json()["cost_curve"] == curve == measured.to_json()
    assert set(curve["ms"]) == {str(rows) for rows in ROWS} and curve["vs_one_row"]["1"] == 1.0
    p = curve["provenance"]
    assert p["source"] == "measured" and p["cached"] is False and p["busy"].startswith("load average 1000.00")
    assert p["load_before"] == p["load_after"] == 1000.0 and p["seconds"] > 0 and p["cpus"] >= 1 and p["threads"] >= 1
    assert not kept.exists()


def test_health_modes_and_index(client, engine):
    health = client.get("/api/health")
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok" and body["model"] == engine.model_name and body["pool"]["used"] == 0
    curve = body["cost_curve"]      # the engine's own, which its cost-aware rounds price rows with: flat, as given
    assert curve == engine.cost_curve.to_json() == client.get("/api/model_card").json()["cost_curve"]
    assert curve == FLAT.to_json() and "provenance" not in curve
    modes = {m["name"]: m for m in client.get("/api/modes").json()}
    assert {"ar", "block_diffusion", "linear_spec"} <= set(modes)
    params = {name: {p["name"] for p in m["params"]} for name, m in modes.items()}
    assert "max_new_tokens" in params["ar"]
    caps = {p["max"] for m in modes.values() for p in m["params"] if p["name"] == "max_new_tokens"}
    assert caps == {MAX_NEW_TOKENS}   # the bound the UI offers is what this server accepts, not the engine's
    assert {"block_size", "threshold"} <= params["block_diffusion"]
    assert {"block_size", "lora"} <= params["linear_spec"]
    pieces = client.get("/api/vocab").json()["pieces"]
    assert len(pieces) == len(engine.rt.tokenizer) and all(isinstance(p, str) for p in pieces)


def test_bench_serves_the_stored_benchmarks(client, tmp_path):
    from specscope.backend.server.api import BENCH_DIR, read_bench
    body = client.get("/api/bench").json()
    assert body["modes"] == json.loads((BENCH_DIR / "bench.json").read_text()) and body["problems"] == []
    (tmp_path / "bench.json").write_text("{not json")
    (tmp_path / "kernels.json").write_text(json.dumps({"rows": []}))
    found = read_bench(tmp_path)
    assert found["modes"] is None and found["kernels"] == {"rows": []}
    assert len(found["problems"]) == 1 and found["problems"][0].startswith("bench.json: ")
    assert read_bench(tmp_path / "missing") == {"folder": str(tmp_path / "missing"), "problems": [],
                                                 "modes": None, "kernels": None}
    page = client.get("/")
    assert page.status_code == 200 and "not installed" in page.text


def test_bench_here_runs_ar_and_a_mode_on_the_served_model(client, engine):
    """POST /api/bench/here: a few short runs of ar and the mode through the engine, measured on this machine with
    its precision named; nothing stored, nothing held; a mode it cannot run is a 400."""
    body = client.post("/api/bench/here", json={"mode": "linear_spec"}).json()
    assert set(body["modes"]) == {"ar", "linear_spec"} and body["matmul"] == engine.rt.matmul
    assert body["cpu"] and body["date"] and body["prompts"] >= 1 and body["max_new_tokens"] <= 64
    for m in body["modes"].values():
        assert m["tokens"] > 0 and m["tok_per_s"] > 0 and m["tpf"] == m["tokens"] / m["nfe"]
    assert body["modes"]["linear_spec"]["tpf"] > body["modes"]["ar"]["tpf"]
    assert client.get("/api/runs").json() == []
    assert client.post("/api/bench/here", json={"mode": "nope"}).status_code == 400


def test_the_ui_the_caller_passes_is_mounted(engine, store):
    mounted = []

    def mount_ui(app, backend_url, token=None):
        mounted.append((backend_url, token))
        app.get("/")(lambda: {"ui": "fake"})
        return app

    with TestClient(create_app(engine, store, backend_url="ws://127.0.0.1:9", ui=mount_ui)) as c:
        assert c.get("/").json() == {"ui": "fake"}
        assert c.get("/api/health").status_code == 200
    assert mounted == [("ws://127.0.0.1:9", None)]


def test_the_cli_composes_the_installed_ui(monkeypatch):
    """`specscope serve` mounts app/ui.py's UI, and serves without one where it cannot be imported."""
    from specscope.app.ui import mount_ui
    from specscope.backend.cli.serve import installed_ui
    assert installed_ui() is mount_ui
    monkeypatch.setitem(sys.modules, "specscope.app.ui", None)     # an import of app.ui now raises ImportError
    assert installed_ui() is None


def test_run_listing_filters_and_unknown_ids(client):
    with client.websocket_connect("/ws/generate") as ws:
        ar, bd = generate(ws, "ar", max_new_tokens=8), generate(ws, "block_diffusion", block_size=4)
    runs = client.get("/api/runs").json()
    assert [r["run_id"] for r in runs] == [bd[0]["run_id"], ar[0]["run_id"]]
    assert [(r["server"], r["model_hash"]) for r in runs] == [(SERVER, e[0].get("model_hash")) for e in (bd, ar)]
    assert [r["run_id"] for r in client.get("/api/runs", params={"mode": "ar"}).json()] == [ar[0]["run_id"]]
    assert client.get("/api/runs", params={"status": "cancelled"}).json() == []
    assert len(client.get("/api/runs", params={"limit": 1, "offset": 1}).json()) == 1
    assert client.get("/api/runs", params={"limit": 0}).status_code == 422
    for path in ("", "/rounds", "/kv", "/export"):
        assert client.get(f"/api/runs/r_nope{path}").status_code == 404, path
    assert client.delete("/api/runs/r_nope").status_code == 404
    assert client.get("/api/comparisons/c_nope").status_code == 404
    assert client.delete(f"/api/runs/{ar[0]['run_id']}").status_code == 204
    assert client.get(f"/api/runs/{ar[0]['run_id']}").status_code == 404


def test_fit_rates_a_runs_answer_by_the_served_model(client, store, engine):
    """GET /api/runs/{id}/fit: the served model's own greedy pick and NLL at each answer token. An ar run is its
    pick at every token; a block_diffusion run gets engine.answer_fit's figures on its stored ids; a run made by
    other weights or in another matmul precision and an unknown one are refused, and the KV pool is left as it
    was."""
    from specscope.backend.engine.answer_fit import answer_fit

    with client.websocket_connect("/ws/generate") as ws:
        ar, block = generate(ws, "ar"), generate(ws, "block_diffusion", block_size=4, threshold=0.0)
    rated = client.get(f"/api/runs/{ar[0]['run_id']}/fit").json()
    assert rated["picks"] == ar[-1]["output_ids"] and rated["greedy"] == rated["tokens"] == len(rated["nll"])
    assert rated["greedy_share"] == 1.0 and rated["nll_mean"] == pytest.approx(sum(rated["nll"]) / len(rated["nll"]))
    blocky = client.get(f"/api/runs/{block[0]['run_id']}/fit").json()
    want = answer_fit(engine, block[0]["prompt_ids"], block[-1]["output_ids"])   # the worker is idle between runs
    assert (blocky["picks"], blocky["greedy"]) == (want.picks, want.greedy)
    assert blocky["nll"] == pytest.approx(want.nll)
    assert engine.rt.pool.used == 0

    refused, _ = refit(client, ar[0]["run_id"], lambda start: start.update(model_hash="0ther"))
    assert refused.status_code == 409 and "switch to the run's model" in refused.json()["detail"]
    assert client.get("/api/runs/r_nope/fit").status_code == 404

    refused, start = refit(client, block[0]["run_id"],   # its matmuls in another precision
                           lambda start: start.update(matmul="bf16" if start["matmul"] == "float32" else "float32"))
    assert refused.status_code == 409 and f"serve it with --matmul {start['matmul']}" in refused.json()["detail"]


def refit(client: Any, run_id: str, change: Callable[[dict], Any]) -> tuple[Any, dict]:
    """The run's /fit once it is stored again with its run_start changed by `change` (exported, deleted and
    imported), and that run_start."""
    doc = strict_json(client.get(f"/api/runs/{run_id}/export").text)
    assert client.delete(f"/api/runs/{run_id}").status_code == 204
    change(doc["events"][0])
    assert client.post("/api/import", json=doc).status_code == 201
    return client.get(f"/api/runs/{run_id}/fit"), doc["events"][0]


def strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in JSON")
    return json.loads(text, parse_constant=refuse)


def test_export_round_trips_through_import_and_perfetto_is_valid_json(client):
    with client.websocket_connect("/ws/generate") as ws:
        events = generate(ws, "linear_spec", block_size=4)
    run_id = events[0]["run_id"]
    exported = client.get(f"/api/runs/{run_id}/export")
    assert exported.status_code == 200 and run_id in exported.headers["content-disposition"]
    doc = strict_json(exported.text)
    assert doc["events"] == events
    assert client.post("/api/import", json=doc).status_code == 409  # the id is taken
    assert client.delete(f"/api/runs/{run_id}").status_code == 204
    imported = client.post("/api/import", json=doc)
    assert imported.status_code == 201 and imported.json() == {"run_id": run_id}
    assert client.get(f"/api/runs/{run_id}").json() == doc["run"]
    assert strict_json(client.get(f"/api/runs/{run_id}/export").text) == doc
    assert client.post("/api/import", json={"schema": 1}).status_code == 422

    trace = strict_json(client.get(f"/api/runs/{run_id}/export", params={"format": "perfetto"}).text)
    assert trace["traceEvents"] and all("ph" in e for e in trace["traceEvents"])
    assert client.get(f"/api/runs/{run_id}/export", params={"format": "xml"}).status_code == 422


def test_comparisons(client):
    with client.websocket_connect("/ws/generate") as ws:
        ids = [generate(ws, mode, max_new_tokens=8)[0]["run_id"] for mode in ("ar", "linear_spec")]
    made = client.post("/api/comparisons", json={"label": "ar vs ls", "prompt": PROMPT, "run_ids": ids})
    assert made.status_code == 201
    comparison = made.json()
    assert comparison["run_ids"] == ids and comparison["label"] == "ar vs ls"
    assert client.get(f"/api/comparisons/{comparison['comparison_id']}").json() == comparison
    assert client.get("/api/comparisons").json() == [comparison]
    assert client.post("/api/comparisons", json={"prompt": PROMPT, "run_ids": ["r_nope"]}).status_code == 404
    assert client.post("/api/comparisons", json={"prompt": "other", "run_ids": ids}).status_code == 422
    invalid = client.post("/api/comparisons", content='{"label": Infinity}',
                          headers={"content-type": "application/json"})
    assert invalid.status_code == 422 and invalid.json()["detail"][0]["input"] is None  # found by test_fuzz


# -- restart, auth, bind ---------------------------------------------------------------------------------------------

def test_restart_keeps_completed_runs_and_marks_crashed_ones(engine, store_url):
    with Store(store_url) as store, TestClient(create_app(engine, store)) as c:
        with c.websocket_connect("/ws/generate") as ws:
            events = generate(ws, "ar", max_new_tokens=8)
    crashed = Store(store_url)  # a process that died mid-run: run_start stored, nothing else
    crashed.record({**events[0], "run_id": "r_crashed"})
    crashed.engine.dispose()

    with Store(store_url) as store, TestClient(create_app(engine, store)) as c:
        run = c.get(f"/api/runs/{events[0]['run_id']}").json()
        assert run["status"] == "done" and run["n_tokens"] == len(events[-1]["output_ids"])
        assert c.get("/api/runs/r_crashed").json()["status"] == "interrupted"
        with c.websocket_connect(f"/ws/replay/{events[0]['run_id']}?speed=0") as ws:
            assert receive_run(ws) == events


def test_token_is_required_for_rest_websockets_and_pages(engine, store):
    with TestClient(create_app(engine, store, token="s3cret")) as c:
        assert c.get("/api/health").status_code == 401
        assert c.get("/").status_code == 401
        assert c.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/health", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        for url in ("/ws/generate", "/ws/replay/r_nope", "/ws/generate?token=wrong"):
            with c.websocket_connect(url) as ws, pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
            assert closed.value.code == 4401
        with c.websocket_connect("/ws/replay/r_nope?token=s3cret") as ws:
            assert ws.receive_json()["code"] == "unknown_run"
        with c.websocket_connect("/ws/replay/r_nope", headers={"Authorization": "Bearer s3cret"}) as ws:
            assert ws.receive_json()["code"] == "unknown_run"

        assert not c.cookies
        assert c.get("/", params={"token": "s3cret"}).status_code == 200  # a browser's first visit
        assert c.cookies["specscope_token"] == "s3cret"
        assert c.get("/api/modes").status_code == 200  # the cookie carries the token from then on


def test_token_is_redacted_from_uvicorn_log_records():
    redact_tokens()
    access = logging.getLogger("uvicorn.access")
    record = access.makeRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/?token=s3cret&x=1", "1.1", 200), None)
    assert all(f.filter(record) for f in access.filters)
    assert record.getMessage() == '127.0.0.1:5 - "GET /?token=***&x=1 HTTP/1.1" 200'
    error = logging.getLogger("uvicorn.error")
    record = error.makeRecord("uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
                              ("127.0.0.1:5", "/ws/generate?token=s3cret"), None)
    assert all(f.filter(record) for f in error.filters)
    assert "s3cret" not in record.getMessage() and "token=***" in record.getMessage()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "example.org", ""])
def test_check_bind_refuses_exposed_hosts_without_a_token(host):
    with pytest.raises(BindError, match="token"):
        check_bind(host, None)
    check_bind(host, "s3cret")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"])
def test_check_bind_allows_loopback(host):
    check_bind(host, None)


def at_once(c: TestClient, engine, monkeypatch, mode_a: str, mode_b: str, tokens: int) -> list[list[Event]]:
    """Two clients' runs, both queued before the engine steps, then run to their ends: each one's events."""
    gate = StepGate(engine.scheduler, monkeypatch)
    try:
        with c.websocket_connect("/ws/generate") as a, c.websocket_connect("/ws/generate") as b:
            a.send_text(gen_msg(mode=mode_a, max_new_tokens=tokens))
            b.send_text(gen_msg(mode=mode_b, max_new_tokens=tokens))
            wait_for(lambda: c.get("/api/health").json()["queued_runs"] == 2)
            gate.open()
            return [receive_run(a), receive_run(b)]
    finally:
        gate.open()


def test_speculative_runs_of_two_clients_share_forwards(engine, store, monkeypatch):
    """Two clients' isd and quadratic runs, admitted in one step, share their verify forwards (batch_requests 2 in
    their round phases over /ws/generate) and give the tokens each gives alone."""
    alone = {mode: engine.generate(PROMPT, mode, {"max_new_tokens": 12}).output_ids for mode in ("isd", "quadratic")}
    with TestClient(create_app(engine, store)) as c:
        runs = dict(zip(("isd", "quadratic"), at_once(c, engine, monkeypatch, "isd", "quadratic", 12), strict=True))
    for mode, events in runs.items():
        assert events[-1]["output_ids"] == alone[mode], mode
        shared = [p for e in events if e["type"] == "round" for p in e["phases"] if p["batch_requests"] == 2]
        assert shared and all(p["batch_rows"] > p["n_query"] for p in shared), mode
    assert engine.rt.pool.used == 0


def newest_forward(c: TestClient) -> int:
    """The id of the engine's newest recorded forward (0: none), paging through the log."""
    since = 0
    while page := c.get("/api/forwards", params={"since": since, "limit": 1000}).json()["forwards"]:
        since = page[-1]["id"]
    return since


def test_the_forwards_log_shows_what_shared_each_forward(engine, store, monkeypatch):
    """GET /api/forwards pages through the engine's record of its forwards: which runs and modes each served, with
    how many rows, and the pool's occupancy; two clients' runs show up in one forward."""
    with TestClient(create_app(engine, store)) as c:
        since = newest_forward(c)
        runs = {events[0]["run_id"] for events in at_once(c, engine, monkeypatch, "isd", "ar", 8)}
        page = c.get("/api/forwards", params={"since": since, "limit": 2}).json()
        assert len(page["forwards"]) == 2 and page["next"] == page["forwards"][-1]["id"] > since
        records = page["forwards"] + c.get("/api/forwards", params={"since": page["next"]}).json()["forwards"]
        assert [r["id"] for r in records] == list(range(since + 1, since + 1 + len(records)))
        assert newest_forward(c) == records[-1]["id"]
        shared = [r for r in records if len({g["run_id"] for g in r["groups"]}) == 2]
        assert shared and all({g["run_id"] for g in r["groups"]} == runs for r in shared)
        assert all(r["rows"] == sum(g["rows"] for g in r["groups"]) and 0 < r["pool_used"] <= r["pool_slots"]
                   for r in shared)
        assert {g["mode"] for r in shared for g in r["groups"]} == {"isd", "ar"}
        assert c.get("/api/forwards", params={"limit": 5000}).status_code == 422
        for run_id in runs:   # replayed from the store: the same forwards, the run's span of them
            replay = c.get(f"/api/runs/{run_id}/forwards").json()
            assert replay["runs"] == sorted(runs) and replay["complete"]
            live = {r["id"]: r for r in records}
            assert all({k: r[k] for k in ("rows", "pool_used", "pool_slots")} ==
                       {k: live[r["id"]][k] for k in ("rows", "pool_used", "pool_slots")} for r in replay["forwards"])
        assert c.get("/api/runs/r_unknown/forwards").status_code == 404
        assert c.get("/api/forwards", params={"replica": 1}).status_code == 404   # one engine: replica 0
