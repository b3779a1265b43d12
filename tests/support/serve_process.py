"""`specscope serve` in a subprocess on a free loopback port, for tests that kill it or run several on one store."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

from support.live_server import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token"
MAIN = "import sys; from specscope.backend.cli import main; sys.exit(main(sys.argv[1:]))"
OPTIONS = ("--model", "tiny", "--no-ui", "--token", TOKEN, "--slots", "4096", "--cost-curve", "flat")
Event = dict[str, Any]


class Served:
    """One server process; its output (uvicorn's logs included) goes to `log`."""

    def __init__(self, db: str, log: Path, port: int | None = None, options: Sequence[str] = OPTIONS):
        self.port = port or free_port()
        self.log = log
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECSCOPE_TOKEN": ""}
        with log.open("a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", MAIN, "serve", "--port", str(self.port), "--db", db, *options], cwd=ROOT,
                env=env, stdout=out, stderr=subprocess.STDOUT)
        self.wait_ready()

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws(self, path: str) -> Any:
        """A websocket on this server, the token in the query string (as a browser's first visit has it)."""
        sep = "&" if "?" in path else "?"
        return connect(f"ws://127.0.0.1:{self.port}{path}{sep}token={TOKEN}", open_timeout=30)

    def get(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.http + path, params={**params, "token": TOKEN}, timeout=30)
        r.raise_for_status()
        return r.json()

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"server exited: {self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(self.http + "/api/health", params={"token": TOKEN}, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def kill(self) -> None:
        """kill -9: no shutdown, no flush."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def serving(db: str, log: Path, port: int | None = None, options: Sequence[str] = OPTIONS) -> Iterator[Served]:
    server = Served(db, log, port, options)
    try:
        yield server
    finally:
        server.stop()


def wait_status(server: Served, run_id: str, status: str, timeout: float) -> float:
    """Seconds until the server's REST shows the run with `status`; fails after `timeout`."""
    start = time.monotonic()
    while server.get(f"/api/runs/{run_id}")["status"] != status:
        assert time.monotonic() - start < timeout, f"{run_id} not {status} after {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - start


def receive(ws: Any, until: str = "run_end") -> list[Event]:
    """Events up to and including the first of type `until`."""
    events = [json.loads(ws.recv(timeout=120))]
    while events[-1]["type"] != until:
        events.append(json.loads(ws.recv(timeout=120)))
    return events


def generate(server: Served, prompt: str, mode: str = "ar", **params: Any) -> list[Event]:
    with server.ws("/ws/generate") as ws:
        ws.send(json.dumps({"type": "generate", "prompt": prompt, "mode": mode, "params": params}))
        return receive(ws)
