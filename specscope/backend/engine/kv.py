"""The KV slot pool: a fixed number of slots shared by all layers, a free list, and one owner per slot."""
from __future__ import annotations

from collections import deque

import torch

from specscope.backend.model.config import ModelConfig
from specscope.backend.model.transformer import PagedKV


class OutOfSlots(RuntimeError):
    """The pool cannot hold what a request asked for; nothing was allocated."""


class KVError(RuntimeError):
    """A slot operation that would corrupt the pool (double free, foreign slot)."""


class KVPool:
    """Slot allocator over PagedKV memory. Slots are owned by one request id at a time."""

    def __init__(self, cfg: ModelConfig, num_slots: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        self.memory = PagedKV.empty(cfg, num_slots, dtype, device)
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._owner: dict[int, str] = {}
        self._held: dict[str, int] = {}
        self.peak_by_owner: dict[str, int] = {}
        self.peak = 0

    @property
    def used(self) -> int:
        return len(self._owner)

    @property
    def free_count(self) -> int:
        return len(self._free)

    def held(self, owner: str) -> int:
        """How many slots an owner holds (O(1))."""
        return self._held.get(owner, 0)

    def owned_by(self, owner: str) -> list[int]:
        return sorted(s for s, o in self._owner.items() if o == owner)

    def alloc(self, owner: str, n: int) -> list[int]:
        if n < 0:
            raise KVError(f"cannot allocate {n} slots")
        if n > len(self._free):
            raise OutOfSlots(f"KV pool exhausted: {owner} asked for {n} slots, {len(self._free)} of "
                             f"{self.num_slots} free")
        slots = [self._free.popleft() for _ in range(n)]
        for s in slots:
            self._owner[s] = owner
        held = self._held.get(owner, 0) + n
        self._held[owner] = held
        self.peak_by_owner[owner] = max(self.peak_by_owner.get(owner, 0), held)
        self.peak = max(self.peak, self.used)
        return slots

    def free(self, owner: str, slots: list[int]) -> None:
        if not slots:
            return
        if len(set(slots)) != len(slots):
            raise KVError(f"{owner} frees a slot twice in one call: {slots}")
        for s in slots:
            if self._owner.get(s) != owner:
                raise KVError(f"{owner} frees slot {s} owned by {self._owner.get(s)!r}")
        for s in slots:
            del self._owner[s]
            self._free.append(s)
        self._held[owner] -= len(slots)
        if self._held[owner] == 0:
            del self._held[owner]

    def forget(self, owner: str) -> int:
        """Drop a finished owner's bookkeeping; returns its peak slot count."""
        return self.peak_by_owner.pop(owner, 0)

    def check(self) -> None:
        """Pool invariants: every slot is either free or owned, never both, never twice."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise KVError("a slot is on the free list twice")
        if free & set(self._owner):
            raise KVError("a slot is both free and owned")
        if len(free) + len(self._owner) != self.num_slots:
            raise KVError("slots lost: free + owned != pool size")
