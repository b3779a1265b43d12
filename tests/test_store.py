"""Store: events kept exactly, derived rounds and KV intervals, lifecycle, locking, exports and comparisons."""
from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, select
from support.store_runs import DRAFT_SLOT, N_ROUNDS, PROMPT, finish, play_round, start

from specscope.backend.store import (
    DocumentError,
    DuplicateSeqError,
    RunExistsError,
    SeqGapError,
    Store,
    StoreWriter,
    TraceError,
    UnknownRunError,
    export_json,
    export_perfetto,
    import_json,
    retry,
)
from specscope.backend.store.models import Base, ComparisonRun, Event, KVInterval, Round
from specscope.backend.tracing import RecordingTracer, unfold

pytest_plugins = ["support.postgres"]  # the pg_cluster and store_url fixtures
def url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A store on SQLite, then on PostgreSQL."""
    with Store(store_url, batch_size=4) as s:
        yield s


def record_run(store: Store, mode: str = "isd", status: str = "done", prompt: str = PROMPT) -> RecordingTracer:
    tracer = start(store.record, mode, prompt)
    for r in range(N_ROUNDS):
        play_round(tracer, r)
    finish(tracer, status)
    return tracer


def count(store: Store, model: type[Base], run_id: str) -> int:
    with store.engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(model).where(model.run_id == run_id))


def test_schema_is_migrated(store: Store) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == "0005"   # the newest migration in backend/store/migrations
        assert compare_metadata(context, Base.metadata) == []
        if conn.dialect.name == "sqlite":
            pragmas = [conn.exec_driver_sql(f"PRAGMA {name}").scalar() for name in ("journal_mode", "foreign_keys")]
            assert pragmas == ["wal", 1]


def test_migration_0002_keeps_old_runs(store_url: str) -> None:
    """A database made by 0001 upgrades in place: its runs stay, with no server and no model hash."""
    from specscope.backend.store.db import make_engine
    from specscope.backend.store.migrate import upgrade
    engine = make_engine(store_url)
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO runs (run_id, created_at, mode, params, prompt, status, n_rounds, "
                             "n_tokens) VALUES ('r_old', '2026-11-29 10:00:00', 'ar', '{}', 'hi', 'done', 0, 0)")
    engine.dispose()
    with Store(store_url) as store:
        run = store.get_run("r_old")
        assert run is not None and (run["status"], run["server"], run["model_hash"]) == ("done", None, None)


def test_in_memory_url() -> None:
    with Store("sqlite://") as memory:
        tracer = record_run(memory)
        assert memory.events(tracer.run_id) == tracer.events


def test_stored_events_equal_emitted(store: Store) -> None:
    tracer = record_run(store)
    stored = store.events(tracer.run_id)
    assert [json.dumps(e) for e in stored] == [json.dumps(e) for e in tracer.events]  # same keys, same order
    assert [e["type"] for e in stored] == ["run_start", *["round"] * N_ROUNDS, "run_end"]   # one row a round
    assert [e["seq"] for e in unfold(stored)] == list(range(len(unfold(tracer.events))))   # KV operations counted
    assert store.events(tracer.run_id, since_seq=5) == [e for e in tracer.events if e["seq"] >= 5]
    assert stored[1]["conf"] == [0.9, None]  # NaN was sanitized by the tracer and stays valid JSON


def test_derived_rounds_and_summary(store: Store) -> None:
    tracer = record_run(store)
    run = store.get_run(tracer.run_id)
    assert run is not None
    assert (run["status"], run["mode"], run["model"], run["prompt"]) == ("done", "isd", "tiny", PROMPT)
    assert (run["n_rounds"], run["n_tokens"], run["output"]) == (N_ROUNDS, 3, "t0t1t2")
    assert run["metrics"]["kv_leaked"] == 0 and run["params"] == {"n": 2, "alpha": 0.5}
    round_events = [e for e in unfold(tracer.events) if e["type"] == "round"]   # less their KV operations
    assert store.rounds(tracer.run_id) == round_events
    assert store.rounds(tracer.run_id, 1, 2) == round_events[1:2]
    assert store.rounds(tracer.run_id, start=2) == round_events[2:]


def test_kv_intervals(store: Store) -> None:
    tracer = record_run(store)
    last = N_ROUNDS - 1
    expected = [(0, 0, 0, last, "finished"), (1, 1, 0, last, "finished")]
    expected += [(2 + r, 2 + r, r, last, "finished") for r in range(N_ROUNDS)]
    expected += [(DRAFT_SLOT, 3 + r, r, r, "rejected") for r in range(N_ROUNDS)]
    got = [(iv["slot"], iv["position"], iv["alloc_round"], iv["free_round"], iv["end_reason"])
           for iv in store.kv_intervals(tracer.run_id)]
    assert got == expected

    leaky = start(store.record)
    play_round(leaky, 0)
    leaky.emit("run_end", {"status": "error", "output_ids": [], "text": "", "metrics": {}})
    open_ = [iv for iv in store.kv_intervals(leaky.run_id) if iv["free_round"] is None]
    assert [(iv["slot"], iv["end_reason"], iv["free_seq"]) for iv in open_] == [(0, None, None), (1, None, None),
                                                                                (2, None, None)]


def test_list_filter_delete_cascades(store: Store) -> None:
    a = record_run(store, mode="isd")
    b = record_run(store, mode="linear_spec", status="cancelled")
    c = record_run(store, mode="isd")
    store.create_comparison("isd vs linear", PROMPT, [a.run_id, b.run_id])
    assert [r["run_id"] for r in store.list_runs()] == [c.run_id, b.run_id, a.run_id]
    assert [r["run_id"] for r in store.list_runs(mode="isd")] == [c.run_id, a.run_id]
    assert [r["run_id"] for r in store.list_runs(status="cancelled")] == [b.run_id]
    assert [r["run_id"] for r in store.list_runs(limit=1, offset=1)] == [b.run_id]
    assert store.list_runs(mode="isd", status="cancelled") == []

    assert store.delete_run(a.run_id) is True
    assert store.get_run(a.run_id) is None and store.events(a.run_id) == []
    for model in (Event, Round, KVInterval, ComparisonRun):
        assert count(store, model, a.run_id) == 0
    assert count(store, Event, b.run_id) == len(b.events)
    comparison = store.list_comparisons()[0]
    assert comparison["run_ids"] == [b.run_id]
    assert store.delete_run(a.run_id) is False


def test_reopen_keeps_runs_and_marks_interrupted(store_url: str) -> None:
    db = store_url
    first = Store(db, batch_size=4)
    done = record_run(first)
    crashed = start(first.record)
    play_round(crashed, 0)
    first.flush()
    play_round(crashed, 1)  # handed to the store, still buffered there when the process "dies": never written
    first.engine.dispose()

    with Store(db) as second:
        assert second.get_run(done.run_id)["status"] == "done"
        assert second.events(done.run_id) == done.events
        assert second.get_run(crashed.run_id)["status"] == "running"
        live = start(second.record)
        assert second.mark_interrupted() == [crashed.run_id]
        assert second.mark_interrupted() == []
        assert second.events(crashed.run_id) == crashed.events[:-1]
        run = second.get_run(crashed.run_id)
        assert (run["status"], run["n_rounds"], run["metrics"]) == ("interrupted", 1, None)
        assert [r["round"] for r in second.rounds(crashed.run_id)] == [0]
        assert second.get_run(live.run_id)["status"] == "running"


def test_locked_database_loses_no_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked.db"
    backoffs: list[float] = []
    monkeypatch.setattr(retry, "sleep", lambda s: (backoffs.append(s), time.sleep(s)))
    with Store(url(path), batch_size=2, busy_timeout_ms=50) as store:
        tracer = start(store.record)
        locked, release = threading.Event(), 0.5

        def hold_write_lock() -> None:
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            locked.set()
            time.sleep(release)
            conn.execute("COMMIT")
            conn.close()

        holder = threading.Thread(target=hold_write_lock)
        holder.start()
        locked.wait(5)
        began = time.perf_counter()
        for r in range(N_ROUNDS):
            play_round(tracer, r)
        finish(tracer)
        holder.join()
        assert time.perf_counter() - began >= release * 0.8
        assert backoffs, "the write should have been retried"
        assert store.events(tracer.run_id) == tracer.events
        assert store.get_run(tracer.run_id)["status"] == "done"


def test_export_import_round_trip(store: Store, tmp_path: Path) -> None:
    tracer = record_run(store)
    data = json.loads(json.dumps(export_json(store, tracer.run_id), allow_nan=False))
    assert data["schema"] == 1 and data["events"] == tracer.events
    with Store(url(tmp_path / "fresh.db")) as fresh:
        assert import_json(fresh, data) == tracer.run_id
        assert export_json(fresh, tracer.run_id) == data
        assert fresh.rounds(tracer.run_id) == store.rounds(tracer.run_id)
        assert fresh.kv_intervals(tracer.run_id) == store.kv_intervals(tracer.run_id)
        with pytest.raises(RunExistsError):
            import_json(fresh, data)
        with pytest.raises(DocumentError):
            import_json(fresh, {"schema": 2, "run": data["run"], "events": data["events"]})
        with pytest.raises(DocumentError):
            import_json(fresh, {"schema": 1, "run": {"run_id": "r_x"}, "events": []})
        other = json.loads(json.dumps(data).replace(tracer.run_id, "r_other"))
        del other["events"][3]
        with pytest.raises(SeqGapError):
            import_json(fresh, other)
        assert fresh.get_run("r_other") is None
    with pytest.raises(UnknownRunError):
        export_json(store, "r_missing")


def assert_nested(slices: list[dict[str, Any]]) -> None:
    """Slices on one track must nest or be disjoint."""
    stack: list[int] = []
    for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
        while stack and stack[-1] <= s["ts"]:
            stack.pop()
        assert not stack or s["ts"] + s["dur"] <= stack[-1], f"{s['name']} overlaps its neighbour"
        stack.append(s["ts"] + s["dur"])


def test_perfetto_structure(store: Store) -> None:
    tracer = record_run(store)
    trace = export_perfetto(store, tracer.run_id)
    json.dumps(trace, allow_nan=False)
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    for e in events:
        assert {"ts", "ph", "pid", "tid", "name"} <= e.keys()
        assert isinstance(e["ts"], int) and e["ts"] >= 0
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            tracks[e["pid"], e["tid"]].append(e)
    for slices in tracks.values():
        assert_nested(slices)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert set(tracks) <= set(names)
    assert names[1, 100 + DRAFT_SLOT] == f"KV slot {DRAFT_SLOT}"
    assert [e["name"] for e in events if e["name"] == "process_name"] == ["process_name"]

    rounds = [e for e in events if e.get("cat") == "round"]
    phases = [e for e in events if e.get("cat") == "phase"]
    assert [e["name"] for e in rounds] == [f"round {r}" for r in range(N_ROUNDS)]
    assert [e["name"] for e in phases] == ["draft", "verify"] * N_ROUNDS
    for i, phase in enumerate(phases):
        parent = rounds[i // 2]
        assert parent["ts"] <= phase["ts"] and phase["ts"] + phase["dur"] <= parent["ts"] + parent["dur"]
    assert len(tracks[1, 100 + DRAFT_SLOT]) == N_ROUNDS

    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"accepted_len", "kv_slots_in_use"}
    assert all(math.isfinite(v) for e in counters for v in e["args"].values())
    in_use = [e["args"]["kv_slots_in_use"] for e in counters if e["name"] == "kv_slots_in_use"]
    assert max(in_use) == 6 and in_use[-1] == 0  # 2 prompt slots + 3 accepted + 1 draft
    instants = [e for e in events if e["ph"] == "i"]
    assert [(e["args"]["round"], e["args"]["indices"]) for e in instants] == [(r, [1]) for r in range(N_ROUNDS)]


def test_comparisons_round_trip(store: Store) -> None:
    a, b = record_run(store, mode="isd"), record_run(store, mode="linear_spec")
    cid = store.create_comparison("greedy modes", PROMPT, [b.run_id, a.run_id])
    comparison = store.get_comparison(cid)
    assert comparison is not None
    assert (comparison["label"], comparison["prompt"], comparison["run_ids"]) == ("greedy modes", PROMPT,
                                                                                 [b.run_id, a.run_id])
    assert store.list_comparisons() == [comparison]
    assert store.get_comparison("c_missing") is None
    with pytest.raises(UnknownRunError):
        store.create_comparison("x", PROMPT, [a.run_id, "r_missing"])
    with pytest.raises(ValueError, match="prompt"):
        store.create_comparison("x", "another prompt", [a.run_id])
    with pytest.raises(ValueError):
        store.create_comparison("x", PROMPT, [a.run_id, a.run_id])


def test_gap_or_duplicate_seq_raises(store: Store) -> None:
    """Records must take the seqs from the next one on: their folded KV operations in turn, then their own."""
    tracer = start(lambda e: None)
    for r in range(N_ROUNDS):
        play_round(tracer, r)
    first, r0, r1, r2 = tracer.events
    store.begin_run(first)
    store.add_events([r0])
    with pytest.raises(DuplicateSeqError):
        store.add_events([r0])
    with pytest.raises(SeqGapError):
        store.add_events([r2])
    with pytest.raises(SeqGapError):
        store.add_events([{**r1, "kv": r1["kv"][1:]}])          # an operation missing
    with pytest.raises(DuplicateSeqError):
        store.add_events([{**r1, "kv": [r0["kv"][-1], *r1["kv"]]}])
    with pytest.raises(TraceError, match="KV operations"):
        store.add_events([{**r1, "kv": [{"op": "alloc"}]}])
    with pytest.raises(UnknownRunError):
        store.add_events([{**r1, "run_id": "r_unknown"}])
    with pytest.raises(TraceError):
        store.add_events([{**r1, "type": "bogus"}])
    with pytest.raises(TraceError, match="strict JSON"):
        store.add_events([{**r1, "tokens": [float("nan")]}])
    with pytest.raises(SeqGapError):
        store.begin_run({**first, "run_id": "r_late", "seq": 1})
    with pytest.raises(RunExistsError):
        store.begin_run(first)
    store.add_events([r1, r2])
    finish(tracer)
    with pytest.raises(TraceError):
        store.add_events(tracer.events[-1:])  # run_end goes to end_run
    store.end_run(tracer.events[-1])
    assert store.events(tracer.run_id) == tracer.events
    with pytest.raises(UnknownRunError):
        store.add_events([{**r2, "seq": tracer.seq}])


def test_runs_record_their_server_and_model_hash(store_url: str) -> None:
    with Store(store_url, server="gpu-a:7860") as a, Store(store_url, server="gpu-b:7861") as b:
        tracer = RecordingTracer(sink=a.record)
        tracer.emit("run_start", {"mode": "ar", "params": {}, "model": "tiny", "model_hash": "sha256:abc",
                                  "prompt": PROMPT, "prompt_ids": [1], "pieces": ["W"]})
        other = record_run(b)
        runs = {r["run_id"]: r for r in a.list_runs()}
        assert (runs[tracer.run_id]["server"], runs[tracer.run_id]["model_hash"]) == ("gpu-a:7860", "sha256:abc")
        assert (runs[other.run_id]["server"], runs[other.run_id]["model_hash"]) == ("gpu-b:7861", None)


def test_startup_marks_only_its_own_crashed_runs(store_url: str) -> None:
    """Servers sharing a database: a restarted server marks its own (and server-less) runs, never another's."""
    with Store(store_url, server="gpu-a:7860") as a, Store(store_url, server="gpu-b:7860") as b, \
            Store(store_url) as cli:
        mine, theirs, orphan = start(a.record), start(b.record), start(cli.record)
        restarted = Store(store_url, server="gpu-a:7860")
        assert sorted(restarted.mark_interrupted()) == sorted([mine.run_id, orphan.run_id])
        assert b.get_run(theirs.run_id)["status"] == "running"
        restarted.close()


def test_nul_characters_and_oversized_keys(store: Store) -> None:
    """PostgreSQL text cannot hold NUL: the run's columns get U+FFFD, its events keep the prompt exactly; a key the
    database cannot hold matches nothing on reads and is a TraceError on writes."""
    tracer = record_run(store, prompt="a\x00b")
    assert store.get_run(tracer.run_id)["prompt"] == "a\ufffdb"
    assert store.events(tracer.run_id)[0]["prompt"] == "a\x00b"
    assert store.create_comparison("x\x00", "a\x00b", [tracer.run_id])
    for key in ("r_\x00", "r_" + "x" * 100):
        assert store.get_run(key) is None and store.events(key) == [] and store.rounds(key) == []
        assert store.kv_intervals(key) == [] and store.get_comparison(key) is None and store.delete_run(key) is False
    if store.engine.dialect.name == "postgresql":  # SQLite does not enforce lengths
        with pytest.raises(TraceError, match="does not fit"):
            record_run(store, mode="m" * 65)


def test_writer_stores_every_event_and_isolates_a_failing_run(store: Store) -> None:
    """Events put on the engine thread reach the store from the writer thread; flush waits for them. A run whose
    storing fails (here: its id is taken) is dropped from then on, and the other runs are unaffected."""
    taken = record_run(store)
    with StoreWriter(store, interval_s=0.01) as writer:
        good = start(writer.put)
        clash = RecordingTracer(run_id=taken.run_id, sink=writer.put)
        clash.emit("run_start", {"mode": "ar", "params": {}, "model": "tiny", "prompt": "other", "prompt_ids": [],
                                 "pieces": []})
        play_round(good, 0)
        assert writer.flush(timeout=30)
        assert store.events(good.run_id) == good.events
        play_round(clash, 0)
        for r in range(1, N_ROUNDS):
            play_round(good, r)
        finish(good)
    assert writer.failed == {taken.run_id}
    assert store.events(good.run_id) == good.events and store.get_run(good.run_id)["status"] == "done"
    assert store.events(taken.run_id) == taken.events
    assert writer.flush(timeout=0.2) is False  # closed


def test_a_run_stored_before_the_folding_reads_as_one_stored_after(store: Store) -> None:
    """A run stored before KV operations were folded into records (kv events of their own) is stored, derived,
    exported and read back as it was, and gives the same rounds, KV intervals and Perfetto trace as the same run
    stored as records."""
    folded = record_run(store)
    old = unfold(folded.events)
    assert "kv" in {e["type"] for e in old} and not any("kv" in e for e in old if e["type"] != "kv")
    assert [e["seq"] for e in old] == list(range(len(old)))
    run_id = "r_" + "0" * 16
    renamed = [{**e, "run_id": run_id} for e in old]
    store.begin_run(renamed[0])   # the live path as the old tracers fed it, one event at a time
    for e in renamed[1:-1]:
        store.add_events([e])
    store.end_run(renamed[-1])
    assert store.events(run_id) == renamed
    assert store.rounds(run_id) == [{**e, "run_id": run_id} for e in store.rounds(folded.run_id)]
    assert store.kv_intervals(run_id) == store.kv_intervals(folded.run_id)
    run = store.get_run(run_id)
    assert (run["n_rounds"], run["n_tokens"], run["status"]) == (N_ROUNDS, 3, "done")
    assert export_perfetto(store, run_id)["traceEvents"][1:] == export_perfetto(store, folded.run_id)["traceEvents"][1:]
    data = export_json(store, run_id)
    store.delete_run(run_id)
    assert import_json(store, data) == run_id and store.events(run_id) == renamed


def test_a_writer_batch_stores_its_rounds_of_every_run_in_one_insert(tmp_path: Path) -> None:
    """One row a round, its KV operations in the payload, and one INSERT (executemany) for the batch's rounds of
    every run: the writer's batches are the store's waves."""
    inserts: list[int] = []
    with Store(url(tmp_path / "wave.db"), batch_size=2) as store:
        sqlalchemy.event.listen(store.engine, "before_cursor_execute",
                                lambda conn, cursor, statement, params, context, many:
                                inserts.append(len(params) if many else 1) if "INSERT INTO events" in statement
                                else None)
        writer = StoreWriter(store)
        runs = [start(writer.put) for _ in range(3)]   # queued before the writer starts: one batch
        for r in range(N_ROUNDS):
            for tracer in runs:
                play_round(tracer, r)
        with writer:
            assert writer.flush(timeout=30)
        assert inserts == [1, 1, 1, 3 * N_ROUNDS]     # each run_start at once, then every round together
        for tracer in runs:
            stored = store.events(tracer.run_id)
            assert stored == tracer.events and [e["type"] for e in stored] == ["run_start", *["round"] * N_ROUNDS]
            assert all(e["kv"] for e in stored[1:])
