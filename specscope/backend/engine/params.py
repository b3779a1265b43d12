"""Declared, validated decoding parameters: common ones plus each mode's own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ParamError(ValueError):
    """A bad request parameter; the message names the parameter."""


class PromptTooLong(ParamError):
    """A prompt that does not fit the model's context."""


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    min: float | None = None
    max: float | None = None
    help: str = ""
    choices: tuple[str, ...] | None = None   # the allowed values of a str parameter

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type.__name__, "default": self.default,
                "min": self.min, "max": self.max, "help": self.help, "choices": self.choices}

    def coerce(self, value: Any) -> Any:
        if self.type is str:
            if value not in (self.choices or ()):
                raise ParamError(f"{self.name} must be one of {list(self.choices or ())}, got {value!r}")
            return value
        if self.type is bool:
            if not isinstance(value, bool):
                raise ParamError(f"{self.name} must be true or false, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError(f"{self.name} must be a number, got {value!r}")
        if self.type is int and float(value) != int(value):
            raise ParamError(f"{self.name} must be an integer, got {value!r}")
        value = self.type(value)
        if value != value or (self.min is not None and value < self.min) or (
                self.max is not None and value > self.max):
            raise ParamError(f"{self.name} must be in [{self.min}, {self.max}], got {value!r}")
        return value


COMMON_PARAMS = (
    Param("max_new_tokens", int, 64, 1, 4096, "stop after this many generated tokens"),
    Param("temperature", float, 0.0, 0.0, 10.0, "0 = greedy"),
    Param("seed", int, 0, 0, 2**31 - 1, "sampling seed (T > 0)"),
    Param("raw", bool, False, help="send the prompt as is, without the chat template"),
    Param("tiers", bool, True, help="follow the server's load tiers (shorter drafts, or none, while several runs "
                                    "are active); off: draft at this run's own parameters, as it would alone"),
    Param("trace_topk", int, 0, 0, 20, "record each position's k most likely tokens with entropy and top-1/top-2 "
                                       "margin, per forward, in the trace (0: off, and free)"),
)


def validate(specs: tuple[Param, ...], given: dict[str, Any] | None) -> dict[str, Any]:
    """Defaults filled in, types and ranges checked; unknown names are errors."""
    given = dict(given or {})
    by_name = {p.name: p for p in specs}
    unknown = sorted(set(given) - set(by_name))
    if unknown:
        raise ParamError(f"unknown parameter(s) {unknown}; expected some of {sorted(by_name)}")
    return {p.name: p.coerce(given[p.name]) if p.name in given else p.default for p in specs}
