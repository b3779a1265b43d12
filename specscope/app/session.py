"""How the UI reaches its backend, plus small caches of loaded runs and vocabularies (shared by all sessions)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable, Client
from specscope.app.modebook import ModeBook
from specscope.app.trace import Piece, RunTrace, make_piece
from specscope.backend.engine.cost_curve import CostCurve


class Backend:
    """A fixed backend URL, or (when None) the server that served the page, as seen in each request."""

    def __init__(self, url: str | None = None, token: str | None = None, max_runs: int = 32) -> None:
        self.url = url
        self.token = token
        self.max_runs = max_runs
        self._runs: OrderedDict[tuple[str, str], RunTrace] = OrderedDict()
        self._vocabs: dict[tuple[str, str], list[str]] = {}  # (backend, model) -> display text of token ids
        self._modes: dict[str, ModeBook] = {}  # backend -> its modes' declarations
        self._curves: dict[str, dict[str, CostCurve]] = {}  # backend -> its stored benches' cost curves
        self._ratings: OrderedDict[tuple[str, str, str | None], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.switching: str | None = None  # the model a switch made through this UI is loading, if one is

    def client(self, request: gr.Request | None = None) -> Client:
        if self.url is None and request is not None:
            scheme = "wss" if request.url.scheme == "https" else "ws"
            return Client(f"{scheme}://{request.headers['host']}", self.token)
        return Client(self.url or "ws://127.0.0.1:7860", self.token)

    def trace(self, client: Client, run_id: str) -> RunTrace:
        """A stored run (events + KV intervals), fetched once; finished runs do not change."""
        key = (client.http_url, run_id)
        with self._lock:
            if key in self._runs:
                self._runs.move_to_end(key)
                return self._runs[key]
        trace = client.trace(run_id)
        if trace.status != "running":
            with self._lock:
                self._runs[key] = trace
                while len(self._runs) > self.max_runs:
                    self._runs.popitem(last=False)
        return trace

    def rating(self, client: Client, trace: RunTrace) -> dict[str, Any] | None:
        """The served model's rating of an ended run's answer (GET /api/runs/{id}/fit), fetched once; None for a
        run still recording or one the served model cannot rate (a run of other weights or matmuls, no KV room, no
        backend)."""
        key = (client.http_url, trace.run_id, trace.model_hash)
        if trace.status == "running":
            return None
        with self._lock:
            if key in self._ratings:
                return self._ratings[key]
        try:
            rated = client.fit(trace.run_id)
        except (BackendError, BackendUnavailable):
            return None
        with self._lock:
            self._ratings[key] = rated
            while len(self._ratings) > self.max_runs:
                self._ratings.popitem(last=False)
        return rated

    def forget(self, client: Client, run_id: str) -> None:
        with self._lock:
            self._runs.pop((client.http_url, run_id), None)

    def piece(self, client: Client, trace: RunTrace) -> Piece:
        """Token display for a run: its own recorded pieces, then the vocabulary of the run's model, kept once the
        backend has served that model (it can be switched; a run of a model not served has its own pieces only)."""
        key = (client.http_url, trace.model)
        if key not in self._vocabs:
            found = client.vocab()
            if found is not None:
                self._vocabs[(client.http_url, found[0])] = found[1]
        return make_piece(self._vocabs.get(key), trace.known_pieces)

    def stored_curves(self, client: Client) -> dict[str, CostCurve]:
        """The cost curves of the stored benchmarks (GET /api/bench: the machine each ran on), by machine, fetched
        once a backend (a live follow rebuilds its document every step; a backend that did not answer is asked
        again); the visualizer projects a run's speedup on them."""
        if client.http_url in self._curves:
            return self._curves[client.http_url]
        try:
            stored = client.bench().get("modes") or {}
        except (BackendError, BackendUnavailable):
            return {}
        self._curves[client.http_url] = bench_curves(stored)
        return self._curves[client.http_url]

    def modes(self, client: Client, fresh: bool = False) -> ModeBook:
        """The backend's modes as its registry declares them (/api/modes: colours, claims, the baseline, what a
        round means), fetched once a backend (`fresh`: again, e.g. after a model switch changed which it can run); a
        backend that does not answer gives no declarations (BackendError / BackendUnavailable with `fresh`)."""
        if fresh or client.http_url not in self._modes:
            try:
                self._modes[client.http_url] = ModeBook.of(client.modes())
            except (BackendError, BackendUnavailable):
                if fresh:
                    raise
                return ModeBook()
        return self._modes[client.http_url]

    def remember_modes(self, client: Client, specs: list[dict[str, Any]]) -> ModeBook:
        """Keep what the backend just answered at /api/modes as its modes' declarations."""
        self._modes[client.http_url] = ModeBook.of(specs)
        return self._modes[client.http_url]


def session_of(request: gr.Request) -> str:
    return request.session_hash or ""


class StopFlags:
    """The sessions that asked a tab to stop what it runs for them (a chat answer, a race, a comparison)."""

    def __init__(self) -> None:
        self._sessions: set[str] = set()

    def request(self, request: gr.Request) -> None:
        self._sessions.add(session_of(request))

    def clear(self, request: gr.Request) -> None:
        self._sessions.discard(session_of(request))

    def checker(self, request: gr.Request) -> Callable[[], bool]:
        """A test of whether the session asked to stop (a `stop` for Client.generate)."""
        session = session_of(request)
        return lambda: session in self._sessions


def bench_curves(stored: dict[str, Any]) -> dict[str, CostCurve]:
    """A stored bench's cost curve, named by its machine (none where it has no readable curve)."""
    meta, rows = stored.get("meta") or {}, stored.get("verify_rows")
    try:
        curve = CostCurve.from_json(rows) if rows else None
    except ValueError:
        curve = None
    if curve is None:
        return {}
    return {f"{meta.get('cpu', '?')} · {meta.get('matmul', 'float32')} matmuls (stored bench at "
            f"{meta.get('commit', '?')})": curve}
