"""Schemathesis against the server's own OpenAPI schema (every REST and /v1 operation it declares): generated
requests, valid and not, never get a 5xx; afterwards no KV slot is held and a websocket run still works."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from support.live_server import serving
from websockets.sync.client import connect

from specscope.backend.engine.engine import Engine
from specscope.backend.server import create_app
from specscope.backend.store import Store

EXAMPLES = int(os.environ.get("SCHEMATHESIS_N", 6))   # per operation and generation mode


@pytest.fixture(scope="module")
def served(loaded, tmp_path_factory) -> Iterator[tuple[str, Engine]]:
    """A live server (uvicorn on loopback) on the tiny model; its base URL."""
    engine = Engine(loaded, num_slots=4096, check_invariants=True)
    app = create_app(engine, Store(f"sqlite:///{tmp_path_factory.mktemp('st') / 'runs.db'}"))
    with serving(app) as port:
        yield f"http://127.0.0.1:{port}", engine


def operations(url: str) -> list:
    """Every operation the server's OpenAPI schema declares."""
    return [result.ok() for result in schemathesis.openapi.from_url(f"{url}/openapi.json").get_all_operations()]


def served_runs(case, model: str) -> None:
    """A /v1 body names the served model half the time (so what follows the model check is fuzzed too) and asks
    for at most 8 new tokens, so the runs it starts stay short; everything else is as generated."""
    if not (case.path.startswith("/v1/") and isinstance(case.body, dict)):
        return
    if "model" in case.body and hash(repr(case.body)) % 2:
        case.body["model"] = model
    if isinstance(case.body.get("max_tokens"), int):
        case.body["max_tokens"] = min(case.body["max_tokens"], 8)


@pytest.mark.slow   # several seconds: left out of make test-fast
def test_no_operation_answers_a_server_error(served) -> None:
    """Schemathesis' generated requests, valid (positive) and invalid (negative), for each operation (the pytest
    plugin's lazy loader does not run on this pytest, so each strategy is driven here)."""
    url, engine = served
    checked = []
    for operation in operations(url):
        for generation in GenerationMode:
            @given(case=operation.as_strategy(generation_mode=generation))
            @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
            def no_server_error(case) -> None:
                served_runs(case, engine.model_name)
                case.call_and_validate(checks=[not_a_server_error])

            try:
                no_server_error()
            except Unsatisfiable:  # nothing to make invalid (an operation without parameters or body)
                assert generation is GenerationMode.NEGATIVE
        checked.append(f"{operation.method.upper()} {operation.path}")
    assert {"POST /v1/chat/completions", "POST /v1/completions", "GET /api/runs"} <= set(checked)


def test_after_the_fuzz_the_pool_is_free_and_a_run_works(served) -> None:
    url, engine = served
    with connect(url.replace("http", "ws", 1) + "/ws/generate") as ws:
        ws.send(json.dumps({"type": "generate", "prompt": "What is 12 + 30?", "mode": "ar",
                            "params": {"max_new_tokens": 4}}))
        events = [json.loads(ws.recv())]
        while events[-1]["type"] not in ("run_end", "error"):
            events.append(json.loads(ws.recv()))
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "done"
    assert engine.rt.pool.used == 0
