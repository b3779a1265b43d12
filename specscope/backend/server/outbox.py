"""A client's bounded event queue: per-round snapshots give way under backpressure, durable events never do."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from specscope.backend.tracing import kv_events

Event = dict[str, Any]
LOSSY = frozenset({"round"})


class SlowClient(Exception):
    """The client fell so far behind that even its durable events no longer fit."""


class Outbox:
    """Used on the event loop only (events are handed over with call_soon_threadsafe).

    Past `maxsize` queued events, the oldest queued `round` makes room (a later round supersedes it; the client
    sees the gap in seq and can fetch the round from /api/runs/{id}/rounds); with no round queued, an incoming
    round is dropped. A dropped round's KV operations stay, as kv events of their own in its place (the form runs
    stored before the folding have): run_start, KV operations, run_end and error are always delivered; past
    `hard_limit` queued `get` raises SlowClient and the connection is closed.
    """

    def __init__(self, maxsize: int = 256, hard_limit: int = 8192):
        self.maxsize = maxsize
        self.hard_limit = hard_limit
        self.dropped = 0
        self._items: deque[Event] = deque()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, event: Event) -> None:
        if len(self._items) >= self.maxsize and not self._drop_oldest_round():
            if event["type"] in LOSSY:
                self.dropped += 1
                self._items.extend(kv_events(event))
                self._ready.set()
                return
        self._items.append(event)
        self._ready.set()

    async def get(self) -> Event:
        await self._wait()
        return self._items.popleft()

    async def get_all(self) -> list[Event]:
        """Every queued event (at least one), oldest first."""
        await self._wait()
        items = list(self._items)
        self._items.clear()
        return items

    async def _wait(self) -> None:
        """Until something is queued; SlowClient when the client is past the hard limit."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        if len(self._items) > self.hard_limit:
            raise SlowClient(f"client is {len(self._items)} events behind")

    def _drop_oldest_round(self) -> bool:
        """Drop the oldest queued round, its KV operations taking its place as kv events; whether there was one."""
        for i, queued in enumerate(self._items):
            if queued["type"] in LOSSY:
                del self._items[i]
                for op in reversed(kv_events(queued)):
                    self._items.insert(i, op)
                self.dropped += 1
                return True
        return False
