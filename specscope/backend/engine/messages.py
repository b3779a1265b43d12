"""Conversations as requests carry them: a list of chat messages, checked before any template sees them."""
from __future__ import annotations

from typing import Any

from specscope.backend.engine.params import ParamError

ROLES = ("system", "user", "assistant")
Message = dict[str, str]
Prompt = str | list[Message]
"""A raw or one-line prompt, or a conversation."""


def check_messages(prompt: Any) -> list[Message]:
    """A conversation as a clean list of {"role", "content"}; ParamError names what is wrong. A string is one
    user message. The conversation must end with a user message (the model answers it)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise ParamError("messages must be a non-empty list of {role, content} objects")
    clean: list[Message] = []
    for i, m in enumerate(prompt):
        if not isinstance(m, dict) or set(m) - {"role", "content", "name"}:
            raise ParamError(f"messages[{i}] must be an object with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ParamError(f"messages[{i}].role must be one of {list(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ParamError(f"messages[{i}].content must be a string")
        clean.append({"role": role, "content": content})
    if clean[-1]["role"] != "user":
        raise ParamError("the last message must be from the user")
    if not any(m["content"].strip() for m in clean if m["role"] == "user"):
        raise ParamError("prompt is empty")
    return clean


def last_user(messages: list[Message]) -> str:
    """The conversation's last user message (what a run lists as its prompt)."""
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")
