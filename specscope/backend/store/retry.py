"""Bounded exponential backoff for a write that finds the database locked by another writer, and what tells a
database that does not answer (stopped, restarting, unreachable) from one that refused a value."""
from __future__ import annotations

from collections.abc import Callable
from time import sleep
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

T = TypeVar("T")
LOCKED = ("database is locked", "database table is locked")


def is_locked(exc: OperationalError) -> bool:
    return any(text in str(exc.orig).lower() for text in LOCKED)


def is_unreachable(exc: BaseException) -> bool:
    """The database did not answer: its connection was lost or could not be made (not a lock, not a bad value)."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    return isinstance(exc, (OperationalError, InterfaceError)) and not is_locked(exc)  # type: ignore[arg-type]


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
