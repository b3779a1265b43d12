"""The websocket wire protocol: client messages and replay options (pydantic), limits, and error events."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from specscope.backend.engine.messages import Prompt
from specscope.backend.tracing import SCHEMA_VERSION

MAX_MESSAGE_BYTES = 64 * 1024
MAX_PROMPT_CHARS = 16_000
MAX_NEW_TOKENS = 1024
MAX_FORWARDS = 1000         # forward records one GET /api/forwards page holds at most
MAX_INDEX = 2**31 - 1       # the largest offset, round or seq a query may name (the store's integer columns hold it)
MAX_QUEUED_RUNS = 64       # runs queued or running on one server; past it a generate gets a `busy` error


class ProtocolError(Exception):
    """Bad client input; becomes an `error` event and leaves the connection usable."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code

    def event(self) -> dict[str, Any]:
        return error_event(self.code, str(self))


def error_event(code: str, message: str) -> dict[str, Any]:
    """An error that belongs to no run (so it has no run_id or seq)."""
    return {"v": SCHEMA_VERSION, "type": "error", "code": code, "message": message}


FRAMES = ("event", "batch")
"""/ws/generate?frames=: `event` (the default) sends one trace event per message, a round with its KV operations
folded in (one frame a round); `batch` sends every message as a JSON array of the events ready at that moment, in
order. An ar run makes one round a token, hundreds a second on the CPU: batched, the server and a client each handle
~50 messages a second instead (the UI's client asks for it)."""


def parse_frames(query: dict[str, str]) -> bool:
    """Whether a /ws/generate connection asked for batched frames; ProtocolError for an unknown value."""
    frames = query.get("frames", "event")
    if frames not in FRAMES:
        raise ProtocolError("bad_request", f"frames must be one of {', '.join(FRAMES)}, got {frames[:40]!r}")
    return frames == "batch"


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_PROMPT_CHARS)


class Generate(BaseModel):
    """{"type": "generate", "prompt": str | "messages": [{role, content}, ...], "mode": str, "params": {...}}:
    a prompt, or a conversation that the model's chat template renders; the engine checks params in detail."""
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["generate"]
    prompt: str | None = Field(None, min_length=1, max_length=MAX_PROMPT_CHARS)
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=256)
    mode: str = Field(min_length=1, max_length=64)
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def one_prompt(self) -> Generate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of prompt (a string) or messages (a conversation)")
        if self.messages is not None and self.messages[-1].role != "user":
            raise ValueError("messages: the last message must be from the user")
        return self

    @property
    def conversation(self) -> Prompt:
        """What the engine takes: the prompt string, or the messages as plain dicts."""
        if self.messages is None:
            return cast(str, self.prompt)
        return [m.model_dump() for m in self.messages]

    @field_validator("params")
    @classmethod
    def cap_max_new_tokens(cls, params: dict[str, Any]) -> dict[str, Any]:
        n = params.get("max_new_tokens")
        if isinstance(n, int | float) and not isinstance(n, bool) and n > MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens {n} is over this server's cap of {MAX_NEW_TOKENS}")
        return params


class Cancel(BaseModel):
    """{"type": "cancel"}: stop the run in progress (a no-op when there is none)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["cancel"]


ClientMessage = TypeAdapter(Annotated[Generate | Cancel, Field(discriminator="type")])
MESSAGE_TYPES = ("generate", "cancel")


class ReplayOptions(BaseModel):
    """Query of /ws/replay/{run_id}: speed scales recorded time (0 = as fast as possible)."""
    speed: float = Field(1.0, ge=0, allow_inf_nan=False)
    since_seq: int = Field(0, ge=0, le=MAX_INDEX)


def describe(error: ValidationError) -> str:
    """One line naming each bad field, e.g. `prompt: String should have at least 1 character`."""
    parts = []
    for e in error.errors():
        loc = [str(part) for part in e["loc"]]
        if loc and loc[0] in MESSAGE_TYPES:  # the union's tag, not a field
            loc = loc[1:]
        parts.append(f"{'.'.join(loc)}: {e['msg']}" if loc else e["msg"])
    return "; ".join(parts)


def parse_message(raw: str | bytes) -> Generate | Cancel:
    size = len(raw if isinstance(raw, bytes) else raw.encode())
    if size > MAX_MESSAGE_BYTES:
        raise ProtocolError("too_large", f"message is {size} bytes; the limit is {MAX_MESSAGE_BYTES}")
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ProtocolError("bad_json", f"message is not valid JSON ({e})") from None
    try:
        return ClientMessage.validate_python(data)
    except ValidationError as e:
        raise ProtocolError("bad_message", describe(e)) from None


def parse_replay_options(query: dict[str, str]) -> ReplayOptions:
    try:
        return ReplayOptions.model_validate({k: v for k, v in query.items() if k in ReplayOptions.model_fields})
    except ValidationError as e:
        raise ProtocolError("bad_query", describe(e)) from None
