"""Switching the served model: Worker.replace_engine cancels the current engine's runs cleanly (run_end sent, KV
freed) before the swap, later runs use the new engine, and the compare view never calls two runs of different
models the same."""
from __future__ import annotations

import shutil
import threading
import weakref

import pytest

from specscope.app.figures import Claim, lossless_badge, metrics_table_html
from specscope.app.modebook import ModeBook
from specscope.app.trace import RunTrace
from specscope.backend.engine.engine import Engine
from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, load_checkpoint
from specscope.backend.server.worker import Worker
from specscope.backend.tracing import RecordingTracer

PROMPT = "Reverse: q w e r t y u i"


@pytest.fixture(scope="module")
def other_engine(tmp_path_factory) -> Engine:
    folder = tmp_path_factory.mktemp("models") / "other"
    shutil.copytree(DEFAULT_CHECKPOINT, folder)
    return Engine(load_checkpoint(folder), num_slots=1024)


def test_replace_engine_cancels_a_running_run_and_serves_the_new_engine(loaded, other_engine) -> None:
    old = Engine(loaded, num_slots=1024)
    worker = Worker(old)
    swaps, asked = [], threading.Event()

    def swap_after_first_round(event: dict) -> None:
        """Asked from the worker thread itself, while the run holds KV slots, so the run cannot end first."""
        if event["type"] == "round" and not swaps:
            swaps.append(worker.replace_engine(other_engine))
            asked.set()

    first = RecordingTracer(sink=swap_after_first_round, hold_s=0)   # each round reaches the sink as it ends
    worker.start()
    try:
        worker.submit(PROMPT, "ar", {"max_new_tokens": 8}, first, threading.Event()).result(30)
        assert asked.wait(60) and swaps[0].result(60) is other_engine and worker.engine is other_engine
        end = first.events[-1]
        assert end["type"] == "run_end" and end["status"] == "cancelled" and end["reason"] == "model_switch"
        assert sum(e["type"] == "round" for e in first.events) < 8
        assert old.rt.pool.used == 0 and not old.scheduler.has_work
        ended = threading.Event()
        second = RecordingTracer(sink=lambda e: ended.set() if e["type"] == "run_end" else None)
        worker.submit(PROMPT, "ar", {"max_new_tokens": 4}, second, threading.Event()).result(30)
        assert ended.wait(60)
    finally:
        worker.stop()
    start = second.events[0]
    assert (start["model"], start["model_hash"]) == ("other", other_engine.rt.loaded.weights_hash)
    assert second.events[-1]["status"] == "done" and other_engine.rt.pool.used == 0


def test_a_replaced_engine_is_freed_even_from_a_reference_cycle(loaded, other_engine) -> None:
    """Engines exempt what they load from the cyclic GC (gc.freeze); a swap must undo that for the old one."""
    worker = Worker(Engine(loaded, num_slots=64))
    worker.engine.cycle = worker.engine  # type: ignore[attr-defined]  # only the cyclic GC can free it now
    gone = weakref.ref(worker.engine)
    worker.start()
    try:
        assert worker.replace_engine(other_engine).result(60) is other_engine
    finally:
        worker.stop()
    assert gone() is None


def trace(mode: str, output: list[int], model: str, model_hash: str, matmul: str | None = None) -> RunTrace:
    run_id = f"r_{mode}_{model}_{matmul}"
    start = {"type": "run_start", "run_id": run_id, "mode": mode, "params": {}, "model": model,
             "model_hash": model_hash, "prompt_ids": [5], "pieces": ["x"], **({"matmul": matmul} if matmul else {})}
    return RunTrace.from_events([start,
                                {"type": "run_end", "run_id": run_id, "status": "done", "output_ids": output,
                                 "text": "", "metrics": {}}])


def test_compare_says_different_model_instead_of_a_verdict() -> None:
    ref = trace("ar", [7, 8], "a", "sha256:aaa")
    same = trace("linear_spec", [7, 8], "a", "sha256:aaa")
    other = trace("linear_spec", [7, 8], "b", "sha256:bbb")
    table = metrics_table_html([ref, same, other], ref, ModeBook.of([{"name": "linear_spec", "lossless_vs": "ar"}]))
    rows = table.split("<tr>")[2:]
    assert "same output as reference" in rows[1] and "different model" not in rows[1]
    assert "different model" in rows[2] and "same output" not in rows[2]
    assert "== ar" in lossless_badge(same, [ref, same], {"linear_spec": Claim("ar", {})})
    assert "different model" in lossless_badge(other, [ref, other], {"linear_spec": Claim("ar", {})})


def test_compare_gives_no_verdict_across_matmul_precisions() -> None:
    """The same weights with bf16 and with float32 matmuls make different numbers: no verdict between such runs;
    a run that did not record its precision is compared as before."""
    claims = {"linear_spec": Claim("ar", {})}
    ref = trace("ar", [7, 8], "a", "sha256:aaa", "float32")
    bf16 = trace("linear_spec", [7, 9], "a", "sha256:aaa", "bf16")
    unrecorded = trace("linear_spec", [7, 8], "a", "sha256:aaa")
    book = ModeBook.of([{"name": "linear_spec", "lossless_vs": "ar"}])
    rows = metrics_table_html([ref, bf16, unrecorded], ref, book).split("<tr>")[2:]
    assert "bf16 matmuls, not float32" in rows[1] and "differs" not in rows[1]
    assert "same output as reference" in rows[2]
    assert lossless_badge(bf16, [ref, bf16], claims).endswith("ar ran with float32 matmuls, not bf16</span>")
    assert "== ar" in lossless_badge(bf16, [ref, bf16, trace("ar", [7, 9], "a", "sha256:aaa", "bf16")], claims)


def test_token_pieces_come_from_the_vocabulary_of_the_runs_model() -> None:
    """After a switch the UI shows a run's tokens with its own model's vocabulary, never the other model's."""
    from specscope.app.session import Backend

    class Switching:
        http_url = "http://backend"
        served = ("a", ["A0", "A1"])

        def vocab(self) -> tuple[str, list[str]]:
            return self.served

    backend, client = Backend(), Switching()
    run_a, run_b = trace("ar", [1], "a", "sha256:aaa"), trace("ar", [1], "b", "sha256:bbb")
    assert backend.piece(client, run_a)(1) == "A1"
    assert backend.piece(client, run_b)(1) == "#1"   # b is not served: its recorded pieces only
    client.served = ("b", ["B0", "B1"])
    assert backend.piece(client, run_b)(1) == "B1" and backend.piece(client, run_a)(1) == "A1"
