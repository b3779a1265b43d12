"""Property tests (hypothesis) of the server's inputs, on SQLite and PostgreSQL: REST parameters and bodies never
give a 500; websocket messages never close the socket (the frames stay under the transport limit) and always get
their answer; every run started gets its run_end and no KV slot is left held."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.live_server import serving
from support.postgres import STORES
from websockets.sync.client import connect

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import describe_modes
from specscope.backend.server import create_app
from specscope.backend.store import Store

pytest_plugins = ["support.postgres"]  # the pg_cluster fixture
PROMPT = "What is 12 + 30?"
MODES = [m["name"] for m in describe_modes()]
PARAM_NAMES = sorted({p["name"] for m in describe_modes() for p in m["params"]} - {"backend"})  # no slow kernels
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_N", 40)), deadline=None, suppress_health_check=list(HealthCheck))

json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
ids = st.text(max_size=80) | st.just("r_\x00") | st.from_regex(r"[rc]_[0-9a-f]{16}", fullmatch=True)
numbers = st.integers(min_value=-2**40, max_value=2**40).map(str) | st.text(max_size=12)


@pytest.fixture(scope="module", params=STORES)
def served(request, loaded, tmp_path_factory) -> Iterator[tuple[httpx.Client, Engine, str, int]]:
    """(REST client, engine, a stored run's id, port) of one real uvicorn server, on SQLite, then PostgreSQL."""
    url = (f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}" if request.param == "sqlite"
           else request.getfixturevalue("pg_cluster").new_database())
    engine = Engine(loaded, num_slots=4096)
    with Store(url) as store, serving(create_app(engine, store)) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        with connect(f"ws://127.0.0.1:{port}/ws/generate") as ws:
            ws.send(json.dumps({"type": "generate", "prompt": PROMPT, "mode": "ar", "params": {"max_new_tokens": 4}}))
            events = [json.loads(ws.recv(timeout=60))]
            while events[-1]["type"] != "run_end":
                events.append(json.loads(ws.recv(timeout=60)))
        run_id = events[0]["run_id"]
        yield http, engine, run_id, port


def mutated_export(doc: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A real export with one field of the run or of one event replaced by anything."""
    def mutate(args: tuple[bool, int, str, Any]) -> dict[str, Any]:
        in_run, index, key, value = args
        copy = json.loads(json.dumps(doc))
        target = copy["run"] if in_run else copy["events"][index % len(copy["events"])]
        target[key if key else next(iter(target))] = value
        return copy
    keys = st.sampled_from(["", "run_id", "mode", "status", "seq", "type", "round", "slots", "t_ms", "server"])
    return st.tuples(st.booleans(), st.integers(0, 100), keys, json_value).map(mutate)


@FUZZ
@given(data=st.data())
def test_rest_never_answers_500(served, data) -> None:
    client, _, run_id, _ = served  # an httpx client of the live server
    some_id = quote(data.draw(ids | st.just(run_id)), safe="")
    method, path, params = data.draw(st.sampled_from([
        ("GET", "/api/runs", {"mode": st.text(max_size=70), "status": st.text(max_size=20), "limit": numbers,
                              "offset": numbers}),
        ("GET", f"/api/runs/{some_id}", {}),
        ("GET", f"/api/runs/{some_id}/rounds", {"start": numbers, "stop": numbers}),
        ("GET", f"/api/runs/{some_id}/kv", {}),
        ("GET", f"/api/runs/{some_id}/export", {"format": st.sampled_from(["json", "perfetto"]) | st.text()}),
        ("DELETE", f"/api/runs/{some_id}x", {}),  # never the fixture's run
        ("GET", f"/api/comparisons/{some_id}", {}),
        ("POST", "/api/import", {}),
        ("POST", "/api/comparisons", {}),
    ]))
    query = {k: data.draw(v) for k, v in params.items() if data.draw(st.booleans())}
    body = None
    if path == "/api/import":
        doc = client.get(f"/api/runs/{run_id}/export").json()
        body = data.draw(mutated_export(doc) | json_value)
    elif path == "/api/comparisons":
        body = data.draw(st.fixed_dictionaries({}, optional={"label": json_value, "prompt": st.text(max_size=30),
                                                             "run_ids": st.lists(ids | st.just(run_id), max_size=3)})
                         | json_value)
    response = client.request(method, path, params=query, content=json.dumps(body),  # NaN/Infinity included
                              headers={"content-type": "application/json"})
    assert response.status_code < 500, (method, path, query, response.text[:300])


params = st.dictionaries(st.sampled_from(PARAM_NAMES) | st.text(max_size=8), json_leaf, max_size=4).map(
    lambda p: {"max_new_tokens": 4, **p})
generates = st.fixed_dictionaries({"type": st.just("generate"), "prompt": st.text(max_size=60) | st.just(PROMPT),
                                   "mode": st.sampled_from(MODES) | st.text(max_size=8), "params": params})
messages = (generates | st.just({"type": "cancel"}) | json_value).map(json.dumps) | st.text(max_size=100) | \
    st.binary(max_size=100)


def answers(ws, marker: str) -> list[dict[str, Any]]:
    """Everything the server sends up to the marker's error, and until every run it started has ended."""
    got, open_runs, marked = [], set(), False
    while not marked or open_runs:
        event = json.loads(ws.recv(timeout=60))
        got.append(event)
        if event["type"] == "run_start":
            open_runs.add(event["run_id"])
        elif event["type"] == "run_end":
            open_runs.discard(event["run_id"])
        elif event["type"] == "error" and marker in event.get("message", ""):
            marked = True
    return got


@FUZZ
@given(sent=st.lists(messages, min_size=1, max_size=4))
def test_websocket_survives_any_message_and_frees_every_slot(served, sent) -> None:
    client, engine, _, port = served
    with connect(f"ws://127.0.0.1:{port}/ws/generate") as ws:
        for i, raw in enumerate(sent):
            ws.send(raw)
            if '"generate"' in str(raw):
                ws.send(json.dumps({"type": "cancel"}))  # keep runs short; a cancel with no run is ignored
            marker = f"marker-{i}"
            ws.send(json.dumps({"type": marker}))  # answered by one bad_message error naming it: the socket lives
            events = answers(ws, marker)
            # every run it started has ended (answers() waits for each run_end); a run that fails with an engine
            # error (status "error") is allowed here: the properties are about the server, not the modes
            assert all(e["code"] != "internal" for e in events if e["type"] == "error"), (raw, events)
    deadline = time.monotonic() + 30
    while client.get("/api/health").json()["queued_runs"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.rt.pool.used == 0
