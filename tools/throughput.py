"""Does serving slow the engine? A mode's tok/s in-process (untraced, traced, traced + stored, traced on the
server's engine loop in a thread of this process) vs through a server.

    python -m tools.throughput [--mode ar] [--db sqlite:///sessions/throughput.db]
                                [--max-new-tokens 128] [--threads 1] [--repeat 3]

The server is `specscope serve --no-ui` (its engine in a process of its own), as users run it, with this process
as its websocket client (a client sharing the server's process would tax its GIL with work a browser does elsewhere),
once with a message per event (the protocol's default) and once with batched frames (`?frames=batch`, as the UI's
client asks).
Each prompt runs twice per path per repeat, the second run counting (steady state: see main), one run at a time,
the paths interleaved in a shuffled order, after a warm-up run of each.
In-process tok/s is the engine's own figure (run_end metrics); through the server both the engine's figure from
run_end and the client's (tokens over the time from sending `generate` to receiving run_end, a new connection per
run as the UI's client makes) are reported, each also as the median of its per-run ratios to the untraced in-process run
of the same prompt in the same repeat, and to the traced in-process run (what serving adds to tracing).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future

import torch
from websockets.asyncio.client import connect

from backend.engine.engine import Engine
from backend.server.service import LocalEngine
from backend.store import Store, StoreWriter, Tee
from backend.tracing import NULL_TRACER

Path = Callable[[str], dict[str, float]]
"""One way to run a prompt: its figures (tok/s) by row label."""
PROMPTS = ["What is 12 + 30?", "Reverse: a b c d e f", "Write a haiku about rivers.",
           "import os\n\n\nclass Config:\n    def __init__(self, path):\n        "]


def on_worker(service: LocalEngine, mode: str, prompt: str, n: int) -> float:
    """tok/s of one traced run on the server's engine loop (`Worker`) in a thread of this process: serving without
    the process boundary, the pipe or the server's other threads."""
    ended: Future[dict] = Future()
    tracer = Tee(None, lambda event: ended.set_result(event) if event["type"] == "run_end" else None).tracer()
    service.submit(prompt, mode, {"max_new_tokens": n, "raw": True}, tracer)
    metrics = ended.result(timeout=600)["metrics"]
    return metrics["tokens"] / (metrics["wall_ms"] / 1000)


def in_process(engine: Engine, tee: Tee | None, mode: str, prompt: str, n: int) -> float:
    """tok/s of one run in this process: untraced (tee None), or traced into `tee` (stored when it has a writer)."""
    res = engine.generate(prompt, mode, {"max_new_tokens": n, "raw": True}, tee.tracer() if tee else NULL_TRACER)
    if tee is not None and tee.writer is not None:
        tee.writer.flush()
    return res.metrics["tokens"] / (res.metrics["wall_ms"] / 1000)


async def through_server(port: int, mode: str, prompt: str, n: int, frames: str = "event") -> tuple[float, float]:
    """(tok/s as the client sees it, the engine's own tok/s from run_end) of one run through the server."""
    async with connect(f"ws://127.0.0.1:{port}/ws/generate?frames={frames}", max_size=None) as ws:
        began = time.perf_counter()
        await ws.send(json.dumps({"type": "generate", "prompt": prompt, "mode": mode,
                                  "params": {"max_new_tokens": n, "raw": True}}))
        async for raw in ws:   # parse only run_end: the client's own work shares this machine's cores
            if '"type":"run_end"' not in raw:
                continue
            event = json.loads(raw)
            event = event[-1] if isinstance(event, list) else event
            if event["type"] == "run_end":
                tokens, wall = event["metrics"]["tokens"], time.perf_counter() - began
                return tokens / wall, tokens / (event["metrics"]["wall_ms"] / 1000)
    raise RuntimeError("the server closed the socket before run_end")


def serve_in_process(db: str, port: int, threads: int) -> subprocess.Popen[bytes]:
    """`specscope serve --no-ui` as a child process, once its health endpoint answers."""
    server = subprocess.Popen([sys.executable, "-m", "backend.cli", "serve", "--no-ui", "--db", db,
                               "--port", str(port), "--threads", str(threads)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1).close()
            return server
        except OSError:
            time.sleep(0.2)
    server.terminate()
    raise RuntimeError("the server did not answer within 120 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="ar")
    p.add_argument("--db", default="sqlite:///sessions/throughput.db")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--port", type=int, default=7871)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads, here and in the server")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine, mode, n = Engine(num_slots=4096), args.mode, args.max_new_tokens
    service = LocalEngine(engine)   # shares the engine: one run at a time, the worker idles between its runs
    service.start()
    server = serve_in_process(args.db, args.port, args.threads)
    rows: dict[str, list[float]] = {}
    try:
        with Store(args.db, server="throughput:0") as store, StoreWriter(store) as writer:
            def through(label: str, frames: str) -> Path:
                def run(q: str) -> dict[str, float]:
                    client, engine_side = asyncio.run(through_server(args.port, mode, q, n, frames))
                    return {f"through the server{label} (engine's figure)": engine_side,
                            f"through the server{label} (client)": client}
                return run

            paths: list[Path] = [lambda q: {"in-process, untraced": in_process(engine, None, mode, q, n)},
                                 lambda q: {"in-process, traced": in_process(engine, Tee(None), mode, q, n)},
                                 lambda q: {"in-process, traced + stored": in_process(engine, Tee(writer), mode, q, n)},
                                 lambda q: {"in-process, traced, worker thread": on_worker(service, mode, q, n)},
                                 through("", "event"), through(", batched", "batch")]
            for path in paths:   # warm-up; also fixes the rows' order
                rows |= {label: [] for label in path(PROMPTS[0])}
            # Every path in turn, in a shuffled order: a run is slower right after some paths than after others
            # (a fixed or rotated order put the untraced run after a server run every time, at -10 %). Each path
            # runs the prompt twice and the second run counts: the server's engine process and this process hold
            # two copies of the model, and a run right after the other copy's runs finds its weights evicted from
            # the shared L3 (a 3-token run through the server at 0.65 of untraced, 0.89 when it follows another).
            order = random.Random(0)
            for _ in range(args.repeat):
                for q in PROMPTS:
                    for path in order.sample(paths, len(paths)):
                        path(q)
                        for label, figure in path(q).items():
                            rows[label].append(figure)
    finally:
        server.terminate()
        server.wait(60)
        service.stop()
    untraced, traced = rows["in-process, untraced"], rows["in-process, traced"]
    print(f"{'':47s} {'median tok/s':>12s} {'min':>7s} {'max':>7s}  vs untraced  vs traced (medians of per-run ratios)")
    for label, figures in rows.items():
        vs_untraced, vs_traced = (statistics.median(f / b for f, b in zip(figures, base, strict=True))
                                  for base in (untraced, traced))
        print(f"{label:47s} {statistics.median(figures):12.1f} {min(figures):7.1f} {max(figures):7.1f}  "
              f"{vs_untraced:10.3f}x  {vs_traced:8.3f}x")


if __name__ == "__main__":
    main()
