"""A sweep's engines on Ray: each worker is an actor that builds one engine and runs batches of cells on it."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.util import ActorPool

from specscope.backend.engine.engine import Engine
from specscope.lab.sweep import BATCH, Cell, Event, Sweep, chunks, run_cells


@ray.remote
class SweepWorker:
    def __init__(self, build: Callable[[], Engine], threads: int):
        import torch
        torch.set_num_threads(max(1, threads))
        self.engine = build()

    def run(self, sweep_id: str, cells: Sequence[Cell], prompts: Sequence[str],
            max_new_tokens: int) -> tuple[int, list[list[Event]]]:
        """This worker's process id (which engine ran them), and each cell's run events."""
        return os.getpid(), run_cells(self.engine, sweep_id, cells, prompts, max_new_tokens)


def start_workers(build: Callable[[], Engine], address: str | None, workers: int, cpus: float = 1.0) -> list[Any]:
    """`workers` engines on the cluster at `address` (started on this machine for None or "local")."""
    if not ray.is_initialized():
        ray.init(address=None if address in (None, "local") else address, include_dashboard=False,
                 log_to_driver=False)
    return [SweepWorker.options(num_cpus=cpus).remote(build, int(cpus))   # type: ignore[attr-defined]
            for _ in range(workers)]


def run_on_ray(sweep: Sweep, build: Callable[[], Engine], todo: Sequence[Cell], keep: Callable[[list[Event]], None],
               address: str | None, workers: int, cpus: float = 1.0) -> dict[int, int]:
    """The cells over `workers` Ray actors, each holding one engine and reserving `cpus` of the cluster's; results
    stored as each batch ends. Returns how many cells each worker (by process id) ran."""
    pool = ActorPool(start_workers(build, address, workers, cpus))
    ran: dict[int, int] = {}
    for pid, results in pool.map_unordered(
            lambda actor, group: actor.run.remote(sweep.name, group, sweep.prompts, sweep.max_new_tokens),
            chunks(todo, BATCH)):
        ran[pid] = ran.get(pid, 0) + len(results)
        for events in results:
            keep(events)
    return ran
