"""A bounded load and fault run against a specscope server over loopback, through the OpenAI-compatible API.

    specscope loadtest --spawn --model smollm2-135m --clients 16 --requests 64 --max-tokens 32

`--spawn` starts `specscope serve` in a subprocess (its own SQLite store, `--max-queued`), else `--url` points at a
running server. Phases, each checked:
- load: `--clients` concurrent streaming clients share `--requests` requests in mixed modes; time to first token,
  inter-token latency and tokens/s per mode (p50/p99);
- levels (asked for by name): each of `--modes` alone and mixed at each of `--levels` clients: aggregate tok/s
  against `ar`'s, TTFT and time between chunks (p50/p99), and the forwards the runs shared (from their rounds);
- store: every answered run is stored once, done, with the answer's text; runs made = requests sent;
- busy: more simultaneous requests than `--max-queued` admits get OpenAI-shaped 429s, the rest are answered;
- disconnects: clients that leave mid-stream leave no run active and no KV slot held;
- outage (with `--store-stop` and `--store-start`, shell commands that stop and start the store's database):
  streams in flight see the database stopped for `--outage-s`; meanwhile health says the store is unavailable and
  reads are 503s; afterwards every acknowledged run is stored, done, with its text, and the server needs no restart;
- memory: the server's resident memory (its process and the engine's) grows by less than RSS_GROWTH_MB.
Prints a JSON report (and writes it with `--out`); exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specscope.backend.train.prompts import prompt_set

TOKEN = "loadtest-token"
RSS_GROWTH_MB = 512   # the server's resident memory may grow this much over a run (caches, allocator pools)
SERVE = "import sys; from specscope.backend.cli import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class Sample:
    """One streamed request, as the client saw it."""
    mode: str
    run_id: str = ""
    text: str = ""
    status: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency after the first token."""
        return (self.total_s - self.ttft_s) / (self.tokens - 1) if self.tokens > 1 else None


def percentile(values: Sequence[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


class Target:
    """The server under load: its base URL, the model id to ask for, and (when spawned) its process."""

    def __init__(self, url: str, token: str | None, proc: subprocess.Popen | None = None):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.proc = proc
        self.model = httpx.get(f"{self.url}/v1/models", headers=self.headers, timeout=30).json()["data"][0]["id"]

    def get(self, path: str) -> Any:
        answer = httpx.get(f"{self.url}{path}", headers=self.headers, timeout=60)
        answer.raise_for_status()
        return answer.json()

    def rss_mb(self) -> float | None:
        """Resident memory of the spawned server and its children (the engine process), MB."""
        if self.proc is None:
            return None
        pids = [self.proc.pid, *children(self.proc.pid)]
        return sum(rss_kb(p) for p in pids) / 1024


def children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(c) for c in found] + [g for c in found for g in children(int(c))]


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def stream_one(client: httpx.AsyncClient, target: Target, messages: list[dict[str, str]], mode: str,
                     max_tokens: int, leave_after: int | None = None,
                     acknowledged: Callable[[], None] | None = None) -> Sample:
    """One streamed chat completion; with `leave_after`, the client hangs up after that many content chunks.
    `acknowledged()` is called once the answer's headers (with its run id) have arrived."""
    sample = Sample(mode)
    body = {"model": f"{target.model}:{mode}", "messages": messages,
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    async with client.stream("POST", f"{target.url}/v1/chat/completions", json=body, headers=target.headers) as r:
        sample.status = r.status_code
        sample.run_id = r.headers.get("x-specscope-run-id", "")
        if acknowledged is not None:
            acknowledged()
        if r.status_code != 200:
            await r.aread()
            return sample
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                sample.tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if content := choice.get("delta", {}).get("content"):
                    now = time.perf_counter() - start
                    sample.ttft_s = sample.ttft_s or now
                    sample.chunk_times.append(now)
                    sample.text += content
            if leave_after is not None and len(sample.chunk_times) >= leave_after:
                break
    sample.total_s = time.perf_counter() - start
    return sample


async def load_phase(target: Target, clients: int, requests: int, max_tokens: int,
                     modes: Sequence[str]) -> list[Sample]:
    work: asyncio.Queue[tuple[list[dict[str, str]], str]] = asyncio.Queue()
    rows = prompt_set(requests, seed=11)
    for i in range(requests):   # the prompt set repeats when more requests than prompts are asked for
        work.put_nowait((rows[i % len(rows)]["messages"], modes[i % len(modes)]))
    samples: list[Sample] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not work.empty():
            prompt, mode = work.get_nowait()
            samples.append(await stream_one(client, target, prompt, mode, max_tokens))

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return samples


def per_mode(samples: list[Sample], wall_s: float) -> dict[str, Any]:
    by_mode: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_mode[s.mode].append(s)
    out = {}
    for mode, group in by_mode.items():
        ok = [s for s in group if s.status == 200]
        itls = [s.itl_s for s in ok if s.itl_s is not None]
        tokens = sum(s.tokens for s in ok)
        out[mode] = {"requests": len(group), "ok": len(ok), "tokens": tokens,
                     "ttft_p50_s": percentile([s.ttft_s for s in ok], 0.5),
                     "ttft_p99_s": percentile([s.ttft_s for s in ok], 0.99),
                     "itl_p50_s": percentile(itls, 0.5), "itl_p99_s": percentile(itls, 0.99),
                     "tok_per_s_per_client": (sum(s.tokens / s.total_s for s in ok if s.total_s) / len(ok)
                                              if ok else None)}
    out["all"] = {"requests": len(samples), "tokens": sum(s.tokens for s in samples), "wall_s": wall_s,
                  "tok_per_s": sum(s.tokens for s in samples) / wall_s if wall_s else None}
    return out


def served_modes(target: Target) -> tuple[list[str], str]:
    """The server's default modes for the load (GET /api/modes: the exact mode, the baseline, and every mode a draft
    tier shrinks under load, that is with a `draft_param`, that the served model can run) and the baseline."""
    specs = [m for m in target.get("/api/modes") if m.get("available", True)]
    exact = next(m["name"] for m in specs if m.get("exact"))
    return [exact, *(m["name"] for m in specs if m.get("draft_param"))], exact


async def levels_phase(target: Target, levels: Sequence[int], max_tokens: int, modes: Sequence[str],
                       exact: str) -> list[dict]:
    """Each mode alone and the mix of all (where the clients cover every mode), at each client count: that many
    clients send one streamed request each at once. Aggregate tok/s, TTFT and time between tokens (p50 / p99), and
    from the stored rounds the forwards they ran and how many requests and rows each served."""
    rows = []
    for clients in levels:
        mixes = [(m, [m]) for m in modes] + ([("mixed", list(modes))] if clients >= len(modes) else [])
        for label, mix in mixes:
            start = time.perf_counter()
            samples = await load_phase(target, clients, clients, max_tokens, [mix[i % len(mix)]
                                                                                 for i in range(clients)])
            wall = time.perf_counter() - start
            ok = [s for s in samples if s.status == 200]
            gaps = [b - a for s in ok for a, b in itertools.pairwise(s.chunk_times)]
            tokens = sum(s.tokens for s in ok)
            rows.append({"clients": clients, "modes": label, "ok": len(ok), "tok_per_s": tokens / wall,
                         "ttft_p50_s": percentile([s.ttft_s for s in ok], 0.5),
                         "ttft_p99_s": percentile([s.ttft_s for s in ok], 0.99),
                         "between_chunks_p50_s": percentile(gaps, 0.5), "between_chunks_p99_s": percentile(gaps, 0.99),
                         **shared_forwards(target, [s.run_id for s in ok])})
    ar = {r["clients"]: r["tok_per_s"] for r in rows if r["modes"] == exact}   # vs the baseline (`exact`)
    for r in rows:
        r["vs_ar"] = r["tok_per_s"] / ar[r["clients"]] if r["clients"] in ar else None
    return rows


def shared_forwards(target: Target, run_ids: Sequence[str]) -> dict[str, Any]:
    """From the runs' stored rounds: the forwards (by id) their rounds ran, and the mean requests and rows a forward
    served (prefills left out)."""
    forwards: dict[int, dict[str, Any]] = {}
    for run_id in run_ids:
        for rnd in target.get(f"/api/runs/{run_id}/rounds"):
            for phase in rnd.get("phases") or []:
                if phase["kind"] != "prefill" and phase.get("forward_id"):
                    forwards[phase["forward_id"]] = phase
    if not forwards:
        return {"forwards": 0, "requests_per_forward": None, "rows_per_forward": None}
    return {"forwards": len(forwards),
            "requests_per_forward": sum(f["batch_requests"] for f in forwards.values()) / len(forwards),
            "rows_per_forward": sum(f["batch_rows"] for f in forwards.values()) / len(forwards)}


def store_check(target: Target, samples: list[Sample], before: set[str]) -> dict[str, Any]:
    """Every answered run stored once, done, with the text the client got; nothing else made."""
    runs = {r["run_id"]: r for r in target.get("/api/runs?limit=1000")}
    new = set(runs) - before
    sent = [s.run_id for s in samples]
    wrong = [s.run_id for s in samples if s.run_id not in runs or runs[s.run_id]["status"] != "done"
             or runs[s.run_id]["output"] != s.text]
    return {"requests": len(samples), "runs_made": len(new), "distinct_run_ids": len(set(sent)),
            "missing_or_wrong": wrong[:10],
            "ok": not wrong and len(set(sent)) == len(sent) == len(new) and set(sent) == new}


async def busy_phase(target: Target, max_queued: int, max_tokens: int, exact: str) -> dict[str, Any]:
    """max_queued + 4 requests at once: the overflow gets 429 in OpenAI's shape; the admitted ones finish."""
    body = {"model": f"{target.model}:{exact}", "messages": [{"role": "user", "content": "Count from 1 to 50."}],
            "max_tokens": max_tokens}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=max_queued + 8)) as client:
        answers = await asyncio.gather(*(client.post(f"{target.url}/v1/chat/completions", json=body,
                                                     headers=target.headers) for _ in range(max_queued + 4)))
    refused = [a for a in answers if a.status_code == 429]
    shaped = all(a.json().get("error", {}).get("code") == "busy" for a in refused)
    codes = sorted({a.status_code for a in answers})
    return {"sent": len(answers), "answered": sum(a.status_code == 200 for a in answers), "refused_429": len(refused),
            "status_codes": codes, "ok": bool(refused) and shaped and set(codes) <= {200, 429}}


async def disconnect_phase(target: Target, count: int, modes: Sequence[str]) -> dict[str, Any]:
    """`count` clients hang up after their first chunk: no run stays active, no KV slot stays held."""
    async with httpx.AsyncClient(timeout=600) as client:
        story = [{"role": "user", "content": "Write a long story about a lighthouse."}]
        left = await asyncio.gather(*(stream_one(client, target, story, modes[i % len(modes)], 400, leave_after=1)
                                      for i in range(count)))
    deadline = time.monotonic() + 60
    while (health := target.get("/api/health"))["active_runs"] and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    statuses = [target.get(f"/api/runs/{s.run_id}")["status"] for s in left if s.run_id]
    return {"clients": count, "active_runs_after": health["active_runs"], "kv_slots_used_after": health["pool"]["used"],
            "statuses": sorted(set(statuses)),
            "ok": health["active_runs"] == 0 and health["pool"]["used"] == 0 and set(statuses) <= {"cancelled",
                                                                                                    "done"}}


def stored_as_answered(target: Target, samples: list[Sample]) -> list[str]:
    """The answered runs that are not stored done with the text their client got."""
    wrong = []
    for s in samples:
        run = httpx.get(f"{target.url}/api/runs/{s.run_id}", headers=target.headers, timeout=60)
        if run.status_code != 200 or run.json()["status"] != "done" or run.json()["output"] != s.text:
            wrong.append(s.run_id)
    return wrong


async def outage_phase(target: Target, clients: int, max_tokens: int, stop: str, start: str,
                       outage_s: float, modes: Sequence[str]) -> dict[str, Any]:
    """`clients` streams in mixed modes; once every one has its run id, the store's database is stopped (the shell
    command `stop`) for `outage_s`, then started again (`start`). Meanwhile health says the store is unavailable and
    reads are 503s; afterwards every acknowledged run is stored, done, with its client's text, without a restart."""
    acked, all_acked = [0], asyncio.Event()

    def acknowledged() -> None:
        acked[0] += 1
        if acked[0] == clients:
            all_acked.set()

    story = [{"role": "user", "content": "Write a long story about a lighthouse."}]
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 4)) as client:
        streams = [asyncio.create_task(stream_one(client, target, story, modes[i % len(modes)], max_tokens,
                                                  acknowledged=acknowledged)) for i in range(clients)]
        await asyncio.wait_for(all_acked.wait(), 600)
        await asyncio.to_thread(subprocess.run, stop, shell=True, check=True, capture_output=True)
        stopped = time.monotonic()
        streaming_at_stop = sum(not t.done() for t in streams)
        await asyncio.sleep(min(1.0, outage_s))
        health = (await client.get(f"{target.url}/api/health", headers=target.headers)).json()
        read = (await client.get(f"{target.url}/api/runs", headers=target.headers)).status_code
        await asyncio.sleep(max(0.0, outage_s - (time.monotonic() - stopped)))
        await asyncio.to_thread(subprocess.run, start, shell=True, check=True, capture_output=True)
        restarted = time.monotonic()
        while time.monotonic() < restarted + 120:   # the writer's next try, while the streams go on
            answer = await client.get(f"{target.url}/api/runs?limit=1", headers=target.headers)
            if answer.status_code == 200:
                break
            await asyncio.sleep(0.1)
        recovered_s = time.monotonic() - restarted
        streaming_at_restart = sum(not t.done() for t in streams)
        samples = await asyncio.gather(*streams)
    answered = [s for s in samples if s.status == 200]
    wrong = stored_as_answered(target, answered)
    return {"clients": clients, "streaming_at_stop": streaming_at_stop, "outage_s": round(restarted - stopped, 1),
            "health_store_during": health.get("store", {}).get("status"), "runs_read_during": read,
            "answered": len(answered), "stored_as_answered": len(answered) - len(wrong),
            "missing_or_wrong": wrong[:10], "reads_ok_after_restart_s": round(recovered_s, 1),
            "streaming_at_restart": streaming_at_restart,
            "ok": len(answered) == clients and not wrong and streaming_at_stop > 0 and read == 503
            and health.get("store", {}).get("status") == "unavailable" and recovered_s < 120}


async def run_all(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    default, exact = served_modes(target)
    modes = [m for m in args.modes.split(",") if m] or default
    report: dict[str, Any] = {"model": target.model, "clients": args.clients, "requests": args.requests,
                              "max_tokens": args.max_tokens, "modes": modes, "rss_mb_before": target.rss_mb()}
    phases = args.phases.split(",")
    if "load" in phases:
        before = {r["run_id"] for r in target.get("/api/runs?limit=1000")}
        start = time.perf_counter()
        samples = await load_phase(target, args.clients, args.requests, args.max_tokens, modes)
        report["load"] = per_mode(samples, time.perf_counter() - start)
        report["store"] = store_check(target, samples, before)
    if "levels" in phases:
        report["levels"] = await levels_phase(target, [int(n) for n in args.levels.split(",")], args.max_tokens,
                                              modes, exact)
    if "busy" in phases:
        report["busy"] = await busy_phase(target, args.max_queued, args.max_tokens, exact)
    if "disconnects" in phases:
        report["disconnects"] = await disconnect_phase(target, min(args.clients, 8), modes)
    if "outage" in phases and args.store_stop and args.store_start:
        report["outage"] = await outage_phase(target, args.clients, args.max_tokens, args.store_stop,
                                              args.store_start, args.outage_s, modes)
    report["rss_mb_after"] = after = target.rss_mb()
    grown = None if after is None or report["rss_mb_before"] is None else after - report["rss_mb_before"]
    report["rss"] = {"grown_mb": grown, "ok": grown is None or grown < RSS_GROWTH_MB}
    health = target.get("/api/health")
    report["kv"] = {"used_after": health["pool"]["used"], "peak": health["pool"]["peak"],
                    "slots": health["pool"]["slots"], "ok": health["pool"]["used"] == 0}
    report["ok"] = all(report[k]["ok"] for k in ("store", "busy", "disconnects", "outage", "kv", "rss") if k in report)
    return report


@contextmanager
def spawned(args: argparse.Namespace) -> Iterator[Target]:
    """`specscope serve` on a free loopback port with its own store, for the length of the run."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="specscope-load-"))
    command = [sys.executable, "-c", SERVE, "serve", "--no-ui", "--port", str(port), "--token", TOKEN,
               "--db", args.db or f"sqlite:///{folder / 'runs.db'}", "--max-queued", str(args.max_queued),
               *(["--model", args.model] if args.model else [])]
    with (folder / "serve.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ,
                                                                                      "SPECSCOPE_TOKEN": ""})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited: {(folder / 'serve.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/api/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start in 300 s")
            time.sleep(0.3)
        yield Target(url, TOKEN, proc)
    finally:
        proc.terminate()
        proc.wait(60)


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server (loopback), e.g. http://127.0.0.1:7860")
    where.add_argument("--spawn", action="store_true", help="start `specscope serve` for the run")
    p.add_argument("--model", help="with --spawn: the model to serve (default: the server's default)")
    p.add_argument("--token", default=os.environ.get("SPECSCOPE_TOKEN"), help="with --url: the server's token")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--modes", default="", help="comma-separated modes, used in turn (default: the baseline and the "
                                               "modes that draft under a tier's budget, as the server declares them)")
    p.add_argument("--max-queued", type=int, default=24, help="with --spawn: the server's --max-queued (with --url: "
                                                              "what the server was started with)")
    p.add_argument("--phases", default="load,busy,disconnects,outage",
                   help="comma-separated phases to run (also: levels)")
    p.add_argument("--levels", default="1,4,16",
                   help="levels phase: client counts at which each mode runs alone and mixed")
    p.add_argument("--db", help="with --spawn: the server's store URL (default: a SQLite file of its own)")
    p.add_argument("--store-stop", help="outage phase: a shell command that stops the store's database")
    p.add_argument("--store-start", help="outage phase: a shell command that starts it again")
    p.add_argument("--outage-s", type=float, default=5.0, help="outage phase: how long the database stays down")
    p.add_argument("--out", type=Path, help="also write the JSON report here")


def run(args: argparse.Namespace) -> int:
    with (spawned(args) if args.spawn else nullcontext(Target(args.url, args.token))) as target:
        report = asyncio.run(run_all(target, args))
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if report["ok"] else 1
