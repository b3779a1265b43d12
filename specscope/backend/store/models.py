"""SQLAlchemy models: runs and their events (the source of truth), derived rounds and KV intervals, comparisons."""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RUN_STATES = ("running", "done", "cancelled", "error", "interrupted")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; everything stored is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def run_fk() -> ForeignKey:
    return ForeignKey("runs.run_id", ondelete="CASCADE")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (CheckConstraint(f"status IN {RUN_STATES!r}", name="status"),)

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    mode: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str | None] = mapped_column(String(256))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    prompt: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)
    output: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    n_rounds: Mapped[int] = mapped_column(Integer, default=0)
    n_tokens: Mapped[int] = mapped_column(Integer, default=0)
    server: Mapped[str | None] = mapped_column(String(256), index=True)   # host:port of the server that ran it
    model_hash: Mapped[str | None] = mapped_column(String(128))          # run_start's model_hash, when given
    instance: Mapped[str | None] = mapped_column(String(64), index=True)  # the server instance (its lease) that ran it
    sweep: Mapped[str | None] = mapped_column(String(128), index=True)    # the sweep that made it (run_start)
    cell: Mapped[dict[str, Any] | None] = mapped_column(JSON)            # its cell of the sweep's grid
    engine: Mapped[str | None] = mapped_column(String(32), index=True)    # the engine that ran it (run_start)
    first_forward: Mapped[int | None] = mapped_column(Integer)           # the span of that engine's forwards it
    last_forward: Mapped[int | None] = mapped_column(Integer)            # took part in (its rounds' phases)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "created_at": utc(self.created_at).isoformat(), "mode": self.mode,
                "model": self.model, "params": self.params, "prompt": self.prompt, "status": self.status,
                "output": self.output, "metrics": self.metrics, "n_rounds": self.n_rounds,
                "n_tokens": self.n_tokens, "server": self.server, "model_hash": self.model_hash,
                "sweep": self.sweep, "cell": self.cell}


class Lease(Base):
    """A live server instance: it renews `renewed_at` every few seconds; one whose lease is older than the
    timeout is gone, and any live server marks its running runs interrupted."""
    __tablename__ = "leases"

    instance: Mapped[str] = mapped_column(String(64), primary_key=True)
    server: Mapped[str | None] = mapped_column(String(256))   # host:port, for display
    renewed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Event(Base):
    """One trace event; `payload` is the event less run_id, seq, t_ms and type."""
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_id_type", "run_id", "type"),
                      Index("ix_events_run_id_round", "run_id", "round"))

    run_id: Mapped[str] = mapped_column(String(64), run_fk(), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    t_ms: Mapped[float] = mapped_column(Float)
    type: Mapped[str] = mapped_column(String(16))
    round: Mapped[int | None] = mapped_column(Integer)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class Round(Base):
    """A round event, indexed for step-through; `payload` is the full event."""
    __tablename__ = "rounds"

    run_id: Mapped[str] = mapped_column(String(64), run_fk(), primary_key=True)
    round: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer)
    block_start: Mapped[int] = mapped_column(Integer)
    accepted_len: Mapped[int] = mapped_column(Integer)
    nfe: Mapped[int] = mapped_column(Integer)
    case: Mapped[str | None] = mapped_column(String(8))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class KVInterval(Base):
    """One occupancy of a KV slot: opened by an alloc event, closed by a free (open if leaked)."""
    __tablename__ = "kv_intervals"

    run_id: Mapped[str] = mapped_column(String(64), run_fk(), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    alloc_seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    position: Mapped[int | None] = mapped_column(Integer)
    alloc_round: Mapped[int] = mapped_column(Integer)
    free_seq: Mapped[int | None] = mapped_column(Integer)
    free_round: Mapped[int | None] = mapped_column(Integer)
    end_reason: Mapped[str | None] = mapped_column(String(32))

    def as_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "position": self.position, "alloc_seq": self.alloc_seq,
                "alloc_round": self.alloc_round, "free_seq": self.free_seq, "free_round": self.free_round,
                "end_reason": self.end_reason}


class Comparison(Base):
    """A named group of runs on one prompt."""
    __tablename__ = "comparisons"

    comparison_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    label: Mapped[str] = mapped_column(String(256))
    prompt: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class ComparisonRun(Base):
    """Membership of a run in a comparison, in order."""
    __tablename__ = "comparison_runs"

    comparison_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("comparisons.comparison_id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    run_id: Mapped[str] = mapped_column(String(64), run_fk(), index=True)
