"""The divergence debugger (backend/engine/diverge.py) on real runs of the tiny model: through /api/diverge, the
CLI and the engine process; its attribution and near-tie logic on rows of known logits."""
from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from specscope.backend.cli import main
from specscope.backend.cli.common import run_traced
from specscope.backend.engine.diverge import EAGER, Probe, Rescored, RunConfig, Served, diverge, rescore
from specscope.backend.engine.engine import Engine
from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from specscope.backend.server import create_app
from specscope.backend.server.diverge import stored_run
from specscope.backend.server.engine_process import EngineProcess
from specscope.backend.store import Store, StoreWriter

PROMPT = "Kindly show 11 x 1 through 11 x 4."
RUNS = {"ar": ("ar", {}), "isd": ("isd", {}), "block": ("block_diffusion", {}),
        "sampled": ("ar", {"temperature": 1.0, "seed": 3})}
REAL_PROMPTS = ["List three colors.", "What is the capital of France?", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def stored(_module_engine, tmp_path_factory) -> tuple[str, dict[str, str]]:
    """The store's URL and the run id of each of RUNS, made on the module's engine."""
    url = f"sqlite:///{tmp_path_factory.mktemp('diverge') / 'runs.db'}"
    with Store(url) as store, StoreWriter(store) as writer:
        made = {name: run_traced(_module_engine, writer, PROMPT, mode, {"max_new_tokens": 24, **params}).run_id
                for name, (mode, params) in RUNS.items()}
    return url, made


@pytest.fixture
def client(shared_engine, stored):
    with Store(stored[0]) as store, TestClient(create_app(shared_engine, store)) as c:
        yield c


def config(url: str, run_id: str) -> RunConfig:
    with Store(url) as store:
        return stored_run(store, run_id)


def asked(client: TestClient, a: str, b: str) -> dict[str, Any]:
    reply = client.get("/api/diverge", params={"a": a, "b": b})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_an_identical_lossless_pair_is_identical(client, stored) -> None:
    runs = stored[1]
    found = asked(client, runs["isd"], runs["ar"])
    assert found["position"] is None and found["cause"].startswith("identical")
    assert found["lossless_claim"]["holds"] and not found["lossless_claim"]["broken"]
    assert "holds" in found["cause"] and found["a"]["token"] is None and found["attribution"] == []


def test_block_diffusion_against_ar_names_the_path(client, stored) -> None:
    url, runs = stored
    block, ar = config(url, runs["block"]), config(url, runs["ar"])
    found = asked(client, runs["block"], runs["ar"])
    position = found["position"]
    assert position is not None and block.output_ids[:position] == ar.output_ids[:position]
    for side, run in (("a", block), ("b", ar)):
        got = found[side]
        assert got["token"] == run.output_ids[position] and got["reproduced"]
        logits = [t["logit"] for t in got["top"]]
        assert len(logits) == 5 and logits == sorted(logits, reverse=True) and got["top"][0]["id"] == got["token"]
        assert got["margin"] == pytest.approx(logits[0] - logits[1])
        assert got["resolution"] is not None and "float32" in got["resolution_note"]
    assert found["a"]["site"]["kind"] == "denoise" and found["a"]["site"]["attn"] == "block"
    assert found["b"]["site"]["kind"] == "decode" and found["b"]["site"]["rows"] == 1
    assert {w["factor"] for w in found["attribution"]} == {"path"}
    assert any(w["to_other"] for w in found["attribution"]) and "path difference" in found["cause"]
    assert found["lossless_claim"] is None and not found["near_tie"]


def test_a_sampled_run_is_named_as_a_draw(client, stored) -> None:
    runs = stored[1]
    found = asked(client, runs["ar"], runs["sampled"])
    assert found["position"] is not None and "b sampled at T=1" in found["cause"]
    assert found["b"]["reproduced"] is None and found["a"]["reproduced"]


def test_unknown_runs_are_404(client, stored) -> None:
    reply = client.get("/api/diverge", params={"a": "nope", "b": stored[1]["ar"]})
    assert reply.status_code == 404 and "no run nope" in reply.text


def test_a_broken_lossless_claim_is_a_finding(shared_engine, stored) -> None:
    url, runs = stored
    isd, ar = config(url, runs["isd"]), config(url, runs["ar"])
    altered = replace(isd, output_ids=isd.output_ids[:3] + (isd.output_ids[3] + 1,) + isd.output_ids[4:])
    loaded = shared_engine.rt.loaded
    found = diverge(altered, ar, Served(loaded.name, loaded.weights_hash), partial(rescore, shared_engine))
    assert found["position"] == 3 and found["cause"].startswith("lossless claim broken: isd claims ar's tokens")
    assert found["lossless_claim"]["broken"] and found["a"]["reproduced"] is False and found["b"]["reproduced"]


def known_rows(probe: Probe) -> Rescored:
    """float32 prefers 7 over 9 by 0.01, bf16 the other way round; the eager float32 is 0.004 off float32."""
    logits = torch.zeros(16)
    matmul = probe.config.matmul
    logits[7], logits[9] = (0.99, 1.0) if matmul == "bf16" else (1.0, 0.99)
    logits[7] += 0.004 if matmul == EAGER else 0.0
    return Rescored(logits)


def test_a_precision_difference_is_named_and_a_near_tie_flagged() -> None:
    a = RunConfig("x", "ar", {"max_new_tokens": 8}, "m", "h", "float32", "done", (1, 2, 3), (5, 6, 7, 8))
    b = replace(a, run_id="y", matmul="bf16", output_ids=(5, 6, 9, 8))
    seen: list[Probe] = []

    def score(probes: list[Probe]) -> list[Rescored]:
        seen.extend(probes)
        return [known_rows(p) for p in probes]

    found = diverge(a, b, Served("m", "h"), score)
    assert found["position"] == 2 and found["a"]["token"] == 7 and found["b"]["token"] == 9
    assert [w["factor"] for w in found["attribution"]] == ["matmul", "matmul"]
    assert all(w["to_other"] for w in found["attribution"])
    assert "the matmul difference (float32 vs bf16) alone moves the argmax" in found["cause"]
    assert found["b"]["resolution"] == pytest.approx(0.02, rel=1e-4) and found["b"]["near_tie"]
    assert found["a"]["resolution"] == pytest.approx(0.008, rel=1e-4) and not found["a"]["near_tie"]
    assert found["near_tie"] and "a near-tie: b's margin" in found["cause"]
    assert {p.site.kind for p in seen} == {"decode"}
    assert len(seen) == len(set(seen)) == 3   # float32, eager and bf16 rows, each once


def test_a_run_of_another_model_is_not_rescored() -> None:
    a = RunConfig("x", "ar", {"max_new_tokens": 8}, "m", "h", "float32", "done", (1, 2, 3), (5, 6, 7, 8))
    b = replace(a, run_id="y", model="other", weights="g", output_ids=(5, 6, 9, 8))
    found = diverge(a, b, Served("m", "h"), lambda probes: [known_rows(p) for p in probes])
    assert found["b"]["not_rescored"].startswith("made by other") and found["attribution"] == []
    assert "b's row not re-scored" in found["cause"] and found["a"]["reproduced"]


def test_the_cli_prints_the_report(stored, capsys) -> None:
    url, runs = stored
    assert main(["diverge", runs["block"], runs["ar"], "--db", url]) == 0
    text = capsys.readouterr().out
    assert "first difference at output token" in text and "cause: the path difference" in text
    assert main(["diverge", runs["isd"], runs["ar"], "--db", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["position"] is None
    assert main(["diverge", "nope", runs["ar"], "--db", url]) == 2


def test_a_precision_difference_on_real_runs_is_named(shared_engine, loaded, heldout_prompts) -> None:
    """float32 against int8 matmuls (where this CPU runs them): the first prompt whose ar answers part."""
    from specscope.backend.engine.cost_curve import FLAT
    from specscope.backend.forward.fused_step import MatmulUnavailable
    from specscope.backend.tracing import RecordingTracer
    try:
        int8 = Engine(loaded, num_slots=1024, matmul="int8", cost_curve=FLAT)
    except MatmulUnavailable as e:
        pytest.skip(str(e))

    def made(engine: Engine, prompt: str) -> RunConfig:
        events: list[dict] = []
        engine.generate(prompt, "ar", {"max_new_tokens": 24}, RecordingTracer(sink=events.append, keep=False))
        kinds = {e["type"]: e for e in events}
        return RunConfig.from_events(engine.rt.matmul, kinds["run_start"], kinds["run_end"])

    served = Served(shared_engine.model_name, loaded.weights_hash)
    for prompt in heldout_prompts:
        found = diverge(made(shared_engine, prompt), made(int8, prompt), served, partial(rescore, shared_engine))
        if found["position"] is not None:
            break
    assert found["position"] is not None and found["a"]["reproduced"] and found["b"]["reproduced"]
    assert {w["factor"] for w in found["attribution"]} == {"matmul"} and "matmul difference" in found["cause"]
    assert found["b"]["resolution"] > found["a"]["resolution"] and "int8 against float32" in \
        found["b"]["resolution_note"]


def build(folder: Any, threads: int = 0) -> Engine:
    """Module level, so the spawned engine process can unpickle it; at `threads` torch threads (0: torch's own), as
    the eager backend's float32 numbers, which the resolutions are measured against, depend on them."""
    if threads:
        torch.set_num_threads(threads)
    return Engine(load_checkpoint(folder or DEFAULT_CHECKPOINT), num_slots=1024)


@pytest.mark.slow
def test_the_engine_process_rescores_as_the_engine_does(shared_engine, stored) -> None:
    url, runs = stored
    block, ar = config(url, runs["block"]), config(url, runs["ar"])
    loaded = shared_engine.rt.loaded
    here = diverge(block, ar, Served(loaded.name, loaded.weights_hash), partial(rescore, shared_engine))
    served = EngineProcess(partial(build, threads=torch.get_num_threads()))
    served.start()
    try:
        there = diverge(block, ar, Served(served.model.name, served.model.weights_hash), served.rescore)
    finally:
        served.stop()
    assert there == here


@pytest.mark.real_model
@pytest.mark.slow
def test_block_diffusion_against_ar_on_the_default_model() -> None:
    from specscope.backend.engine.cost_curve import FLAT
    from specscope.backend.model.source import resolve
    from specscope.backend.tracing import RecordingTracer
    src = resolve(None)
    engine = Engine(load_checkpoint(src.folder, adapter=src.adapter, name=src.name), num_slots=1024,
                    cost_curve=FLAT)

    def made(prompt: str, mode: str) -> RunConfig:
        events: list[dict] = []
        engine.generate(prompt, mode, {"max_new_tokens": 24},
                        RecordingTracer(run_id=mode, sink=events.append, keep=False))
        kinds = {e["type"]: e for e in events}
        return RunConfig.from_events(mode, kinds["run_start"], kinds["run_end"],
                                     [e for e in events if e["type"] == "round"])

    loaded = engine.rt.loaded
    for prompt in REAL_PROMPTS:   # the first whose block_diffusion answer parts from ar's
        found = diverge(made(prompt, "block_diffusion"), made(prompt, "ar"), Served(loaded.name, loaded.weights_hash),
                        partial(rescore, engine))
        if found["position"] is not None:
            break
    assert found["position"] is not None and found["a"]["reproduced"] and found["b"]["reproduced"]
    assert found["a"]["adapter"] is (src.adapter is not None) and "path" in {w["factor"] for w in
                                                                             found["attribution"]}
    assert engine.rt.pool.used == 0
