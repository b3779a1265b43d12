"""The OpenAI-compatible API under /v1: chat and text completions (whole, or streamed as server-sent events) and
the model list. Every request becomes a traced, stored run like a /ws/generate one; its id comes back in the
`x-specscope-run-id` header and the answer's `specscope` field, whose `metrics` (a stream's in its final chunk) are
the run's run_end metrics with its mode: vLLM's per-request draft counts (`num_drafts`, `num_draft_tokens`,
`num_accepted_tokens`, `num_accepted_tokens_per_pos`), `tpf`, `nfe` and the acceptance `alarm` among them.

The decoding mode comes from a model id with a `:mode` suffix (`smollm2-135m:isd`) or from the extension field
`"specscope": {"mode": "isd", "params": {...}}`; without either, a request runs `ar`. Errors have OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}`.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from specscope.backend.engine.messages import Prompt
from specscope.backend.engine.modes import baseline, describe_modes
from specscope.backend.engine.params import ParamError, PromptTooLong
from specscope.backend.server.generate import LoopHandoff
from specscope.backend.server.prometheus import Watch
from specscope.backend.server.protocol import MAX_NEW_TOKENS, MAX_PROMPT_CHARS
from specscope.backend.server.service import EngineService
from specscope.backend.server.worker import Busy
from specscope.backend.store import StoreWriter, Tee

RUN_HEADER = "x-specscope-run-id"
DEFAULT_MAX_TOKENS = 256
MAX_BODY_BYTES = 256 * 1024
Event = dict[str, Any]


class OpenAIError(Exception):
    """An error answered in OpenAI's shape with its HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.code, self.param = status, kind, code, param

    def response(self) -> JSONResponse:
        return error_response(self.status, str(self), self.kind, self.code, self.param)


def error_response(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                   param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


# -- requests ----------------------------------------------------------------------------------------------------

class SpecscopeOptions(BaseModel):
    """The extension field: the decoding mode and its own parameters (as /api/modes lists them)."""
    model_config = ConfigDict(extra="forbid")
    mode: str | None = Field(None, min_length=1, max_length=64)
    params: dict[str, Any] = Field(default_factory=dict)


class StreamOptions(BaseModel):
    include_usage: bool = False


NEUTRAL = {"n": 1, "top_p": 1, "frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "top_logprobs": 0,
           "echo": False, "best_of": 1, "logit_bias": {}, "suffix": ""}
"""Fields a client may send at these values (or null); any other value is refused, never silently ignored."""


class Sampling(BaseModel):
    """What both completion endpoints take."""
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=200)
    max_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(None, ge=0, le=10, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    stop: list[str] = Field(default_factory=list, max_length=4)
    stream: bool = False
    stream_options: StreamOptions | None = None
    specscope: SpecscopeOptions = Field(default_factory=lambda: SpecscopeOptions(mode=None))
    user: str | None = Field(None, max_length=256)
    n: Any = None
    top_p: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None

    @field_validator("stop", mode="before")
    @classmethod
    def stop_strings(cls, stop: Any) -> Any:
        stops = [stop] if isinstance(stop, str) else ([] if stop is None else stop)
        if isinstance(stops, list) and not all(isinstance(s, str) and 0 < len(s) <= 64 for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings of at most 64 characters")
        return stops

    @field_validator(*NEUTRAL, check_fields=False)
    @classmethod
    def neutral(cls, given: Any, info: ValidationInfo) -> Any:
        value = NEUTRAL[cast(str, info.field_name)]
        if given is not None and given != value:
            raise PydanticCustomError("unsupported", "{given} is not supported (only {value}): a run draws one "
                                      "answer by its mode's temperature and seed",
                                      {"given": repr(given), "value": repr(value)})
        return given


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]
    name: str | None = None

    def text(self) -> str:
        """The content as text: a list of parts must be text parts."""
        if isinstance(self.content, str):
            return self.content
        if not all(p.get("type") == "text" and isinstance(p.get("text"), str) for p in self.content):
            raise OpenAIError(400, "only text content parts are supported", param="messages")
        return "".join(p["text"] for p in self.content)


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=256)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)

    def prompt(self) -> Prompt:
        said = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]
        if sum(len(m["content"]) for m in said) > MAX_PROMPT_CHARS:
            raise OpenAIError(413, f"the conversation is over {MAX_PROMPT_CHARS} characters", param="messages",
                              code="too_large")
        return said


class CompletionRequest(Sampling):
    prompt: str | list[str] = Field(min_length=1)
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    def text(self) -> str:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if len(prompts) != 1:
            raise OpenAIError(400, "send one prompt per request", param="prompt")
        if len(prompts[0]) > MAX_PROMPT_CHARS:
            raise OpenAIError(413, f"the prompt is over {MAX_PROMPT_CHARS} characters", param="prompt",
                              code="too_large")
        return prompts[0]


# -- runs --------------------------------------------------------------------------------------------------------

class StopMatcher:
    """Cuts streamed text at the first stop string; holds back a tail that could still begin one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def feed(self, delta: str) -> str:
        """The text that may go out now."""
        self.text += delta
        hits = [i for i in (self.text.find(s, max(self.sent - self.hold, 0)) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.text = True, self.text[:min(hits)]
            return self.flush()
        safe = max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:safe], safe
        return out

    def flush(self) -> str:
        out, self.sent = self.text[self.sent:], len(self.text)
        return out


@dataclass
class LiveRun:
    """A run admitted by the engine: its events arrive on `events` (run_end or error last)."""
    run_id: str
    mode: str
    params: dict[str, Any]
    cancel: Callable[[], None]
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    prompt_tokens: int = 0
    end: Event = field(default_factory=dict)   # the run_end event, once it came

    async def deltas(self, stop: StopMatcher) -> AsyncIterator[str]:
        """The answer's text as it is decided, cut at a stop string (the run is then cancelled); ends at run_end."""
        while True:
            event = await self.events.get()
            kind = event["type"]
            if kind == "run_start":
                self.prompt_tokens = len(event.get("prompt_ids", []))
            elif kind == "round" and not stop.stopped:
                out = stop.feed(event.get("text_delta") or "")
                if stop.stopped:
                    self.cancel()
                if out:
                    yield out
            elif kind == "error":
                raise OpenAIError(500, event.get("message", "the run failed"), "server_error",
                                  event.get("code") or "run_failed")    # `interrupted`: its engine replica died
            elif kind == "run_end":
                self.end = event
                if not stop.stopped and (tail := stop.flush()):
                    yield tail
                return

    def finish_reason(self, stop: StopMatcher) -> str:
        tokens = len(self.end.get("output_ids", []))
        return "stop" if stop.stopped or tokens < self.params["max_new_tokens"] else "length"

    def usage(self) -> dict[str, int]:
        tokens = len(self.end.get("output_ids", []))
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": tokens,
                "total_tokens": self.prompt_tokens + tokens}

    def extension(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "mode": self.mode, "params": self.params,
                "status": self.end.get("status"), "metrics": {"mode": self.mode, **self.end.get("metrics", {})}}


def mode_and_model(model: str, options: SpecscopeOptions, served: str) -> tuple[str, str]:
    """(mode, the model id to answer with) from `model[:mode]` and the extension; 404 for a model not served."""
    name, _, suffix = model.partition(":")
    if name not in (served, served.split("+")[0]):
        raise OpenAIError(404, f"the model {model!r} is not served here; GET /v1/models lists what is",
                          code="model_not_found", param="model")
    if suffix and options.mode and suffix != options.mode:
        raise OpenAIError(400, f"the model id asks for mode {suffix!r} and specscope.mode for {options.mode!r}",
                          param="specscope.mode")
    return suffix or options.mode or baseline(), name


async def start(service: EngineService, writer: StoreWriter, prompt: Prompt, mode: str,
                params: dict[str, Any], watch: Watch) -> LiveRun:
    """Submit a run whose events are stored, watched and queued for this request; OpenAIError when it is refused."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    tracer = Tee(writer, watch(), LoopHandoff(asyncio.get_running_loop(), queue.put_nowait)).tracer()
    try:
        run = service.submit(prompt, mode, params, tracer)
        await asyncio.wrap_future(run.admitted)
    except PromptTooLong as e:
        raise OpenAIError(413, str(e), code="context_length_exceeded") from None
    except ParamError as e:
        raise OpenAIError(400, str(e), code="bad_params") from None
    except Busy as e:
        raise OpenAIError(429, str(e), "rate_limit_error", "busy") from None
    except RuntimeError as e:   # the engine process is gone
        raise OpenAIError(503, str(e), "server_error", "engine_unavailable") from None
    return LiveRun(tracer.run_id, mode, params, run.cancel, queue)


def run_params(body: Sampling, max_tokens: int | None, raw: bool) -> dict[str, Any]:
    params = dict(body.specscope.params)
    params["max_new_tokens"] = max_tokens or params.get("max_new_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(params["max_new_tokens"], int) or params["max_new_tokens"] > MAX_NEW_TOKENS:
        raise OpenAIError(400, f"max_new_tokens must be an integer of at most {MAX_NEW_TOKENS}",
                          param="specscope.params.max_new_tokens")
    if raw:
        params["raw"] = True
    for name in ("temperature", "seed"):
        if getattr(body, name) is not None:
            params[name] = getattr(body, name)
    return params


# -- answers -----------------------------------------------------------------------------------------------------

@dataclass
class Shape:
    """How one endpoint words its answers: chat messages or completion text."""
    object: str
    chunk_object: str
    id_prefix: str

    def choice(self, text: str, finish: str | None, chunk: bool, first: bool = False) -> dict[str, Any]:
        if self.object == "text_completion":
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if not chunk:
            return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": 0, "delta": delta, "finish_reason": finish}


CHAT = Shape("chat.completion", "chat.completion.chunk", "chatcmpl-")
TEXT = Shape("text_completion", "text_completion", "cmpl-")


def sse(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


async def answer(live: LiveRun, shape: Shape, model: str, body: Sampling) -> JSONResponse | StreamingResponse:
    created = int(time.time())
    head = {"id": shape.id_prefix + live.run_id, "created": created, "model": model}
    stop = StopMatcher(body.stop)
    headers = {RUN_HEADER: live.run_id}
    if not body.stream:
        try:
            text = "".join([d async for d in live.deltas(stop)])
        finally:
            live.cancel()   # a no-op once the run ended; ends it if the client went away
        return JSONResponse({**head, "object": shape.object, "choices": [shape.choice(text, live.finish_reason(stop),
                                                                                         False)],
                             "usage": live.usage(), "specscope": live.extension()}, headers=headers)

    async def chunks() -> AsyncIterator[bytes]:
        chunk = {**head, "object": shape.chunk_object}
        try:
            yield sse({**chunk, "choices": [shape.choice("", None, True, first=True)]})
            async for delta in live.deltas(stop):
                yield sse({**chunk, "choices": [shape.choice(delta, None, True)]})
            yield sse({**chunk, "choices": [shape.choice("", live.finish_reason(stop), True)],
                       "specscope": live.extension()})
            if body.stream_options and body.stream_options.include_usage:
                yield sse({**chunk, "choices": [], "usage": live.usage()})
            yield sse("[DONE]")
        except OpenAIError as e:
            yield sse({"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.code}})
        finally:
            live.cancel()   # a client that leaves mid-stream leaves nothing running

    return StreamingResponse(chunks(), media_type="text/event-stream", headers=headers)


# -- routes ------------------------------------------------------------------------------------------------------

def openai_router(service: EngineService, writer: StoreWriter, watch: Watch) -> APIRouter:
    router = APIRouter(prefix="/v1")

    def listed() -> list[dict[str, Any]]:
        """The served model, once plain and once per mode it can run (`name:mode`)."""
        model = service.model
        base = model.name.split("+")[0]
        modes = [m["name"] for m in describe_modes(mask_token=model.mask_token) if m["available"]]
        return [{"id": i, "object": "model", "created": 0, "owned_by": "specscope"}
                for i in [base, *(f"{base}:{m}" for m in modes)]]

    @router.get("/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": listed()}

    @router.get("/models/{model_id}")
    def model(model_id: str) -> dict[str, Any]:
        """One id of /v1/models; 404 in OpenAI's shape for any other."""
        found = next((entry for entry in listed() if entry["id"] == model_id), None)
        if found is None:
            raise OpenAIError(404, f"the model {model_id!r} is not served here; GET /v1/models lists what is",
                              code="model_not_found", param="model")
        return found

    @router.post("/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        mode, model = mode_and_model(body.model, body.specscope, service.model.name)
        live = await start(service, writer, body.prompt(), mode,
                           run_params(body, body.max_completion_tokens or body.max_tokens, raw=False), watch)
        return await answer(live, CHAT, model, body)

    @router.post("/completions", response_model=None)
    async def completions(body: CompletionRequest) -> JSONResponse | StreamingResponse:
        mode, model = mode_and_model(body.model, body.specscope, service.model.name)
        live = await start(service, writer, body.text(), mode, run_params(body, body.max_tokens, raw=True), watch)
        return await answer(live, TEXT, model, body)

    return router


class BodyLimit:
    """A 413 in OpenAI's shape for a /v1 request whose declared body is over MAX_BODY_BYTES (ASGI middleware)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            size = Headers(scope=scope).get("content-length", "")
            if size.isdigit() and int(size) > MAX_BODY_BYTES:
                response = error_response(413, f"the request body is {size} bytes; the limit is {MAX_BODY_BYTES}",
                                          code="too_large")
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


def is_v1(request: Request) -> bool:
    return request.url.path.startswith("/v1/")
