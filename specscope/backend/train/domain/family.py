"""A task family: draws values with their canonical answer, and the wording patterns that ask for them."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Instance:
    key: str                 # the canonical values: decides the value split
    variant: str             # which wording patterns fit these values (e.g. "asc" or "desc")
    slots: dict[str, str]    # the values as the prompt shows them
    answer: str


@dataclass(frozen=True)
class TaskFamily:
    name: str
    summary: str             # one line for the model card
    draw: Callable[[random.Random], Instance]
    patterns: dict[str, tuple[str, ...]]   # variant -> wording patterns with `[a|b]` alternations


def items_text(items: list[str], rng: random.Random) -> str:
    """A list as a prompt shows it: space-, comma- or comma-space-separated."""
    return rng.choice((" ", ", ", ", ", ",")).join(items)
