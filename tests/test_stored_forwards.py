"""A stored run's forwards (its engine's, from the run's first to its last) are rebuilt from the rounds of every
stored run that took part, and they are the engine's own forward log: the same forwards, rows, KV pool occupancy
and groups (run, mode, round, kind, rows)."""
from __future__ import annotations

from specscope.backend.engine.engine import Engine
from specscope.backend.store import Store
from specscope.backend.tracing import RecordingTracer

REQUESTS = [("Count from 3 to 9.", "ar", {"max_new_tokens": 12}),
            ("Reverse: q w e r", "isd", {"max_new_tokens": 10}),
            ("Copy: a b c d", "linear_spec", {"max_new_tokens": 8})]


def groups(record: dict) -> list[tuple]:
    return sorted((g["run_id"], g["mode"], g["round"], g["kind"], g["rows"]) for g in record["groups"])


def test_a_stored_runs_forwards_are_the_engines_log(loaded, tmp_path) -> None:
    engine = Engine(loaded, num_slots=1024)
    with Store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        tracers = [RecordingTracer(sink=store.record) for _ in REQUESTS]
        engine.run([engine.new_request(prompt, mode, params, tracer)
                    for (prompt, mode, params), tracer in zip(REQUESTS, tracers, strict=True)])
        logged = {r["id"]: r for r in engine.rt.log}
        shared = 0
        for tracer in tracers:
            replay = store.shared_forwards(tracer.run_id)
            assert replay["engine"] == engine.rt.engine_id and replay["complete"]
            own = {p["forward_id"] for e in tracer.events if e["type"] == "round" for p in e["phases"]}
            assert [r["id"] for r in replay["forwards"]] == list(range(min(own), max(own) + 1))   # its span
            for record in replay["forwards"]:
                live = logged[record["id"]]
                assert (record["rows"], record["pool_used"], record["pool_slots"]) == \
                       (live["rows"], live["pool_used"], live["pool_slots"])
                assert groups(record) == groups(live)
                shared += len(record["groups"]) > 1
        assert shared > 0   # the three ran together: some forwards served more than one of them
        assert store.shared_forwards("r_unknown") is None


def test_runs_of_another_engine_never_join_a_runs_forwards(loaded, tmp_path) -> None:
    """Forward ids count within an engine: a second engine's runs, which reuse the same ids, stay out."""
    with Store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        ran = []
        for _ in range(2):
            tracer = RecordingTracer(sink=store.record)
            Engine(loaded, num_slots=1024).generate("Count from 3 to 9.", "ar", {"max_new_tokens": 6}, tracer=tracer)
            ran.append(tracer.run_id)
        for run_id in ran:
            replay = store.shared_forwards(run_id)
            assert replay["runs"] == [run_id] and replay["complete"] and replay["forwards"]


def test_a_run_that_was_not_stored_leaves_the_replay_incomplete(loaded, tmp_path) -> None:
    engine = Engine(loaded, num_slots=1024)
    with Store(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        stored, unstored = RecordingTracer(sink=store.record), RecordingTracer()
        engine.run([engine.new_request("Count from 3 to 9.", "ar", {"max_new_tokens": 12}, stored),
                    engine.new_request("Reverse: q w e r", "ar", {"max_new_tokens": 12}, unstored)])
        replay = store.shared_forwards(stored.run_id)
        assert replay["runs"] == [stored.run_id] and not replay["complete"]
        assert any(r["rows"] > sum(g["rows"] for g in r["groups"]) for r in replay["forwards"])
