"""/api/models over a models directory: list, switch (the engine service loads and serves the new model), refuse
unknown and unloadable folders."""
from __future__ import annotations

import json
import shutil

from fastapi import FastAPI
from fastapi.testclient import TestClient

from specscope.backend.engine.engine import Engine
from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from specscope.backend.server.models import ModelHost, models_router
from specscope.backend.server.service import LocalEngine
from specscope.backend.tracing import RecordingTracer


def test_list_and_switch(tmp_path, loaded):
    for name in ("a", "b", "broken"):
        shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / name)
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    service = LocalEngine(Engine(load_checkpoint(tmp_path / "a"), num_slots=256),
                          build=lambda path: Engine(load_checkpoint(path), num_slots=256))
    host = ModelHost(tmp_path, service)
    app = FastAPI()
    app.include_router(models_router(host))
    client = TestClient(app)
    service.start()
    try:
        listing = client.get("/api/models").json()
        assert listing["current"] == "a" and listing["weights_hash"] == loaded.weights_hash
        by_name = {m["name"]: m for m in listing["models"]}
        assert by_name["a"]["loadable"] and by_name["b"]["loadable"] and not by_name["broken"]["loadable"]
        assert "unknown architecture" in by_name["broken"]["error"]
        switched = client.post("/api/models/b").json()
        served = service.worker.engine
        assert switched["current"] == "b" and served.model_name == "b" and service.model.name == "b"
        tracer = RecordingTracer()
        service.submit("What is 2 + 3?", "ar", {"max_new_tokens": 4}, tracer).admitted.result(30)
        assert client.post("/api/models/b").json()["current"] == "b"
        assert service.worker.engine is served   # already served: nothing reloaded
        assert client.post("/api/models/nope").status_code == 404
        bad = client.post("/api/models/broken")
        assert bad.status_code == 422 and "unknown architecture" in bad.json()["detail"]
        assert client.get("/api/models").json()["current"] == "b"
    finally:
        service.stop()
    assert tracer.events[0]["model"] == "b" and tracer.events[-1]["status"] == "done"


def test_app_switches_the_served_model(tmp_path, loaded):
    """Through create_app: the switch reaches the worker, so health, vocab and the next run use the new model;
    without a models directory /api/models lists only the served model."""
    from specscope.backend.server import create_app
    from specscope.backend.store import Store

    shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "models" / "b")
    engine = Engine(loaded, num_slots=256)
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    plain = create_app(engine, store)
    with TestClient(plain) as client:
        listing = client.get("/api/models").json()
        assert (listing["current"], listing["weights_hash"]) == ("tiny", loaded.weights_hash)
        assert [m["name"] for m in listing["models"]] == ["smollm2-135m", "tiny"]   # the models known by name
        assert all(m["builtin"] for m in listing["models"])
        assert client.post("/api/models/nope").status_code == 404
    app = create_app(engine, store, models_dir=tmp_path / "models",
                     build=lambda path: Engine(load_checkpoint(path), num_slots=256))
    with TestClient(app) as client:
        assert client.get("/api/health").json()["model"] == "tiny"
        assert client.post("/api/models/b").json()["current"] == "b"
        assert client.get("/api/health").json()["model"] == "b"
        vocab = client.get("/api/vocab").json()
        assert vocab["model"] == "b" and vocab["pieces"][:50] == [loaded.tokenizer.decode([i]) for i in range(50)]
        with client.websocket_connect("/ws/generate") as ws:
            ws.send_json({"type": "generate", "prompt": "What is 2 + 3?", "mode": "ar",
                          "params": {"max_new_tokens": 4}})
            start = ws.receive_json()
        assert (start["type"], start["model"]) == ("run_start", "b")
    store.close()


def test_serve_starts_on_the_first_loadable_folder(tmp_path):
    from specscope.backend.cli.common import first_model

    (tmp_path / "a-broken").mkdir()
    (tmp_path / "a-broken" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    assert first_model(str(tmp_path)) is None
    shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "b")
    assert first_model(str(tmp_path)) == str(tmp_path / "b")


def test_serve_refuses_a_missing_models_directory(tmp_path, capsys):
    from specscope.backend.cli import main

    assert main(["serve", "--models", str(tmp_path / "nope"), "--db", f"sqlite:///{tmp_path / 'r.db'}"]) == 2
    assert "no such directory" in capsys.readouterr().err
