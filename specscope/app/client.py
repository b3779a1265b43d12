"""A small client for a specscope backend: REST under /api and the /ws/generate websocket.

Given `ws://host:port` or `http://host:port` (optionally with a path prefix), it reaches the same server over both
protocols, so the UI can drive a local backend or a remote GPU one. Any connection failure is raised as
`BackendUnavailable`; a refusal by the backend (HTTP error, `error` event) as `BackendError`.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import WebSocketException

from specscope.app.trace import RunTrace

FINAL_EVENTS = ("run_end", "error")


class BackendUnavailable(ConnectionError):
    """The backend cannot be reached (down, wrong address, connection dropped)."""


class BackendError(RuntimeError):
    """The backend answered with an error (`status`: its HTTP status, when it came over HTTP)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def base_urls(backend: str) -> tuple[str, str]:
    """(http base, ws base) of a backend given as ws://, wss://, http:// or https:// host[:port][/prefix]."""
    parts = urlsplit(backend if "://" in backend else f"ws://{backend}")
    secure = parts.scheme in ("wss", "https")
    if parts.scheme not in ("ws", "wss", "http", "https") or not parts.netloc:
        raise ValueError(f"backend must look like ws://host:port, got {backend!r}")
    path = parts.path.rstrip("/")
    return (urlunsplit(("https" if secure else "http", parts.netloc, path, "", "")),
            urlunsplit(("wss" if secure else "ws", parts.netloc, path, "", "")))


class Client:
    def __init__(self, backend: str, token: str | None = None, timeout: float = 10.0) -> None:
        self.backend = backend
        self.http_url, self.ws_url = base_urls(backend)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout

    # -- REST ---------------------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, timeout: float | None = None, **kwargs: Any) -> httpx.Response:
        try:
            response = httpx.request(method, self.http_url + path, headers=self.headers,
                                     timeout=timeout or self.timeout, **kwargs)
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"backend unavailable at {self.http_url} ({type(exc).__name__})") from exc
        if response.status_code >= 400:
            raise BackendError(f"{method} {path}: HTTP {response.status_code} {detail(response)}", response.status_code)
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None}).json()

    def forwards(self, since: int = 0, limit: int = 1000, replica: int = 0) -> list[dict[str, Any]]:
        """The engine's (or engine replica's) latest forwards after id `since` (GET /api/forwards)."""
        return self.get("/api/forwards", since=since, limit=limit, replica=replica)["forwards"]

    def run_forwards(self, run_id: str) -> dict[str, Any]:
        """A stored run's forwards, with every stored run that took part (GET /api/runs/{id}/forwards)."""
        return self.get(f"/api/runs/{quote(run_id, safe='')}/forwards")

    def health(self, timeout: float = 2.0) -> dict[str, Any]:
        return self.request("GET", "/api/health", timeout=timeout).json()

    def modes(self) -> list[dict[str, Any]]:
        return self.get("/api/modes")

    def models(self) -> dict[str, Any]:
        """The served model (`current`, `weights_hash`, `family`) and the models directory's catalog (`models`)."""
        return self.get("/api/models")

    def switch_model(self, name: str, timeout: float = 600.0) -> dict[str, Any]:
        """Serve another folder of the models directory (running runs are cancelled); /api/models' new answer."""
        return self.request("POST", f"/api/models/{quote(name, safe='')}", timeout=timeout).json()

    def model_card(self) -> dict[str, Any]:
        """The served model's card: {model, card: {summary, families: [{name, what, examples}], out_of_domain}}."""
        return self.get("/api/model_card")

    def bench(self) -> dict[str, Any]:
        return self.get("/api/bench")

    def bench_here(self, mode: str, timeout: float = 300.0) -> dict[str, Any]:
        """A short benchmark of ar and `mode` on the served model, run now on the server's machine."""
        return self.request("POST", "/api/bench/here", json={"mode": mode}, timeout=timeout).json()

    def runs(self, mode: str | None = None, status: str | None = None, limit: int = 100,
             offset: int = 0) -> list[dict[str, Any]]:
        return self.get("/api/runs", mode=mode, status=status, limit=limit, offset=offset)

    def run(self, run_id: str) -> dict[str, Any]:
        return self.get(f"/api/runs/{run_id}")

    def rounds(self, run_id: str, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        return self.get(f"/api/runs/{run_id}/rounds", start=start, stop=stop)

    def kv(self, run_id: str) -> list[dict[str, Any]]:
        return self.get(f"/api/runs/{run_id}/kv")

    def fit(self, run_id: str, timeout: float = 130.0) -> dict[str, Any]:
        """The served model's rating of the run's answer: greedy, tokens, greedy_share, nll_mean, picks, nll."""
        return self.request("GET", f"/api/runs/{run_id}/fit", timeout=timeout).json()

    def diverge(self, a: str, b: str, k: int | None = None, timeout: float = 130.0) -> dict[str, Any]:
        """Why stored runs a and b of one prompt differ (GET /api/diverge): the first differing output position
        (None when identical), each side's token, top-k logits and margin there, `cause` in words, `near_tie`,
        `attribution` and `lossless_claim`."""
        params = {"a": a, "b": b, **({} if k is None else {"k": k})}
        return self.request("GET", "/api/diverge", timeout=timeout, params=params).json()

    def export(self, run_id: str, fmt: str = "json") -> bytes:
        return self.request("GET", f"/api/runs/{run_id}/export", params={"format": fmt}).content

    def delete_run(self, run_id: str) -> None:
        self.request("DELETE", f"/api/runs/{run_id}")

    def comparisons(self) -> list[dict[str, Any]]:
        return self.get("/api/comparisons")

    def comparison(self, comparison_id: str) -> dict[str, Any]:
        return self.get(f"/api/comparisons/{comparison_id}")

    def create_comparison(self, label: str, prompt: str, run_ids: list[str]) -> dict[str, Any]:
        body = {"label": label, "prompt": prompt, "run_ids": run_ids}
        return self.request("POST", "/api/comparisons", json=body).json()

    def vocab(self) -> tuple[str, list[str]] | None:
        """(model, display text of every token id) from `GET /api/vocab`, or None if the backend has no vocab."""
        try:
            body = self.get("/api/vocab")
        except BackendError:
            return None
        return str(body.get("model", "")), [str(p) for p in body.get("pieces") or []]

    def trace(self, run_id: str) -> RunTrace:
        """A stored run with all its events and KV intervals."""
        document = json.loads(self.export(run_id, "json"))
        return RunTrace.from_events(document["events"], self.kv(run_id))

    # -- websocket ----------------------------------------------------------------------------------------------------

    async def generate(self, prompt: str | list[dict[str, str]], mode: str, params: dict[str, Any] | None = None,
                       stop: Callable[[], bool] | None = None) -> AsyncIterator[dict]:
        """The trace events of one run, as the backend streams them, ending with run_end or error. `prompt` is a
        string or a conversation (a list of {role, content}, ending with the user's message).

        Once `stop()` is true the run is cancelled (a `cancel` message) and the stream still ends with its
        `run_end` (status cancelled). Closing the iterator early closes the socket, which also cancels the run.
        """
        message = {"type": "generate", "prompt" if isinstance(prompt, str) else "messages": prompt, "mode": mode,
                   "params": params or {}}
        cancelled = False
        try:
            async with connect(self.ws_url + "/ws/generate?frames=batch", additional_headers=self.headers,
                               open_timeout=self.timeout, max_size=None) as ws:
                await ws.send(json.dumps(message))
                async for raw in ws:
                    for event in json.loads(raw):   # batched frames: the events ready at once, in order
                        yield event
                        if event.get("type") in FINAL_EVENTS:
                            return
                    if stop is not None and not cancelled and stop():
                        cancelled = True
                        await ws.send(json.dumps({"type": "cancel"}))
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise BackendUnavailable(f"backend unavailable at {self.ws_url} ({type(exc).__name__}: {exc})") from exc
        raise BackendUnavailable(f"backend at {self.ws_url} closed the stream before run_end")

    async def replay(self, run_id: str, since_seq: int = 0) -> AsyncIterator[dict]:
        """A stored run's events from `since_seq` on, as fast as possible, until the backend closes the stream
        (after run_end; for a run still recording, when it has sent what is stored or, with live follow, at its
        end)."""
        url = f"{self.ws_url}/ws/replay/{quote(run_id)}?speed=0&since_seq={int(since_seq)}"
        try:
            async with connect(url, additional_headers=self.headers, open_timeout=self.timeout, max_size=None) as ws:
                async for raw in ws:
                    yield json.loads(raw)
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise BackendUnavailable(f"backend unavailable at {self.ws_url} ({type(exc).__name__}: {exc})") from exc


def detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return str(body.get("detail", body)) if isinstance(body, dict) else str(body)[:200]
