"""Scale-out on a local Ray cluster (2 CPUs, the tiny model; our server listens on loopback, while Ray's own daemons
take this node's address, to which Ray resolves loopback, behind Ray's token authentication): two engine replicas
behind one server take runs from 8 concurrent clients with a single engine's tokens, a killed replica's run ends
interrupted while the other replica's runs go on unchanged and the replica comes back, and a sweep spreads over two
engines, resumes after a kill without redoing stored cells, and groups in the Analysis tab."""
from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import ray
from support.browser import choose, new_page
from support.live_server import serving, ui_server

from specscope.backend.cli import build_parser
from specscope.backend.cli.serve import serve_build
from specscope.backend.engine.engine import Engine
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.server import create_app
from specscope.backend.server.ray_replicas import Replicas, rough_need
from specscope.backend.store import Store
from specscope.backend.tracing import RecordingTracer
from specscope.lab.sweep import BATCH, Sweep, execute, stored_cells
from specscope.lab.sweep_ray import run_on_ray

pytest_plugins = ["support.browser"]
PROMPTS = ["Count from 3 to 9.", "Reverse: q w e r t y u i", "Copy: a b c d", "What is 12 + 30?",
           "Sort: 5 3 9 1", "Count from 10 to 17.", "Reverse: z x c v", "Copy: red green blue"]
MODES = ["ar", "isd", "quadratic", "linear_spec"]
LONG = "Count from 1 to 200 in words, one per line: one, two, three,"
VICTIM_TOKENS = 960
"""The killed replica's run: the tiny model's whole context (0.5 s of `ar` on an idle core), so that the kill, sent
once its first round reached the server, lands mid-run even on a busy machine."""


def tiny_args(*more: str):
    parser, _ = build_parser("serve")
    return parser.parse_args(["serve", "--model", "tiny", "--slots", "2048", "--threads", "1", "--cost-curve", "flat",
                              *more])


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def replicas(cluster):
    service = Replicas(functools.partial(serve_build, tiny_args()), replicas=2, max_queued=64, cpus=1)
    service.start()
    yield service
    service.stop(30)


@pytest.fixture(scope="module")
def single():
    return Engine(load_checkpoint(), num_slots=2048)


def follow(service: Replicas, prompt: str, mode: str, store: Store, max_new_tokens: int):
    """Submit a run whose events go to the store; returns its tracer and an event set at run_end."""
    ended = threading.Event()
    events: list[dict] = []

    def sink(event: dict) -> None:
        events.append(event)
        store.record(event)
        if event["type"] == "run_end":
            ended.set()
    tracer = RecordingTracer(sink=sink, keep=False)
    service.submit(prompt, mode, {"max_new_tokens": max_new_tokens, "raw": True}, tracer).admitted.result(60)
    return tracer, events, ended


def wait_serving(service: Replicas) -> None:
    deadline = time.monotonic() + 60
    while not all(link.serving for link in service.links):
        assert time.monotonic() < deadline, "a killed replica did not come back"
        time.sleep(0.2)


def test_a_killed_replica_interrupts_its_runs_only_and_comes_back(replicas, single, tmp_path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    victim_run = follow(replicas, LONG, "ar", store, VICTIM_TOKENS)
    other_run = follow(replicas, LONG, "isd", store, 200)
    placed = {replicas.placed[t.run_id] for t, _, _ in (victim_run, other_run)}
    assert placed == {0, 1}
    victim = replicas.links[replicas.placed[victim_run[0].run_id]]
    deadline = time.monotonic() + 60
    while not any(e["type"] == "round" for e in victim_run[1]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    restarts = victim.restarts
    ray.kill(victim.actor, no_restart=False)
    assert victim_run[2].wait(60) and other_run[2].wait(120)
    errors = [e for e in victim_run[1] if e["type"] == "error"]
    assert errors and errors[0]["code"] == "interrupted"
    assert store.get_run(victim_run[0].run_id)["status"] == "interrupted"
    survivor = store.get_run(other_run[0].run_id)
    assert survivor["status"] == "done"
    assert survivor["output"] == single.generate(LONG, "isd", {"max_new_tokens": 200, "raw": True}).text
    wait_serving(replicas)
    assert victim.restarts == restarts + 1
    again = [follow(replicas, p, "linear_spec", store, 12) for p in PROMPTS[:2]]
    assert all(ended.wait(60) for _, _, ended in again)
    assert {replicas.placed[t.run_id] for t, _, _ in again} == {0, 1}
    assert all(store.get_run(t.run_id)["status"] == "done" for t, _, _ in again)


def test_runs_from_8_clients_land_on_both_replicas_with_one_engines_tokens(replicas, single, tmp_path) -> None:
    """Through the server (whose shutdown stops the replicas: the module's last test of them)."""
    import openai
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    app = create_app(replicas, store)
    asks = [(p, MODES[i % len(MODES)]) for i, p in enumerate(PROMPTS)]
    wait_serving(replicas)
    with serving(app) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)

        def complete(ask: tuple[str, str]) -> str:
            prompt, mode = ask
            return client.completions.create(model=f"tiny:{mode}", prompt=prompt, max_tokens=24).choices[0].text
        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(complete, asks))
        health = httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=30).json()
        logs = [httpx.get(f"http://127.0.0.1:{port}/api/forwards", params={"replica": i}, timeout=30)
                for i in range(3)]
        replayed = {r["run_id"]: httpx.get(f"http://127.0.0.1:{port}/api/runs/{r['run_id']}/forwards",
                                           timeout=30).json() for r in store.list_runs(limit=100)}
    assert [log.status_code for log in logs] == [200, 200, 404]   # each replica's own forwards; no third one
    served = [{g["run_id"] for r in log.json()["forwards"] for g in r["groups"]} for log in logs[:2]]
    assert all(r["replica"] == i for i, log in enumerate(logs[:2]) for r in log.json()["forwards"])
    for run_id, replay in replayed.items():   # a stored run's forwards are its own replica's, never the other's
        assert run_id in served[replicas.placed[run_id]] and set(replay["runs"]) <= served[replicas.placed[run_id]]
    assert texts == [single.generate(p, m, {"max_new_tokens": 24, "raw": True}).text for p, m in asks]
    runs = store.list_runs(limit=100)
    assert len(runs) == 8 and {r["run_id"] for r in runs} <= set(replicas.placed)
    assert {replicas.placed[r["run_id"]] for r in runs} == {0, 1}
    assert [r["serving"] for r in health["replicas"]] == [True, True] and health["pool"]["used"] == 0


SPEC = {"name": "grid", "model": "tiny", "modes": {"linear_spec": {"block_size": [4, 8]}, "isd": {"n": [2, 3]}},
        "prompts": "prompts.jsonl", "count": 6, "repeats": 1, "max_new_tokens": 12}


def write_spec(folder: Path) -> Path:
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    spec = folder / "grid.yaml"
    spec.write_text(json.dumps(SPEC))    # JSON is YAML
    return spec


def test_a_sweep_spreads_over_two_engines_and_resumes_without_redoing_cells(cluster, tmp_path) -> None:
    spec = write_spec(tmp_path)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    command = [sys.executable, "-m", "specscope.backend.cli", "sweep", str(spec), "--db", db, "--threads", "1"]
    store = Store(db)
    killed = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(stored_cells(store, "grid")) < 8:      # a first batch stored, then the kill
        assert time.monotonic() < deadline and killed.poll() is None
        time.sleep(0.1)
    killed.kill()
    killed.wait()
    before = stored_cells(store, "grid")
    assert 8 <= len(before) < 24
    sweep = Sweep("grid", {"linear_spec": {"block_size": [4, 8]}, "isd": {"n": [2, 3]}}, PROMPTS[:6], 1, 12, "tiny")
    ran: dict[int, int] = {}
    build = functools.partial(serve_build, tiny_args(), None)

    def on_ray(todo, keep) -> None:
        assert len(todo) == 24 - len(before)        # the stored cells are not run again
        ran.update(run_on_ray(sweep, build, todo, keep, None, 2, cpus=0))   # the replicas hold the 2 CPUs
    rows = execute(sweep, store, on_ray, out=lambda _: None)
    runs = [r for r in store.list_runs(sweep="grid", limit=100) if r["status"] == "done"]   # (the kill may have
    assert len(runs) == 24 and len(stored_cells(store, "grid")) == 24   # left a cell's run unfinished) each cell once
    batches = -(-(24 - len(before)) // BATCH)    # a kill after the second batch was stored leaves one batch
    assert len(ran) == min(2, batches) and sum(ran.values()) == 24 - len(before)   # both engines ran a batch
    assert {r["row"] for r in rows} == {"isd n=2", "isd n=3", "linear_spec block_size=4", "linear_spec block_size=8"}
    assert all(r["runs"] == 6 and r["tpf"] >= 1 for r in rows)


@pytest.mark.browser
def test_the_analysis_tab_filters_a_sweep_and_groups_by_its_parameters(browser, loaded, tmp_path) -> None:
    from specscope.lab.sweep import run_local
    engine = Engine(loaded, num_slots=2048)
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    sweep = Sweep("blocks", {"linear_spec": {"block_size": [4, 8]}}, PROMPTS[:3], 1, 12, "tiny")
    execute(sweep, store, lambda todo, keep: run_local(sweep, engine, todo, keep), out=lambda _: None)
    engine.generate(PROMPTS[3], "linear_spec", {"max_new_tokens": 12}, tracer=RecordingTracer(sink=store.record))
    store.close()
    with ui_server(loaded, tmp_path) as server:
        page = new_page(browser)
        page.goto(server["url"])
        page.get_by_role("tab", name="Analysis").click()
        page.wait_for_selector("#an-summary-table")
        page.fill("#an-filter textarea", "sweep=blocks")
        choose(page, "#an-by", "param:block_size")
        page.press("#an-filter textarea", "Enter")
        page.wait_for_selector("#an-summary-table >> text=block_size=8")
        page.wait_for_function("() => document.querySelectorAll('#an-summary-table tbody tr').length === 2")
        groups = page.eval_on_selector_all("#an-summary-table tbody tr td:first-child",
                                           "cs => cs.map(c => c.innerText)")
        counts = page.eval_on_selector_all("#an-summary-table tbody tr td:nth-child(2)",
                                           "cs => cs.map(c => c.innerText)")
        assert groups == ["block_size=4", "block_size=8"] and counts == ["3", "3"]   # the other run left out
        page.close()


class HeldLink:
    """A replica's link as routing sees it: its runs held and its free KV slots."""

    def __init__(self, index: int, held: int, free: int):
        self.index, self.held, self.free, self.serving, self.taken = index, held, free, True, 0

    def free_slots(self) -> int:
        return self.free

    def submit(self, *_: object) -> str:
        self.taken += 1
        return f"replica {self.index}"


@pytest.mark.parametrize(("links", "chosen"), [
    ([(0, 0, 40), (1, 3, 4000)], 1),     # the idle replica has no KV room for the run: the busier one with room
    ([(0, 2, 4000), (1, 1, 200)], 1),    # both have room: the one holding fewer runs
    ([(0, 1, 300), (1, 1, 3000)], 1),    # as many runs each: the one with more free slots
    ([(0, 0, 10), (1, 0, 50)], 1),       # neither has room: the one nearer to it
])
def test_a_run_goes_to_a_replica_with_kv_room_then_the_least_held(links, chosen) -> None:
    service = Replicas(lambda folder: None, replicas=len(links), max_queued=64)
    service.links = [HeldLink(*link) for link in links]   # type: ignore[list-item]
    ran = service.submit("x" * 30, "ar", {"max_new_tokens": 64}, RecordingTracer())   # about 10 + 64 slots
    assert ran == f"replica {chosen}" and service.placed[next(reversed(service.placed))] == chosen


def test_a_runs_rough_need_counts_its_prompt_and_answer() -> None:
    assert rough_need("abcdef" * 10, {"max_new_tokens": 32}) == 20 + 32
    assert rough_need([{"role": "user", "content": "abc" * 4}], {}) == 4
    assert rough_need("abc", {"max_new_tokens": "many"}) == 1   # refused by the replica, not here
