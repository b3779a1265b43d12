"""Server-side cost of the visualizer on long runs (a perf script, not a timed test).

    python -m tools.viz_perf [--db sqlite:///sessions/perf.db]

Records a 512-token `ar` run and a long `block_diffusion` run (thousands of rounds), stores them, then
measures the REST read of one round and what opening a run costs on the server: the trace fetch and the
visualizer document (app/vizdoc.py), with the size the browser receives once; stepping is then browser-only.
"""
from __future__ import annotations

import argparse
import statistics
import time

from fastapi.testclient import TestClient

from specscope.app.trace import RunTrace, make_piece
from specscope.app.vizdoc import document_json, viz_document
from specscope.backend.engine.engine import Engine
from specscope.backend.server import create_app
from specscope.backend.store import Store, StoreWriter, Tee

CODE = "import os\n\n\nclass Config:\n    def __init__(self, path):\n        "


def record(engine: Engine, writer: StoreWriter, mode: str, max_new: int) -> str:
    tracer = Tee(writer).tracer()
    engine.generate(CODE, mode, {"max_new_tokens": max_new, "raw": True}, tracer=tracer)
    writer.flush()
    return tracer.run_id


def ms(f, repeat: int = 20) -> float:
    """Median wall time of f() in ms."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def fetch(client: TestClient, run_id: str) -> RunTrace:
    """What the UI does to open a run: its events and KV intervals over REST."""
    return RunTrace.from_events(client.get(f"/api/runs/{run_id}/export?format=json").json()["events"],
                                client.get(f"/api/runs/{run_id}/kv").json())


def measure(client: TestClient, vocab: list[str], label: str, run_id: str) -> None:
    trace = fetch(client, run_id)
    piece = make_piece(vocab, trace.known_pieces)
    n = len(trace.rounds)
    mid = n // 2
    rest = ms(lambda: client.get(f"/api/runs/{run_id}/rounds?start={mid}&stop={mid + 1}"))
    open_ms = ms(lambda: fetch(client, run_id), repeat=3)
    doc_ms = ms(lambda: viz_document(trace, piece), repeat=3)
    size = len(document_json(viz_document(trace, piece)))
    print(f"{label}: {n} rounds | REST one round {rest:.1f} ms | open: fetch {open_ms:.0f} ms + visualizer "
          f"document {doc_ms:.0f} ms, {size / 1e3:.0f} kB (steps then run in the browser)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="sqlite:///sessions/perf.db")
    args = p.parse_args()
    engine = Engine()
    with Store(args.db) as store, StoreWriter(store) as writer:
        runs = {"ar 512 tokens": record(engine, writer, "ar", 512),
                "block_diffusion 900 tokens": record(engine, writer, "block_diffusion", 900)}
        client = TestClient(create_app(engine, store))
        vocab = client.get("/api/vocab").json()["pieces"]
        for label, run_id in runs.items():
            measure(client, vocab, label, run_id)


if __name__ == "__main__":
    main()
