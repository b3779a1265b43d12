"""Tee: the one tracer sink of a live run. Each event goes to the store's writer thread, then to every listener."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specscope.backend.store.writer import StoreWriter
from specscope.backend.tracing import RecordingTracer

Event = dict[str, Any]


class Tee:
    """Called on the engine thread: queueing for the store is cheap, so listeners (a socket, a terminal) see each
    event as soon as it is made. `writer` None means the run is not stored."""

    def __init__(self, writer: StoreWriter | None, *listeners: Callable[[Event], None]):
        self.writer = writer
        self.listeners = listeners

    def __call__(self, event: Event) -> None:
        if self.writer is not None:
            self.writer.put(event)
        for listener in self.listeners:
            listener(event)

    def tracer(self, run_id: str | None = None) -> RecordingTracer:
        """A recording tracer whose events go through this tee (and are not kept a second time in the tracer)."""
        return RecordingTracer(run_id, sink=self, keep=False)
