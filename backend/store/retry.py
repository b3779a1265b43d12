"""Bounded exponential backoff for a write that finds the database locked by another writer."""
from __future__ import annotations

from collections.abc import Callable
from time import sleep
from typing import TypeVar

from sqlalchemy.exc import OperationalError

T = TypeVar("T")
LOCKED = ("database is locked", "database table is locked")


def is_locked(exc: OperationalError) -> bool:
    return any(text in str(exc.orig).lower() for text in LOCKED)


def retry_locked(fn: Callable[[], T], attempts: int = 8, delay_s: float = 0.05, max_delay_s: float = 1.0) -> T:
    """Run `fn` (one whole transaction), running it again after a lock error; the last error is raised."""
    for attempt in range(attempts):
        try:
            return fn()
        except OperationalError as exc:
            if not is_locked(exc) or attempt == attempts - 1:
                raise
            sleep(min(delay_s * 2 ** attempt, max_delay_s))
    raise AssertionError("unreachable")
