"""Does serving slow the engine? A mode's tok/s in-process (untraced, and traced into a store) vs through the server.

    python -m backend.server.throughput [--mode ar] [--db sqlite:///sessions/throughput.db]
                                         [--max-new-tokens 128] [--threads 1] [--repeat 3]

The server is `specscope serve --no-ui` (its engine in a process of its own), as users run it, with this process
as its websocket client (a client sharing the server's process would tax its GIL with work a browser does elsewhere),
once with a message per event (the protocol's default) and once with batched frames (`?frames=batch`, as the UI's
client asks).
Each prompt runs once per path per repeat, one run at a time, the paths interleaved, after a warm-up run.
In-process tok/s is the engine's own figure (run_end metrics); through the server both the engine's figure from
run_end and the client's (tokens over the time from sending `generate` to receiving run_end, which is sent once
the run is stored) are reported, each also as the median of its per-run ratios to the untraced in-process run
of the same prompt in the same repeat.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request

import torch
from websockets.asyncio.client import connect

from backend.engine.engine import Engine
from backend.store import Store, StoreWriter, Tee
from backend.tracing import NULL_TRACER

PROMPTS = ["What is 12 + 30?", "Reverse: a b c d e f", "Write a haiku about rivers.",
           "import os\n\n\nclass Config:\n    def __init__(self, path):\n        "]


def in_process(engine: Engine, writer: StoreWriter | None, mode: str, prompt: str, n: int) -> float:
    tracer = Tee(writer).tracer() if writer else NULL_TRACER
    res = engine.generate(prompt, mode, {"max_new_tokens": n, "raw": True}, tracer)
    if writer:
        writer.flush()
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
    paths = {"": "event", ", batched": "batch"}
    rows: dict[str, list[float]] = {"in-process, untraced": [], "in-process, traced + stored": []}
    for label in paths:
        rows |= {f"through the server{label} (engine's figure)": [], f"through the server{label} (client)": []}
    server = serve_in_process(args.db, args.port, args.threads)
    try:
        with Store(args.db, server="throughput:0") as store, StoreWriter(store) as writer:
            in_process(engine, writer, mode, PROMPTS[0], n)  # warm-up
            asyncio.run(through_server(args.port, mode, PROMPTS[0], n))
            for _ in range(args.repeat):  # interleaved, so load changes on a shared machine hit every path alike
                for q in PROMPTS:
                    rows["in-process, untraced"].append(in_process(engine, None, mode, q, n))
                    rows["in-process, traced + stored"].append(in_process(engine, writer, mode, q, n))
                    for label, frames in paths.items():
                        client, engine_side = asyncio.run(through_server(args.port, mode, q, n, frames))
                        rows[f"through the server{label} (client)"].append(client)
                        rows[f"through the server{label} (engine's figure)"].append(engine_side)
    finally:
        server.terminate()
        server.wait(60)
    base = rows["in-process, untraced"]
    for label, figures in rows.items():
        paired = statistics.median(f / b for f, b in zip(figures, base, strict=True))
        print(f"{label:47s} median {statistics.median(figures):7.1f} tok/s  min {min(figures):6.1f}  "
              f"max {max(figures):6.1f}  {paired:.3f}x in-process (median of per-run ratios)")


if __name__ == "__main__":
    main()
