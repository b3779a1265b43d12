"""The engine in a process of its own (`specscope serve`): a run streams exactly the events the engine makes,
bad input, a full queue, cancel and a model switch are answered as in-process, and neither side outlives the
other silently: a dead engine ends its runs with an error, a killed server takes the engine process with it."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.modes import LONG_RAW_PROMPT

from specscope.backend.engine.cost_curve import CostCurve
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.params import ParamError
from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from specscope.backend.model.config import CheckpointError
from specscope.backend.server import create_app
from specscope.backend.server.engine_process import EngineProcess
from specscope.backend.server.worker import Busy
from specscope.backend.store import Store
from specscope.backend.tracing import RecordingTracer, unfold

PROMPT = "What is 12 + 30?"
HERE = Path(__file__).resolve().parent


def build(folder: Path | None) -> Engine:
    """Module level, so the spawned engine process can unpickle it. Its scheduler refuses to step anywhere but on
    the engine process's main thread, where the model was loaded (`Worker.run` says why): a step elsewhere fails,
    and the worker ends the runs with an error."""
    engine = Engine(load_checkpoint(folder or DEFAULT_CHECKPOINT), num_slots=1024, check_invariants=True)
    step = engine.scheduler.step

    def on_the_main_thread() -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(f"stepped on {threading.current_thread().name}, not the main thread")
        step()
    engine.scheduler.step = on_the_main_thread   # type: ignore[method-assign]
    return engine


class Ended(RecordingTracer):
    """A server-side tracer: records what arrives through its sink and says when run_end did."""

    def __init__(self, on_round=None):
        super().__init__(sink=self._arrive)
        self.arrived: list[dict] = []
        self.done = threading.Event()
        self.on_round = on_round

    def _arrive(self, event: dict) -> None:
        self.arrived.append(event)
        if event["type"] == "round" and self.on_round is not None:
            self.on_round(event)
        if event["type"] == "run_end":
            self.done.set()

    def wait(self) -> dict:
        assert self.done.wait(120), "no run_end"
        return self.arrived[-1]


def content(event: dict) -> dict:
    """An event less its timings, run id and engine id."""
    out = {k: v for k, v in event.items() if k not in ("run_id", "t_ms", "metrics", "engine")}
    if "phases" in out:
        out["phases"] = [{k: v for k, v in p.items() if k != "ms"} for p in out["phases"]]
    return out


pytestmark = pytest.mark.slow   # a spawned engine process imports torch and loads the model: seconds


@pytest.fixture(scope="module")
def served():
    engine = EngineProcess(build, max_queued=2)
    engine.start()
    yield engine
    engine.stop()
    assert not engine._proc.is_alive()


def test_a_run_streams_the_events_the_engine_makes(served, loaded) -> None:
    local = RecordingTracer()   # priced on the engine process's curve, as its rounds are
    curve = CostCurve.from_json(served.model.cost_curve)
    Engine(loaded, num_slots=1024, cost_curve=curve).generate(PROMPT, "linear_spec", {"max_new_tokens": 24},
                                                              tracer=local)
    remote = Ended()
    served.submit(PROMPT, "linear_spec", {"max_new_tokens": 24}, remote).admitted.result(60)
    end = remote.wait()
    assert [e["seq"] for e in unfold(remote.arrived)] == list(range(len(unfold(remote.arrived))))
    assert {e["run_id"] for e in remote.arrived} == {remote.run_id}
    assert [e["type"] for e in remote.arrived] == [e["type"] for e in local.events]
    assert [content(e) for e in unfold(remote.arrived)] == [content(e) for e in unfold(local.events)]
    assert end["status"] == "done" and end["output_ids"] == local.events[-1]["output_ids"]
    rated = served.rate(remote.arrived[0]["prompt_ids"], end["output_ids"])   # linear_spec is lossless: all picks
    assert rated.picks == end["output_ids"] and rated.greedy == len(end["output_ids"])
    with pytest.raises(ParamError, match="token ids"):
        served.rate(remote.arrived[0]["prompt_ids"], [-1])
    stats = served.stats()
    assert stats["pool"]["used"] == 0 and stats["held"] == 0 and stats["active"] == 0
    served_by = [g for r in served.forwards(0, 1000) for g in r["groups"] if g["run_id"] == remote.run_id]
    assert [g["kind"] for g in served_by][0] == "prefill" and {g["mode"] for g in served_by} == {"linear_spec"}


def test_bad_input_a_full_queue_and_cancel_are_answered(served) -> None:
    with pytest.raises(ParamError, match="max_new_tokens"):
        served.submit(PROMPT, "ar", {"max_new_tokens": -3}, Ended()).admitted.result(60)
    with pytest.raises(ParamError, match="mode"):
        served.submit(PROMPT, "no_such_mode", {}, Ended()).admitted.result(60)
    first_round = threading.Event()
    long_runs = [Ended(on_round=lambda _: first_round.set()), Ended()]
    runs = [served.submit(LONG_RAW_PROMPT, "block_diffusion", {"max_new_tokens": 512, "raw": True}, t)  # ~2.6 s
            for t in long_runs]
    with pytest.raises(Busy):
        served.submit(PROMPT, "ar", {}, Ended())
    assert first_round.wait(60)
    for run in runs:
        run.cancel()
    ends = [t.wait() for t in long_runs]
    assert [e["status"] for e in ends] == ["cancelled", "cancelled"]
    assert served.stats()["pool"]["used"] == 0


def test_switch_loads_in_the_engine_process(served, tmp_path) -> None:
    shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "other")
    shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "broken")
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    model = served.switch(tmp_path / "other")
    assert model.name == "other" and served.model == model and model.folder == tmp_path / "other"
    with pytest.raises(CheckpointError, match="unknown architecture"):
        served.switch(tmp_path / "broken")
    assert served.model.name == "other"
    tracer = Ended()
    served.submit(PROMPT, "ar", {"max_new_tokens": 4}, tracer)
    assert tracer.wait()["status"] == "done" and tracer.arrived[0]["model"] == "other"


@pytest.mark.extended
def test_a_dead_engine_process_ends_its_runs_with_an_error(tmp_path) -> None:
    """Through the app: the client gets error + run_end, the store keeps the run as an error, health says 503."""
    engine = EngineProcess(build)
    engine.start()
    with Store(f"sqlite:///{tmp_path / 'dead.db'}") as store, TestClient(create_app(engine, store)) as c:
        with c.websocket_connect("/ws/generate") as ws:
            ws.send_json({"type": "generate", "prompt": LONG_RAW_PROMPT, "mode": "block_diffusion",   # ~2.6 s
                          "params": {"max_new_tokens": 512, "raw": True}})
            events = [ws.receive_json()]
            while events[-1]["type"] != "round":
                events.append(ws.receive_json())
            os.kill(engine.pid, signal.SIGKILL)
            while events[-1]["type"] != "run_end":
                events.append(ws.receive_json())
        assert (events[-2]["type"], events[-1]["status"]) == ("error", "error")
        assert [e["seq"] for e in unfold(events)] == list(range(len(unfold(events))))
        assert c.get(f"/api/runs/{events[0]['run_id']}").json()["status"] == "error"
        health = c.get("/api/health")
        assert health.status_code == 503 and "not running" in health.json()["detail"]
        with c.websocket_connect("/ws/generate") as ws:
            ws.send_json({"type": "generate", "prompt": PROMPT, "mode": "ar", "params": {}})
            refused = ws.receive_json()
        assert refused["type"] == "error" and "not running" in refused["message"]


@pytest.mark.extended
def test_a_killed_server_takes_its_engine_process_with_it() -> None:
    script = ("import time; from specscope.backend.server.engine_process import EngineProcess; "
              "from test_engine_process import build; e = EngineProcess(build); e.start(); print(e.pid, flush=True); "
              "time.sleep(600)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    server = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        child = int(server.stdout.readline())
        server.kill()
        server.wait(30)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child}").exists() and "zombie" not in Path(f"/proc/{child}/status").read_text():
            assert time.monotonic() < deadline, "the engine process outlived its server"
            time.sleep(0.1)
    finally:
        server.kill()
