"""The server's own work a token, in isolation: what `specscope serve`'s server process does with a run's events
between the engine process and the client, timed as CPU (every thread of this process), away from the engine.

    python -m tools.server_work [--tokens 256] [--repeat 30]

An `ar` run of the tiny model (a raw code prompt, no EOS before --tokens) is recorded once; its events are then
served again and again as the server takes them: pickled in ~50 ms batches as the engine process sends them,
unpickled, relayed into the run's server-side tracer (`RecordingTracer.relay` -> `Tee` -> `StoreWriter` into
SQLite, the run derived at its end) and encoded for the websocket, a frame an event (`?frames=event`) or an array a
batch (`?frames=batch`). Prints the median CPU µs a token of --repeat runs, each way. The websocket's own sends and
the event loop are left out. It runs on any checkout (before and after a change to the trace or the store: set
PYTHONPATH to the checkout), the trace in the form that checkout's tracer makes.
"""
from __future__ import annotations

import argparse
import pickle
import statistics
import tempfile
import time
from typing import Any

import torch

from specscope.backend.engine.engine import Engine
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.store import Store, StoreWriter, Tee
from specscope.backend.tracing import RecordingTracer, new_run_id, to_json

PROMPT = "import os\n\n\nclass Config:\n    def __init__(self, path):\n        "
Event = dict[str, Any]


def serve(events: list[Event], writer: StoreWriter, batched: bool, batches: int = 8) -> float:
    """The CPU seconds the server's side of one run takes: its events arrive in `batches` pickled messages."""
    run_id = new_run_id()
    mine = [{**e, "run_id": run_id} for e in events]
    size = max(1, len(mine) // batches)
    pipe = [pickle.dumps([(0, e) for e in mine[i:i + size]]) for i in range(0, len(mine), size)]
    ready: list[Event] = []
    frames: list[str] = []
    tracer = Tee(writer, ready.append).tracer(run_id)
    began = time.process_time()
    for message in pipe:
        for _, event in pickle.loads(message):
            tracer.relay(event)
        frames += [to_json(ready)] if batched else [to_json(e) for e in ready]
        ready.clear()
    writer.flush()
    return time.process_time() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    recorded = RecordingTracer()
    Engine(load_checkpoint(), num_slots=4096).generate(PROMPT, "ar", {"max_new_tokens": args.tokens, "raw": True},
                                                      recorded)
    events, tokens = recorded.events, len(recorded.events[-1]["output_ids"])
    with tempfile.TemporaryDirectory() as folder, Store(f"sqlite:///{folder}/work.db") as store, \
            StoreWriter(store) as writer:
        for batched in (False, True):
            serve(events, writer, batched)
            spent = statistics.median(serve(events, writer, batched) for _ in range(args.repeat))
            print(f"{'batched' if batched else 'event'} frames: {spent / tokens * 1e6:.1f} µs a token "
                  f"({len(events)} events for {tokens} tokens; median of {args.repeat})")


if __name__ == "__main__":
    main()
