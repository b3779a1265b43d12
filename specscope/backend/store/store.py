"""Store: runs and their trace events in any SQLAlchemy database. Writes are batched; reads return plain dicts."""
from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, Table, delete, insert, or_, select, update
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from specscope.backend.store.db import DEFAULT_URL, make_engine
from specscope.backend.store.derive import kv_interval_rows, round_rows, run_summary
from specscope.backend.store.errors import RunExistsError, StoreError, StoreUnavailable, TraceError, UnknownRunError
from specscope.backend.store.events import check_envelope, check_record, check_seq, check_stream, from_row, to_row
from specscope.backend.store.forwards import shared_forwards
from specscope.backend.store.migrate import upgrade
from specscope.backend.store.models import Base, Comparison, ComparisonRun, Event, KVInterval, Lease, Round, Run, utc
from specscope.backend.store.retry import is_unreachable, retry_locked
from specscope.backend.tracing import RUN_STATUSES

T = TypeVar("T")
Row = dict[str, Any]


def no_nul(row: Row) -> Row:
    """Text columns without NUL characters (PostgreSQL text cannot hold them; the events keep them, escaped)."""
    return {k: v.replace("\x00", "\ufffd") if isinstance(v, str) else v for k, v in row.items()}


def unavailable(exc: DBAPIError) -> StoreUnavailable:
    """The error for a database that does not answer, with the first line of the driver's reason."""
    reason = str(exc.orig).strip().splitlines() or [type(exc.orig).__name__]
    return StoreUnavailable(f"the run store does not answer ({reason[0]})")


LEASE_TIMEOUT_S = 15.0   # a server whose lease is older than this is gone: any live server marks its runs interrupted


def insert_rows(session: Session, model: type[Base], rows: Sequence[Row]) -> None:
    """One executemany on the model's table (Core: the ORM's bulk insert costs far more Python per row)."""
    if rows:
        session.execute(insert(cast(Table, model.__table__)), list(rows))


class Store:
    """Opens (creating or upgrading) a database and records runs into it.

    A live run is `begin_run`, `add_events`..., `end_run`; events are buffered and written `batch_size` at a time
    (or, in a `wave`, all at the flush after it), each write one transaction and one multi-row insert, retried
    while another writer holds the database. `record` does the routing when the store is a RecordingTracer's sink.
    A round is one row: the KV operations folded into it ride in its payload (tracing.py), and the seq rule counts
    them.
    """

    def __init__(self, url: str = DEFAULT_URL, *, batch_size: int = 64, busy_timeout_ms: int = 5000,
                 server: str | None = None, instance: str | None = None) -> None:
        self.engine = make_engine(url, busy_timeout_ms)
        retry_locked(lambda: upgrade(self.engine))
        self.batch_size = batch_size
        self.server = server  # host:port stamped on every run this store begins (None outside a server)
        self.instance = instance or (uuid.uuid4().hex[:16] if server else None)  # this server's lease, on its runs
        self._sessions = sessionmaker(self.engine)
        self._buffer: list[Row] = []
        self._recorded: dict[str, list[Row]] = {}  # runs being recorded -> their events so far: the next seq
        #                                            expected, and what end_run derives from (no read-back)
        self._lock = threading.RLock()
        self._waves = 0  # waves open (`wave`): the buffer waits for a flush, not batch_size at a time

    def close(self) -> None:
        self.flush()
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- recording a live run ------------------------------------------------------------------------------------

    def record(self, event: Row) -> None:
        """Store one event as it is emitted (a RecordingTracer sink)."""
        if event.get("type") == "run_start":
            self.begin_run(event)
        elif event.get("type") == "run_end":
            self.end_run(event)
        else:
            self.add_events([event])

    def begin_run(self, event: Row) -> str:
        """Create the run (status running) from its run_start event, stored at once; returns the run id."""
        check_envelope(event)
        if event["type"] != "run_start":
            raise TraceError(f"begin_run takes a run_start event, not {event['type']}")
        run_id = event["run_id"]
        check_seq(run_id, 0, event["seq"])
        model_hash = event.get("model_hash")
        tagged = event.get("sweep")
        sweep: dict[str, Any] = tagged if isinstance(tagged, dict) else {}
        run = {"run_id": run_id, "created_at": datetime.now(UTC), "mode": event.get("mode") or "",
               "model": event.get("model"), "params": event.get("params") or {}, "prompt": event.get("prompt") or "",
               "status": "running", "output": None, "metrics": None, "n_rounds": 0, "n_tokens": 0,
               "server": self.server, "model_hash": model_hash if isinstance(model_hash, str) else None,
               "instance": self.instance, "sweep": sweep.get("id"), "cell": sweep.get("cell"),
               "engine": engine[:32] if isinstance(engine := event.get("engine"), str) else None}
        rows = [to_row(event)]
        with self._lock:
            if run_id in self._recorded:
                raise RunExistsError(f"run {run_id} is already being recorded")
            self._write(lambda s: self._insert_run(s, run, rows))
            self._recorded[run_id] = [event]
        return run_id

    def add_events(self, events: Iterable[Row]) -> None:
        """Buffer round, kv and error events of runs being recorded; a seq gap or duplicate raises."""
        with self._lock:
            for event in events:
                self._accept(event, ("round", "kv", "error"))
            if len(self._buffer) >= self.batch_size and not self._waves:
                self.flush()

    @contextmanager
    def wave(self) -> Iterator[None]:
        """Events recorded inside are buffered however many they are, for one `flush` after it to write together:
        one insert for a wave's records of every run (a run_start or run_end inside writes what is buffered with
        it). The store writer's batches are waves."""
        self._waves += 1
        try:
            yield
        finally:
            self._waves -= 1

    def flush(self) -> None:
        """Write the buffered events now, in one transaction."""
        with self._lock:
            if self._buffer:
                self._write(self._insert_buffer)
                self._buffer.clear()

    def end_run(self, event: Row) -> None:
        """Store run_end, then derive rounds, KV intervals, status and metrics, all in one transaction."""
        check_envelope(event)
        if event["type"] == "run_end" and event.get("status") not in RUN_STATUSES:
            raise TraceError(f"run_end status {event.get('status')!r} is not one of {RUN_STATUSES}")
        run_id = event["run_id"]

        def finish(session: Session) -> None:
            self._insert_buffer(session)
            self._derive(session, run_id, self._recorded[run_id])

        with self._lock:
            self._accept(event, ("run_end",))
            try:
                self._write(finish)
            except BaseException:
                self._buffer.pop()
                self._recorded[run_id].pop()
                raise
            self._buffer.clear()
            del self._recorded[run_id]

    def abandon(self, run_ids: Iterable[str] | None = None) -> set[str]:
        """Stop recording runs whose storing failed (default: every run with unwritten events). Their unwritten
        events are dropped, what is stored stays, and the next startup marks them interrupted. Returns the ids."""
        with self._lock:
            ids = {e["run_id"] for e in self._buffer} if run_ids is None else set(run_ids)
            self._buffer = [e for e in self._buffer if e["run_id"] not in ids]
            for run_id in ids:
                self._recorded.pop(run_id, None)
            return ids

    def mark_interrupted(self, lease_timeout_s: float | None = None) -> list[str]:
        """Mark runs whose server is gone as interrupted; returns their ids. Stored events are kept and rounds and
        KV intervals derived, so the runs can still be inspected. Runs this store is recording are never marked.

        At startup (no timeout): this server's own earlier runs (same host:port: its predecessor died, since this
        one holds the port) and runs made outside any server. With `lease_timeout_s`: runs of every other instance
        whose lease is missing or older than that, so a dead server's runs end on a shared database even when it
        never comes back, and live servers never mark each other's.
        """
        def mark(session: Session) -> list[str]:
            if lease_timeout_s is None:
                gone = Run.server.is_(None) if self.server is None else or_(Run.server.is_(None),
                                                                             Run.server == self.server)
            else:
                cutoff = datetime.now(UTC) - timedelta(seconds=lease_timeout_s)
                alive = select(Lease.instance).where(Lease.renewed_at >= cutoff)
                gone = Run.instance.is_not(None) & Run.instance.not_in(alive)
            if self.instance is not None:
                gone = gone & or_(Run.instance.is_(None), Run.instance != self.instance)
            query = select(Run.run_id).where(Run.status == "running", gone, Run.run_id.not_in(live))
            marked = []
            for run_id in session.scalars(query).all():   # claimed first: two servers marking at once mark once
                claim = update(Run).where(Run.run_id == run_id, Run.status == "running").values(status="interrupted")
                if cast(CursorResult, session.execute(claim)).rowcount:
                    self._derive(session, run_id, self._load_events(session, run_id))
                    marked.append(run_id)
            return marked

        with self._lock:
            live = list(self._recorded)
            return self._write(mark)

    def renew_lease(self) -> None:
        """Say this server instance is alive (now)."""
        assert self.instance is not None, "a lease belongs to a server's store (Store(server=...))"
        instance, now = self.instance, datetime.now(UTC)

        def renew(session: Session) -> None:
            found = session.get(Lease, instance)
            if found is None:
                session.add(Lease(instance=instance, server=self.server, renewed_at=now))
            else:
                found.renewed_at = now
        self._write(renew)

    def drop_lease(self) -> None:
        """A clean shutdown: this instance holds no lease any more (its runs have ended)."""
        if self.instance is not None:
            instance = self.instance
            self._write(lambda session: session.execute(delete(Lease).where(Lease.instance == instance)))

    def insert_run(self, run: Row, events: Sequence[Row]) -> None:
        """Store a complete run as exported (run fields kept as given) and derive its rounds and KV intervals."""
        run_id = run["run_id"]
        check_stream(run_id, events)
        row = run | {"created_at": datetime.fromisoformat(run["created_at"])}
        rows = [to_row(e) for e in events]

        def write(session: Session) -> None:
            self._insert_run(session, row, rows)
            insert_rows(session, Round, round_rows(run_id, events))
            insert_rows(session, KVInterval, kv_interval_rows(run_id, events))

        with self._lock:
            if run_id in self._recorded:
                raise RunExistsError(f"run {run_id} is being recorded")
            self._write(write)

    # -- reading -------------------------------------------------------------------------------------------------

    def ping(self) -> None:
        """Ask the database for nothing: StoreUnavailable when it does not answer."""
        self._read(lambda session: session.execute(select(1)), None)

    def list_runs(self, mode: str | None = None, status: str | None = None, limit: int = 50,
                  offset: int = 0, sweep: str | None = None) -> list[Row]:
        """Runs, newest first, without their events."""
        query = select(Run).order_by(Run.created_at.desc(), Run.run_id).limit(limit).offset(offset)
        if mode is not None:
            query = query.where(Run.mode == mode)
        if sweep is not None:
            query = query.where(Run.sweep == sweep)
        if status is not None:
            query = query.where(Run.status == status)
        return self._read(lambda session: [run.as_dict() for run in session.scalars(query)], [])

    def get_run(self, run_id: str) -> Row | None:
        def read(session: Session) -> Row | None:
            run = session.get(Run, run_id)
            return run.as_dict() if run else None
        return self._read(read, None)

    def events(self, run_id: str, since_seq: int = 0, limit: int | None = None) -> list[Row]:
        """The stored events of a run from `since_seq` on (at most `limit`), exactly as emitted, in seq order."""
        return self._read(lambda session: self._load_events(session, run_id, since_seq, limit), [])

    def events_of_type(self, run_id: str, *types: str) -> list[Row]:
        """The run's stored events of these types, in seq order (found through the index on run and type)."""
        query = (select(Event.seq, Event.t_ms, Event.type, Event.payload)
                 .where(Event.run_id == run_id, Event.type.in_(types)).order_by(Event.seq))
        return self._read(lambda session: [from_row(run_id, *row) for row in session.execute(query)], [])

    def rounds(self, run_id: str, start: int = 0, stop: int | None = None) -> list[Row]:
        """The round events with start <= round < stop, in round order."""
        query = select(Round.payload).where(Round.run_id == run_id, Round.round >= start).order_by(Round.round)
        if stop is not None:
            query = query.where(Round.round < stop)
        return self._read(lambda session: list(session.scalars(query)), [])

    def shared_forwards(self, run_id: str) -> Row | None:
        """Its engine's forwards over a stored run's span, with every stored run that took part (`forwards.py`)."""
        return self._read(lambda session: shared_forwards(session, run_id), None)

    def kv_intervals(self, run_id: str) -> list[Row]:
        """KV slot occupancy intervals, by slot then allocation order."""
        query = (select(KVInterval).where(KVInterval.run_id == run_id)
                 .order_by(KVInterval.slot, KVInterval.alloc_seq))
        return self._read(lambda session: [interval.as_dict() for interval in session.scalars(query)], [])

    def delete_run(self, run_id: str) -> bool:
        """Delete a run with its events, derived rows and comparison memberships; False if there was none."""
        def remove(session: Session) -> bool:
            return cast(CursorResult[Any], session.execute(delete(Run).where(Run.run_id == run_id))).rowcount > 0

        with self._lock:
            if run_id in self._recorded:
                raise StoreError(f"run {run_id} is being recorded; end it before deleting it")
            return self.get_run(run_id) is not None and self._write(remove)

    # -- comparisons ---------------------------------------------------------------------------------------------

    def create_comparison(self, label: str, prompt: str, run_ids: Sequence[str]) -> str:
        """Group stored runs of one prompt, in the given order; returns the comparison id."""
        if not run_ids or len(set(run_ids)) != len(run_ids):
            raise ValueError("a comparison needs one or more distinct runs")
        comparison_id = "c_" + uuid.uuid4().hex[:16]
        row = no_nul({"comparison_id": comparison_id, "label": label, "prompt": prompt,
                      "created_at": datetime.now(UTC)})

        def write(session: Session) -> None:
            prompts = dict(session.execute(select(Run.run_id, Run.prompt).where(Run.run_id.in_(run_ids))).all())
            missing = [r for r in run_ids if r not in prompts]
            if missing:
                raise UnknownRunError(f"no such runs: {missing}")
            others = [r for r in run_ids if prompts[r] != row["prompt"]]
            if others:
                raise ValueError(f"runs {others} are not on the comparison's prompt")
            insert_rows(session, Comparison, [row])
            insert_rows(session, ComparisonRun, [{"comparison_id": comparison_id, "position": i, "run_id": r}
                                                 for i, r in enumerate(run_ids)])

        self._write(write)
        return comparison_id

    def get_comparison(self, comparison_id: str) -> Row | None:
        def read(session: Session) -> Row | None:
            comparison = session.get(Comparison, comparison_id)
            return self._comparison_dict(session, comparison) if comparison else None
        return self._read(read, None)

    def list_comparisons(self) -> list[Row]:
        """Comparisons, newest first."""
        query = select(Comparison).order_by(Comparison.created_at.desc(), Comparison.comparison_id)
        return self._read(lambda session: [self._comparison_dict(session, c) for c in session.scalars(query)], [])

    # -- internals -----------------------------------------------------------------------------------------------

    def _write(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` in one transaction, retried while the database is locked; a value the database cannot hold
        (a string over its column's length or with a NUL byte on PostgreSQL, an integer out of range) is a
        TraceError, a database that does not answer StoreUnavailable (the transaction left nothing behind)."""
        def attempt() -> T:
            with self._sessions.begin() as session:
                return fn(session)
        try:
            return retry_locked(attempt)
        except DataError as exc:
            raise TraceError(f"a value does not fit the database: {exc.orig}") from exc
        except DBAPIError as exc:
            if is_unreachable(exc):
                raise unavailable(exc) from exc
            raise

    def _read(self, fn: Callable[[Session], T], default: T) -> T:
        """Run a read; a key the database cannot even hold (a NUL byte on PostgreSQL) matches nothing, a database
        that does not answer is StoreUnavailable."""
        try:
            with self._sessions() as session:
                return fn(session)
        except DataError:
            return default
        except DBAPIError as exc:
            if is_unreachable(exc):
                raise unavailable(exc) from exc
            raise

    def _accept(self, event: Row, types: tuple[str, ...]) -> None:
        check_envelope(event)
        if event["type"] not in types:
            raise TraceError(f"a {event['type']} event does not go here (expected {' or '.join(types)})")
        run_id = event["run_id"]
        if run_id not in self._recorded:
            raise UnknownRunError(f"run {run_id} is not being recorded (begin_run first)")
        check_record(run_id, self._recorded[run_id][-1]["seq"] + 1, event)
        self._buffer.append(to_row(event))
        self._recorded[run_id].append(event)

    def _insert_buffer(self, session: Session) -> None:
        insert_rows(session, Event, self._buffer)

    @staticmethod
    def _insert_run(session: Session, run: Row, rows: Sequence[Row]) -> None:
        """The run and its first event rows."""
        try:
            insert_rows(session, Run, [no_nul(run)])
        except IntegrityError as exc:
            raise RunExistsError(f"run {run['run_id']} already exists") from exc
        insert_rows(session, Event, rows)

    @staticmethod
    def _derive(session: Session, run_id: str, events: Sequence[Row]) -> None:
        for model in (Round, KVInterval):
            session.execute(delete(model).where(model.run_id == run_id))
        insert_rows(session, Round, round_rows(run_id, events))
        insert_rows(session, KVInterval, kv_interval_rows(run_id, events))
        session.execute(update(Run).where(Run.run_id == run_id).values(**no_nul(run_summary(events))))

    @staticmethod
    def _load_events(session: Session, run_id: str, since_seq: int = 0, limit: int | None = None) -> list[Row]:
        query = (select(Event.seq, Event.t_ms, Event.type, Event.payload)
                 .where(Event.run_id == run_id, Event.seq >= since_seq).order_by(Event.seq).limit(limit))
        return [from_row(run_id, *row) for row in session.execute(query)]

    @staticmethod
    def _comparison_dict(session: Session, comparison: Comparison) -> Row:
        query = (select(ComparisonRun.run_id).where(ComparisonRun.comparison_id == comparison.comparison_id)
                 .order_by(ComparisonRun.position))
        return {"comparison_id": comparison.comparison_id, "label": comparison.label, "prompt": comparison.prompt,
                "created_at": utc(comparison.created_at).isoformat(), "run_ids": list(session.scalars(query))}
