"""Does serving slow the engine? A mode's tok/s in-process (untraced, traced, traced + stored) vs through a server.

    specscope throughput [--mode ar] [--db sqlite:///sessions/throughput.db]
                                [--max-new-tokens 128] [--threads 1] [--repeat 3] [--model tiny] [--matmul bf16]

Both sides serve the same model with the same options (--model, --adapter, --dtype, --matmul, --slots: the
model options every command takes; the KV pool defaults to 4096 slots a side, not half the free memory each).
Every in-process run steps on this process's main thread, which loaded the model: an engine stepped on a second
thread would give this process a second OpenMP team and slow every in-process path (`Worker.run` says why).

The server is `specscope serve --no-ui` (its engine in a process of its own), as users run it, with this process
as its websocket client (a client sharing the server's process would tax its GIL with work a browser does elsewhere),
once with a message per event (the protocol's default) and once with batched frames (`?frames=batch`, as the UI's
client asks).
Each prompt runs twice per path per repeat, the second run counting (steady state: see main), one run at a time,
the paths interleaved in a shuffled order, after a warm-up run of each. The server prices rows with the in-process
engine's cost curve (handed over with --cost-curve FILE), so both sides run the same rounds.
In-process tok/s is the engine's own figure (run_end metrics); through the server both the engine's figure from
run_end and the client's (tokens over the time from sending `generate` to receiving run_end, a new connection per
run as the UI's client makes) are reported, each also as the median of its per-run ratios to the untraced in-process run
of the same prompt in the same repeat, and to the traced in-process run (what serving adds to tracing). A run that
ends after a few tokens measures latency more than throughput, so each path's tokens over its seconds, all runs
together, are reported too (and their ratio to the untraced runs'): the cost serving adds to every token. So is the
CPU each path spends a token (user + system time, every run of the path together), which a busy machine's other work
inflates far less than it does wall time: in process, this process's (the engine, and the store writer's thread
when stored); through the server, the server process's own (receiving, storing and streaming the events, read from
/proc once the run is stored) and its engine process's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from websockets.asyncio.client import connect

from specscope.backend.cli.common import build_engine
from specscope.backend.cli.options import add_model_args
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import baseline
from specscope.backend.store import Store, StoreWriter, Tee
from specscope.backend.tracing import NULL_TRACER

Timed = tuple[int, float]
"""A run's tokens and seconds."""
Rows = Callable[[str], dict[str, Timed]]
"""One way to run a prompt: its (tokens, seconds) by row label."""
CPU = "CPU ms a token, "
"""The labels of the (tokens, CPU seconds) rows, printed as CPU ms a token."""
PROMPTS = ["What is 12 + 30?", "Reverse: a b c d e f", "Write a haiku about rivers.",
           "import os\n\n\nclass Config:\n    def __init__(self, path):\n        "]


def in_process(engine: Engine, tee: Tee | None, mode: str, prompt: str, n: int) -> tuple[Timed, float]:
    """One run in this process: untraced (tee None), or traced into `tee` (stored when it has a writer); and the CPU
    seconds this process spent on it."""
    cpu = time.process_time()
    res = engine.generate(prompt, mode, {"max_new_tokens": n}, tee.tracer() if tee else NULL_TRACER)
    if tee is not None and tee.writer is not None:
        tee.writer.flush()
    return (res.metrics["tokens"], res.metrics["wall_ms"] / 1000), time.process_time() - cpu


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (its own threads, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> float:
    """The CPU time so far of a process's live children (the server's engine process)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return sum(cpu_seconds(int(kid)) for kid in kids)


async def through_server(port: int, mode: str, prompt: str, n: int, frames: str,
                         server: int) -> tuple[Timed, Timed, float, float]:
    """One run through the server, as the client timed it and as the engine did (run_end's wall_ms), and the CPU
    seconds the server process (pid `server`) and its engine process spent on it, up to the run being stored."""
    cpu, engine_cpu = cpu_seconds(server), children_cpu_seconds(server)
    async with connect(f"ws://127.0.0.1:{port}/ws/generate?frames={frames}", max_size=None) as ws:
        began = time.perf_counter()
        await ws.send(json.dumps({"type": "generate", "prompt": prompt, "mode": mode,
                                  "params": {"max_new_tokens": n}}))
        async for raw in ws:   # parse only run_end: the client's own work shares this machine's cores
            if '"type":"run_end"' not in raw:
                continue
            event = json.loads(raw)
            event = event[-1] if isinstance(event, list) else event
            if event["type"] == "run_end":
                tokens, wall = event["metrics"]["tokens"], time.perf_counter() - began
                # a read of the run waits for the server to have stored it
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs/{event['run_id']}", timeout=60).close()
                return ((tokens, wall), (tokens, event["metrics"]["wall_ms"] / 1000), cpu_seconds(server) - cpu,
                        children_cpu_seconds(server) - engine_cpu)
    raise RuntimeError("the server closed the socket before run_end")


def model_flags(args: argparse.Namespace) -> list[str]:
    """The model options of this command, for the server's command line."""
    named = {"--model": args.model, "--adapter": args.adapter, "--adapter-scope": args.adapter_scope,
             "--device": args.device, "--dtype": args.dtype, "--slots": args.slots, "--matmul": args.matmul}
    return [str(x) for flag, value in named.items() if value is not None for x in (flag, value)]


def serve_in_process(args: argparse.Namespace, curve: Path) -> subprocess.Popen[bytes]:
    """`specscope serve --no-ui` on this command's model options and the cost curve in `curve` as a child process,
    once its health endpoint answers."""
    server = subprocess.Popen([sys.executable, "-m", "specscope.backend.cli", "serve", "--no-ui", "--db", args.db,
                               "--port", str(args.port), "--threads", str(args.threads), *model_flags(args),
                               "--cost-curve", str(curve)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with status {server.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{args.port}/api/health", timeout=1).close()
            return server
        except OSError:
            time.sleep(0.2)
    server.terminate()
    raise RuntimeError("the server did not answer within 120 s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", default="", help="the mode to run (default: the exact one, the baseline)")
    p.add_argument("--db", default="sqlite:///sessions/throughput.db")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--port", type=int, default=7871)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads, here and in the server")
    add_model_args(p)
    p.set_defaults(slots=4096, block_size_tiers=None, draft_tiers="none")


def run(args: argparse.Namespace) -> int:
    engine, n = build_engine(args), args.max_new_tokens   # sets torch's threads to --threads
    mode = args.mode or baseline()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(engine.cost_curve.to_json(), f)
    server = serve_in_process(args, Path(f.name))
    rows: dict[str, list[Timed]] = {}
    try:
        with Store(args.db, server="throughput:0") as store, StoreWriter(store) as writer:
            def through(label: str, frames: str) -> Rows:
                def one(q: str) -> dict[str, Timed]:
                    client, engine_side, cpu, engine_cpu = asyncio.run(
                        through_server(args.port, mode, q, n, frames, server.pid))
                    return {f"through the server{label} (engine's figure)": engine_side,
                            f"through the server{label} (client)": client,
                            f"{CPU}through the server{label}: the server process": (client[0], cpu),
                            f"{CPU}through the server{label}: its engine process": (client[0], engine_cpu)}
                return one

            def inside(label: str, tee: Tee | None) -> Rows:
                def one(q: str) -> dict[str, Timed]:
                    run, cpu = in_process(engine, tee, mode, q, n)
                    return {label: run, f"{CPU}{label}": (run[0], cpu)}
                return one

            paths: list[Rows] = [inside("in-process, untraced", None), inside("in-process, traced", Tee(None)),
                                 inside("in-process, traced + stored", Tee(writer)),
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
        os.unlink(f.name)
    print_table(rows)
    return 0


def print_table(rows: dict[str, list[Timed]]) -> None:
    """Each path's tok/s: per run (median, min, max, and the medians of its per-run ratios to the untraced and the
    traced in-process runs), and all its runs' tokens over all their seconds (and that against the untraced runs')."""
    def rate(run: Timed) -> float:
        return run[0] / run[1]

    def overall(runs: list[Timed]) -> float:
        return sum(t for t, _ in runs) / sum(s for _, s in runs)

    cpu = {label: rows.pop(label) for label in list(rows) if label.startswith(CPU)}
    untraced, traced = rows["in-process, untraced"], rows["in-process, traced"]
    print(f"{'':47s} {'median tok/s':>12s} {'min':>7s} {'max':>7s}  vs untraced  vs traced   all runs  vs untraced")
    for label, runs in rows.items():
        vs_untraced, vs_traced = (statistics.median(rate(r) / rate(b) for r, b in zip(runs, base, strict=True))
                                  for base in (untraced, traced))
        rates, total = [rate(r) for r in runs], overall(runs)
        print(f"{label:47s} {statistics.median(rates):12.1f} {min(rates):7.1f} {max(rates):7.1f}  "
              f"{vs_untraced:10.3f}x {vs_traced:8.3f}x  {total:9.1f} {total / overall(untraced):10.3f}x")
    print("(per-run columns: medians of per-run ratios; all runs: tokens over seconds, every run of the path)")
    for label, runs in cpu.items():
        tokens, seconds = sum(t for t, _ in runs), sum(s for _, s in runs)
        print(f"{label}: {seconds / tokens * 1000:.3f} ({tokens} tokens)")
