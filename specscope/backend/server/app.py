"""create_app: the FastAPI app around one engine service and one store, with a UI mounted when the caller passes one
(`specscope serve` passes app/ui.py's Gradio UI)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse

from specscope.backend.engine.engine import Engine
from specscope.backend.server.api import api_router
from specscope.backend.server.auth import TokenMiddleware
from specscope.backend.server.diverge import diverge_router
from specscope.backend.server.generate import GenerateSession
from specscope.backend.server.logs import redact_tokens
from specscope.backend.server.models import ModelHost, models_router
from specscope.backend.server.openai_api import BodyLimit, OpenAIError, error_response, is_v1, openai_router
from specscope.backend.server.prometheus import ServerMetrics
from specscope.backend.server.protocol import MAX_QUEUED_RUNS, ProtocolError, parse_frames
from specscope.backend.server.replay import replay
from specscope.backend.server.service import EngineService, LocalEngine
from specscope.backend.store import LEASE_TIMEOUT_S, Store, StoreUnavailable, StoreWriter
from specscope.backend.tracing import sanitize, to_json

NO_UI_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>specscope</title></head><body>
<h1>specscope backend</h1><p>The web UI is not installed or is turned off.
REST lives under <a href="/api/health">/api</a> (see <a href="/docs">/docs</a>), an OpenAI-compatible API under
<code>/v1</code> (chat/completions, completions, models),
websockets under <code>/ws/generate</code> and <code>/ws/replay/{run_id}</code>.</p>
</body></html>"""


UIMount = Callable[[FastAPI, str | None, str | None], FastAPI]
"""Mounts a UI at "/" on the app (app/ui.py:mount_ui), given the backend it drives and the token; the CLI passes it."""


async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422, with the echoed input made strict JSON (a body holding Infinity made the default one a 500);
    under /v1, OpenAI's 400 naming the bad fields."""
    assert isinstance(exc, RequestValidationError)
    if is_v1(request):
        errors = exc.errors()
        where = ".".join(str(p) for p in errors[0]["loc"][1:]) if errors else None
        message = "; ".join(": ".join(filter(None, (".".join(str(p) for p in e["loc"][1:]), e["msg"])))
                            for e in errors)
        return error_response(400, message or "invalid request", param=where or None)
    return JSONResponse({"detail": sanitize(jsonable_encoder(exc.errors()))}, status_code=422)


async def openai_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return exc.response()


async def store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 while the run store does not answer (the server goes on; runs are stored once it is back)."""
    if is_v1(request):
        return error_response(503, str(exc), "server_error", code="store_unavailable")
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "5"})


log = logging.getLogger(__name__)


async def keep_lease(store: Store, timeout_s: float) -> None:
    """Renew this server's lease a few times per timeout, and mark the runs of servers whose lease expired. A store
    that stops answering is retried at the next beat (the lease may lapse meanwhile, as it should)."""
    while True:
        await asyncio.sleep(timeout_s / 5)
        try:
            await asyncio.to_thread(store.renew_lease)
            marked = await asyncio.to_thread(store.mark_interrupted, timeout_s)
            if marked:
                log.warning("marked %d runs of expired servers interrupted: %s", len(marked), ", ".join(marked))
        except Exception:
            log.exception("could not renew the server lease")


def create_app(engine: Engine | EngineService, store: Store, token: str | None = None, ui: UIMount | None = None,
               backend_url: str | None = None, max_queued: int = MAX_QUEUED_RUNS,
               models_dir: str | Path | None = None, build: Callable[[str | Path], Engine] | None = None,
               lease_timeout_s: float = LEASE_TIMEOUT_S) -> FastAPI:
    """The server. An Engine is served from a worker thread of this process (`LocalEngine`, with `max_queued` and
    `build`); `specscope serve` passes an `EngineProcess` instead. The engine service and the store writer start
    and stop with the app's lifespan, and startup marks runs a crash of this server left 'running' as
    interrupted. A store made with a server identity (`Store(server=...)`) also holds a lease, renewed while the
    app runs: runs of servers whose lease is older than `lease_timeout_s` are marked interrupted. With a token,
    every route (REST, websockets, UI) needs it, and it is kept out of uvicorn's logs.
    `models_dir` lets /api/models switch the served model (the service loads the folder); without it
    /api/models lists only the served one."""
    service = LocalEngine(engine, build, max_queued) if isinstance(engine, Engine) else engine
    host = ModelHost(models_dir, service)
    writer = StoreWriter(store)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        redact_tokens()
        leasing = store.instance is not None
        if leasing:
            await asyncio.to_thread(store.renew_lease)
        await asyncio.to_thread(store.mark_interrupted)
        writer.start()
        await asyncio.to_thread(service.start)
        lease = asyncio.create_task(keep_lease(store, lease_timeout_s)) if leasing else None
        try:
            yield
        finally:
            await asyncio.to_thread(service.stop)
            await asyncio.to_thread(writer.close)
            if lease is not None:
                lease.cancel()
                await asyncio.to_thread(store.drop_lease)

    app = FastAPI(title="specscope", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(OpenAIError, openai_error)
    app.add_exception_handler(StoreUnavailable, store_unavailable)
    app.add_middleware(BodyLimit)
    if token:
        app.add_middleware(TokenMiddleware, token=token)
    app.include_router(api_router(store, service, writer))
    app.include_router(diverge_router(store, service, writer))
    app.include_router(models_router(host))
    metrics = ServerMetrics()
    app.include_router(openai_router(service, writer, metrics.watch))
    app.include_router(metrics.router())

    @app.websocket("/ws/generate")
    async def ws_generate(ws: WebSocket) -> None:
        await ws.accept()
        try:
            batch = parse_frames(dict(ws.query_params))
        except ProtocolError as e:
            await ws.send_text(to_json(e.event()))
            await ws.close()
            return
        await GenerateSession(ws, writer, service, metrics.watch, batch).serve()

    @app.websocket("/ws/replay/{run_id}")
    async def ws_replay(ws: WebSocket, run_id: str) -> None:
        await ws.accept()
        await replay(ws, store, run_id, writer.settle)

    if ui is not None:
        return ui(app, backend_url, token)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> str:
        return NO_UI_PAGE

    return app
