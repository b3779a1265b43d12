"""StoreWriter: trace events go into the store on a thread of their own, so the engine never waits on the database."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from specscope.backend.store.errors import StoreUnavailable
from specscope.backend.store.store import Store

log = logging.getLogger(__name__)
Event = dict[str, Any]
OUTAGE_RETRY_S = (0.1, 2.0)   # first and longest wait between tries while the database does not answer
CLOSE_GRACE_S = 10.0          # at close, how long a database that does not answer is waited for
SETTLE_TIMEOUT_S = 30.0       # how long a read waits for the events taken before it to be stored


class StoreWriter:
    """Queues events (bounded: `put` blocks once the database is `max_queued` events behind) and writes them in
    batches: the thread takes everything queued, records it, and commits, at most once per `interval_s`; a batch's
    rounds go in one insert (a wave), one row a round with its KV operations folded in.

    Latency bound: an event is in the database at most `interval_s` plus one batch write after it was put, so a
    process killed at time t has stored every event emitted before about t - interval_s - one write.

    A database that stops answering (stopped, restarting) is waited out: the writer keeps what it was given, tries
    again with backoff, and stores it all, in order, once the database answers (`outage_s` says how long it has
    not; past `max_queued` events, `put` makes the engine wait). A run whose storing fails otherwise (a value the
    database cannot hold) is logged once and left unrecorded from then on; the run itself goes on.
    """

    def __init__(self, store: Store, max_queued: int = 20_000, interval_s: float = 0.05):
        self.store = store
        self.max_queued = max_queued
        self.interval_s = interval_s
        self.failed: set[str] = set()  # runs no longer recorded
        self.unreachable_since: float | None = None  # monotonic time the database stopped answering, while it does not
        self._closing = False
        # put() appends to a deque (no lock, no wake-up per event: the engine thread only pays for an append);
        # the thread is woken when the deque turns non-empty, and paced to one batch per interval_s.
        self._pending: deque[Event | threading.Event | None] = deque()
        self._ready = threading.Event()  # something is pending
        self._wake = threading.Event()   # a flush or close cuts the pause between batches short
        self._writing = False   # the thread holds a batch it has not finished writing
        self._thread = threading.Thread(target=self._loop, name="specscope-store-writer", daemon=True)

    def start(self) -> StoreWriter:
        self._thread.start()
        return self

    def put(self, event: Event) -> None:
        """Hand one event over (a RecordingTracer sink); cheap unless the database is far behind."""
        while len(self._pending) >= self.max_queued and self._thread.is_alive():
            time.sleep(0.001)
        self._enqueue(event)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything put so far is written; False after `timeout` or when the writer has closed. Returns at
        once when nothing is queued or being written (reads call this before every run they serve)."""
        if not self._pending and not self._writing:   # the thread sets _writing before it takes a batch
            return self._thread.is_alive()
        done, deadline = threading.Event(), None if timeout is None else time.monotonic() + timeout
        self._enqueue(done)
        self._wake.set()
        while not done.wait(0.1):
            if not self._thread.is_alive() or (deadline is not None and time.monotonic() > deadline):
                return False
        return True

    @property
    def outage_s(self) -> float | None:
        """For how long the database has not answered (None while it does)."""
        since = self.unreachable_since
        return None if since is None else time.monotonic() - since

    def settle(self, timeout: float = SETTLE_TIMEOUT_S) -> None:
        """Return once everything put so far is stored; StoreUnavailable at once while the database does not answer,
        or when it is not stored within `timeout`."""
        if self.unreachable_since is not None:
            raise StoreUnavailable("the run store does not answer: runs are kept and stored when it is back")
        if not self.flush(timeout):
            raise StoreUnavailable("the run store is behind: try again")

    def close(self) -> None:
        """Write what is queued, then end the thread (the store stays open); a database that does not answer is
        waited for at most CLOSE_GRACE_S, then what is left is dropped (logged)."""
        self._closing = True
        if self._thread.is_alive():
            self._enqueue(None)
            self._wake.set()
            self._thread.join()

    def __enter__(self) -> StoreWriter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _enqueue(self, item: Event | threading.Event | None) -> None:
        self._pending.append(item)
        if len(self._pending) == 1:
            self._ready.set()

    def _loop(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            started = time.monotonic()
            self._writing = True
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            waiters = [item for item in batch if isinstance(item, threading.Event)]
            self._write([item for item in batch if isinstance(item, dict)])
            self._writing = False
            for waiter in waiters:
                waiter.set()
            if None in batch:
                return
            self._wake.wait(max(0.0, started + self.interval_s - time.monotonic()))
            self._wake.clear()

    def _write(self, events: list[Event]) -> None:
        """Record a batch as one wave (Store.wave): its rounds, whatever the runs, in one insert."""
        with self.store.wave():
            for event in events:
                if event["run_id"] in self.failed:
                    continue
                try:
                    self._record(event)
                except Exception:
                    self._fail(self.store.abandon({event["run_id"]}))
        try:
            self._until_answered(self.store.flush)
        except Exception:
            self._fail(self.store.abandon())

    def _record(self, event: Event) -> None:
        """Record one event, waiting out a database that does not answer. A failed write leaves the store as it was,
        except that a round or kv event it took stays buffered: then only the write is tried again."""
        try:
            self.store.record(event)
        except StoreUnavailable:
            taken = event["type"] not in ("run_start", "run_end")
            self._until_answered(self.store.flush if taken else lambda: self.store.record(event))

    def _until_answered(self, step: Callable[[], object]) -> None:
        """Run `step`; while the database does not answer, wait (backoff up to OUTAGE_RETRY_S[1]) and run it again.
        When closing, give up after CLOSE_GRACE_S of outage (StoreUnavailable)."""
        wait = OUTAGE_RETRY_S[0]
        while True:
            try:
                step()
                break
            except StoreUnavailable as exc:
                if self.unreachable_since is None:
                    self.unreachable_since = time.monotonic()
                    log.warning("%s; holding the events and trying again", exc)
                if self._closing and (self.outage_s or 0.0) > CLOSE_GRACE_S:
                    raise
                time.sleep(wait)
                wait = min(wait * 2, OUTAGE_RETRY_S[1])
        if self.unreachable_since is not None:
            log.warning("the run store answers again after %.1f s; the held events are stored", self.outage_s)
            self.unreachable_since = None

    def _fail(self, run_ids: set[str]) -> None:
        log.exception("storing run(s) %s failed; they go on unrecorded", sorted(run_ids))
        self.failed |= run_ids
