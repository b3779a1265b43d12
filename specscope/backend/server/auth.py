"""Access control: loopback-only binds without a token, and one token guarding every route when set."""
from __future__ import annotations

import ipaddress
import secrets

from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

WS_UNAUTHORIZED = 4401
COOKIE = "specscope_token"


class BindError(ValueError):
    """A bind that would expose the server without a token."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback host unless a token protects the server."""
    if not token and not is_loopback(host):
        raise BindError(f"refusing to listen on {host!r} without a token: anyone who can reach it could run the "
                        f"model and read every stored run. Pass --token (or set SPECSCOPE_TOKEN), or bind 127.0.0.1.")


def given_token(conn: HTTPConnection) -> str:
    """The `Authorization: Bearer` header, else `?token=`, else the cookie a `?token=` visit set."""
    scheme, _, value = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    return conn.query_params.get("token") or conn.cookies.get(COOKIE, "")


class TokenMiddleware:
    """Every HTTP request and websocket (REST, UI, /ws) needs the token: 401, or a websocket closed with 4401.

    A browser opens the UI once with `?token=...`; the answer sets an HttpOnly cookie that carries it from then on.
    """

    def __init__(self, app: ASGIApp, token: str):
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        conn = HTTPConnection(scope)
        if not secrets.compare_digest(given_token(conn).encode(), self.token):
            return await self.refuse(scope, receive, send)
        if scope["type"] == "http" and "token" in conn.query_params:
            send = self.setting_cookie(send)
        await self.app(scope, receive, send)

    @staticmethod
    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            body: dict = {"detail": "missing or wrong token"}
            if scope["path"].startswith("/v1/"):   # OpenAI's error shape
                body = {"error": {"message": "missing or wrong token (the server's --token, as the API key)",
                                  "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
            response = JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})
            return await response(scope, receive, send)
        ws = WebSocket(scope, receive, send)
        await ws.accept()
        await ws.close(WS_UNAUTHORIZED, "missing or wrong token")

    def setting_cookie(self, send: Send) -> Send:
        cookie = f"{COOKIE}={self.token.decode()}; HttpOnly; SameSite=Strict; Path=/"

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append("set-cookie", cookie)
            await send(message)
        return send_with_cookie
