"""Engine creation: strict JSON, and for SQLite the WAL / foreign-key / busy-timeout pragmas on every connection."""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from specscope.backend.tracing import STRICT_JSON

DEFAULT_URL = "sqlite:///sessions/specscope.db"


class EncodedJSON(str):
    """A JSON column's value already encoded as strict JSON (an event's payload: encoding it is its check)."""


def json_column(value: Any) -> str:
    """The JSON columns' serializer: strict JSON (no NaN or Infinity), an EncodedJSON as it is."""
    return value if isinstance(value, EncodedJSON) else STRICT_JSON.encode(value)


def set_sqlite_pragmas(dbapi_conn: Any, _record: Any, busy_timeout_ms: int) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    cursor.close()


def make_engine(url: str = DEFAULT_URL, busy_timeout_ms: int = 5000) -> Engine:
    """An engine for any SQLAlchemy URL; JSON columns refuse NaN and Infinity."""
    sa_url = make_url(url)
    kwargs: dict[str, Any] = {"json_serializer": json_column}
    sqlite, database = sa_url.get_backend_name() == "sqlite", sa_url.database or ""
    if sqlite and database in ("", ":memory:"):
        kwargs |= {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
    elif sqlite:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    if not sqlite:  # a pooled connection is checked before use: after a database restart it is replaced, not failed
        kwargs["pool_pre_ping"] = True
    engine = create_engine(sa_url, **kwargs)
    if sqlite:
        event.listen(engine, "connect", partial(set_sqlite_pragmas, busy_timeout_ms=busy_timeout_ms))
    return engine
