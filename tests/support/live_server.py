"""A real uvicorn server on a free loopback port, in a thread, for tests that need one."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app: FastAPI, port: int | None = None) -> Iterator[int]:
    """Serve `app` until the block ends; yields the port."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def ui_server(loaded, folder: Path) -> Iterator[dict]:
    """The UI and backend over one engine of `loaded`, its store in `folder`: the page's URL, the websocket's and the
    engine. The engine prices rows with FLAT, not this machine's measured curve: what cost-aware rounds draft (and
    so which rounds a test sees) is the same on every machine."""
    from specscope.app.ui import mount_ui
    from specscope.backend.engine.cost_curve import FLAT
    from specscope.backend.engine.engine import Engine
    from specscope.backend.server import create_app
    from specscope.backend.store import Store

    engine = Engine(loaded, num_slots=4096, cost_curve=FLAT)
    store = Store(f"sqlite:///{folder / 'runs.db'}")
    port = free_port()
    app = create_app(engine, store, backend_url=f"ws://127.0.0.1:{port}", ui=mount_ui)
    with serving(app, port):
        yield {"url": f"http://127.0.0.1:{port}/", "ws": f"ws://127.0.0.1:{port}/ws/generate", "engine": engine}
