"""Does serving slow the engine? `ar` tok/s in-process (untraced, and traced into a store) vs through the server.

    python -m backend.server.throughput [--db sqlite:///sessions/throughput.db] [--max-new-tokens 128]

Each prompt runs once per path per repeat, one run at a time, the paths interleaved, after a warm-up run.
In-process tok/s is the engine's own figure (run_end metrics); through the server it is tokens over the wall time
from sending `generate` to receiving run_end, as a client sees it (run_end is sent once the run is stored).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time

import uvicorn
from websockets.asyncio.client import connect

from backend.engine.engine import Engine
from backend.server.app import create_app
from backend.store import Store, StoreWriter, Tee

PROMPTS = ["What is 12 + 30?", "Reverse: a b c d e f", "Write a haiku about rivers.",
           "import os\n\n\nclass Config:\n    def __init__(self, path):\n        "]


def in_process(engine: Engine, writer: StoreWriter | None, prompt: str, n: int) -> float:
    tracer = Tee(writer).tracer() if writer else None
    res = engine.generate(prompt, "ar", {"max_new_tokens": n, "raw": True},
                          **({"tracer": tracer} if tracer else {}))
    if writer:
        writer.flush()
    return res.metrics["tokens"] / (res.metrics["wall_ms"] / 1000)


async def through_server(port: int, prompt: str, n: int) -> tuple[float, float]:
    """(tok/s as the client sees it, the engine's own tok/s from run_end) of one run through the server."""
    async with connect(f"ws://127.0.0.1:{port}/ws/generate", max_size=None) as ws:
        began = time.perf_counter()
        await ws.send(json.dumps({"type": "generate", "prompt": prompt, "mode": "ar",
                                  "params": {"max_new_tokens": n, "raw": True}}))
        async for raw in ws:
            event = json.loads(raw)
            if event["type"] == "run_end":
                tokens, wall = event["metrics"]["tokens"], time.perf_counter() - began
                return tokens / wall, tokens / (event["metrics"]["wall_ms"] / 1000)
    raise RuntimeError("the server closed the socket before run_end")


def serve_in_thread(app: object, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="sqlite:///sessions/throughput.db")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--port", type=int, default=7871)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    engine, n = Engine(num_slots=4096), args.max_new_tokens
    rows: dict[str, list[float]] = {"in-process, untraced": [], "in-process, traced + stored": [],
                                    "through the server (engine's figure)": [], "through the server (client)": []}
    with Store(args.db, server="throughput:0") as store:
        server, thread = serve_in_thread(create_app(engine, store, ui=False), args.port)
        with StoreWriter(store) as writer:
            in_process(engine, writer, PROMPTS[0], n)  # warm-up
            for _ in range(args.repeat):  # interleaved, so load changes on a shared machine hit every path alike
                for q in PROMPTS:
                    rows["in-process, untraced"].append(in_process(engine, None, q, n))
                    rows["in-process, traced + stored"].append(in_process(engine, writer, q, n))
                    client, engine_side = asyncio.run(through_server(args.port, q, n))
                    rows["through the server (client)"].append(client)
                    rows["through the server (engine's figure)"].append(engine_side)
        server.should_exit = True
        thread.join(60)
    base = statistics.median(rows["in-process, untraced"])
    for label, figures in rows.items():
        median = statistics.median(figures)
        print(f"{label:38s} median {median:7.1f} tok/s  ({median / base:.2f}x of in-process)  "
              f"min {min(figures):.1f} max {max(figures):.1f}")


if __name__ == "__main__":
    main()
