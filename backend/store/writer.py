"""StoreWriter: trace events go into the store on a thread of their own, so the engine never waits on the database."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from backend.store.store import Store

log = logging.getLogger(__name__)
Event = dict[str, Any]


class StoreWriter:
    """Queues events (bounded: `put` blocks once the database is `max_queued` events behind) and writes them in
    batches: the thread takes everything queued, records it, and commits, at most once per `interval_s`.

    Latency bound: an event is in the database at most `interval_s` plus one batch write after it was put, so a
    process killed at time t has stored every event emitted before about t - interval_s - one write. A run whose
    storing fails (database gone, a value it cannot hold) is logged once and left unrecorded from then on; the run
    itself goes on.
    """

    def __init__(self, store: Store, max_queued: int = 20_000, interval_s: float = 0.05):
        self.store = store
        self.max_queued = max_queued
        self.interval_s = interval_s
        self.failed: set[str] = set()  # runs no longer recorded
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

    def close(self) -> None:
        """Write what is queued, then end the thread (the store stays open)."""
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
        for event in events:
            if event["run_id"] in self.failed:
                continue
            try:
                self.store.record(event)
            except Exception:
                self._fail(self.store.abandon({event["run_id"]}))
        try:
            self.store.flush()
        except Exception:
            self._fail(self.store.abandon())

    def _fail(self, run_ids: set[str]) -> None:
        log.exception("storing run(s) %s failed; they go on unrecorded", sorted(run_ids))
        self.failed |= run_ids
