"""`--forward auto|fused|torch` from the commands to the runs: `specscope run` records the backend that ran it, a
server on the torch forward packs several clients' rounds into one forward (its forwards log shows them) and each
run gives the tokens it gives alone, and nothing compares runs across backends (the served model's rating)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_server import PROMPT, at_once, refit

from specscope.backend.cli import main
from specscope.backend.engine.engine import Engine
from specscope.backend.server import create_app
from specscope.backend.store import Store


@pytest.fixture
def db(tmp_path: Path, monkeypatch, loaded) -> str:
    """A store URL in tmp_path; the CLI gets the already loaded model instead of reading it again."""
    monkeypatch.setattr("specscope.backend.cli.options.load_checkpoint", lambda *args, **kwargs: loaded)
    return f"sqlite:///{tmp_path / 'cli.db'}"


@pytest.fixture(scope="module")
def torch_engine(loaded) -> Engine:
    return Engine(loaded, num_slots=4096, check_invariants=True, forward="torch")


def test_run_records_the_forward_backend_that_ran_it(capsys, db):
    starts = {}
    for forward in ("torch", "auto"):
        code = main(["run", PROMPT, "--mode", "isd", "--max-new-tokens", "8", "--slots", "2048", "--cost-curve",
                     "flat", "--matmul", "float32", "--db", db, "--forward", forward])
        out, _ = capsys.readouterr()
        assert code == 0
        run_id = re.search(r"^run (r_\w+)", out, re.MULTILINE).group(1)
        with Store(db) as store:
            starts[forward] = store.events(run_id)[0]
    assert {f: s["forward"] for f, s in starts.items()} == {"torch": "torch", "auto": "fused"}   # float32 on a CPU
    assert starts["torch"]["matmul"] == starts["auto"]["matmul"] == "float32"
    code = main(["run", PROMPT, "--mode", "ar", "--db", db, "--forward", "torch", "--matmul", "bf16"])
    assert code == 2 and "--matmul bf16 is the fused CPU step's" in capsys.readouterr().err


def test_a_torch_server_packs_two_clients_rounds_into_one_forward(torch_engine, tmp_path, monkeypatch):
    """Two clients' isd and quadratic runs, queued before the engine steps, share forwards on the torch forward
    (groups of both runs in one record of Runtime.log), each with its tokens alone; a run of one backend is not
    rated by a server of the other."""
    engine = torch_engine
    alone = {mode: engine.generate(PROMPT, mode, {"max_new_tokens": 12}).output_ids for mode in ("isd", "quadratic")}
    with Store(f"sqlite:///{tmp_path / 's.db'}") as store, TestClient(create_app(engine, store)) as c:
        since = engine.rt.forwards
        runs = dict(zip(("isd", "quadratic"), at_once(c, engine, monkeypatch, "isd", "quadratic", 12), strict=True))
        for mode, events in runs.items():
            assert events[0]["forward"] == "torch" and events[-1]["output_ids"] == alone[mode], mode
            shared = [p for e in events if e["type"] == "round" for p in e["phases"] if p["batch_requests"] == 2]
            assert shared and all(p["batch_rows"] > p["n_query"] for p in shared), mode
        ids = {events[0]["run_id"] for events in runs.values()}
        packed = [f for f in engine.rt.log if f["id"] > since and {g["run_id"] for g in f["groups"]} == ids]
        assert packed and all(f["rows"] == sum(g["rows"] for g in f["groups"]) for f in packed)

        run_id = runs["isd"][0]["run_id"]
        assert c.get(f"/api/runs/{run_id}/fit").status_code == 200
        refused, _ = refit(c, run_id, lambda start: start.update(forward="fused"))
        assert refused.status_code == 409 and "serve it with --forward fused" in refused.json()["detail"]
    assert engine.rt.pool.used == 0
