"""Engine replicas on Ray (`specscope serve --ray [ADDRESS] --replicas N`): each replica is one Ray actor holding one
batched engine, stepped on the actor's main thread as the engine process steps its own, and linked to the server by
the engine process's messages over a pair of Ray queues. The server stays one: it routes each run to the live
replica holding the fewest runs, relays every replica's events into the one store, and answers health for all.

A replica that dies mid-run ends its runs `interrupted` (an error event, then run_end), Ray restarts its actor
(`max_restarts`), and the link serves again once the new engine is built; meanwhile new runs go to the live
replicas, and a run no replica can take is refused as busy. Without `--ray` nothing here is imported."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import ray
from ray.util.queue import Empty, Queue

from specscope.backend.answer_fit import AnswerFit
from specscope.backend.engine.messages import Prompt
from specscope.backend.server.engine_process import Build, EngineProcess, Link, engine_main
from specscope.backend.server.service import Run, ServedModel
from specscope.backend.server.worker import Busy, end_lost_run
from specscope.backend.tracing import RecordingTracer

log = logging.getLogger(__name__)
POLL_S = 0.2
"""How often a waiting end of a link checks that the other end can still answer."""
MAX_RESTARTS = 8
"""How often Ray restarts a replica's actor after it died."""
QUEUE_OPTIONS = {"num_cpus": 0}
PLACED_KEPT = 1000
RELAUNCH_TRIES, RELAUNCH_WAIT_S = 120, 0.5
"""How long a dead replica's link waits for Ray's restart of it: a minute."""
"""A link's queues take no CPU of the cluster's: the replicas' engines hold them."""


class QueueLink:
    """One end of a replica's link: the engine process's Connection calls over two Ray queues, one each way.
    `alive` (the server's end) says whether the replica still serves; `recv` raises EOFError once it does not,
    or once the queues are gone (their owner, the server, died)."""

    def __init__(self, inbox: Queue, outbox: Queue, alive: Callable[[], bool] | None = None):
        self.inbox = inbox
        self.outbox = outbox
        self.alive = alive

    def send(self, message: Any) -> None:
        try:
            self.outbox.put(message)
        except ray.exceptions.RayError as e:
            raise OSError(f"the link's queue is gone: {e}") from None

    def recv(self) -> Any:
        while True:
            try:
                return self.inbox.get(timeout=POLL_S)
            except Empty:
                if self.alive is not None and not self.alive():
                    raise EOFError("the replica stopped serving") from None
            except ray.exceptions.RayError:
                raise EOFError("the link's queue is gone") from None


@ray.remote(max_restarts=MAX_RESTARTS, max_task_retries=0)
class ReplicaActor:
    """One engine replica: `serve` builds the engine and steps it on this actor's main thread until the server
    says stop."""

    def serve(self, link: QueueLink, build: Build, threads: int) -> None:
        import torch
        torch.set_num_threads(max(1, threads))
        engine_main(link, build)


class RayReplica(EngineProcess):
    """The server's link to one replica: an engine process whose transport is a Ray actor and two queues."""

    def __init__(self, build: Build, index: int, cpus: float, max_queued: int):
        super().__init__(build, max_queued)
        self.index = index
        self.cpus = cpus
        self.restarts = 0
        self.actor = ReplicaActor.options(num_cpus=cpus).remote()   # type: ignore[attr-defined]
        self._serving: ray.ObjectRef | None = None
        self._stopping = False

    @property
    def serving(self) -> bool:
        return self._reader is not None and not self._gone

    @property
    def held(self) -> int:
        return len(self._runs)

    def stop(self, timeout: float = 60.0) -> None:
        self._stopping = True
        super().stop(timeout)
        ray.kill(self.actor, no_restart=True)

    def _launch(self) -> Link:
        to_engine, to_server = Queue(actor_options=QUEUE_OPTIONS), Queue(actor_options=QUEUE_OPTIONS)
        self._serving = self.actor.serve.remote(QueueLink(to_engine, to_server), self.build, int(self.cpus))
        return QueueLink(to_server, to_engine, alive=self._still_serving)

    def _still_serving(self) -> bool:
        return self._serving is not None and not ray.wait([self._serving], timeout=0)[0]

    def _join(self, timeout: float) -> None:
        if self._serving is not None:
            ray.wait([self._serving], timeout=timeout)

    def _kill(self) -> None:
        if self._still_serving():
            ray.kill(self.actor, no_restart=True)

    def _exit_status(self) -> str:
        if self._serving is None:
            return f"replica {self.index} never served"
        try:
            ray.get(self._serving, timeout=0)
            return f"replica {self.index} stopped"
        except ray.exceptions.GetTimeoutError:
            return f"replica {self.index} still serving"
        except ray.exceptions.RayError as e:
            return f"replica {self.index}: {type(e).__name__}"

    def _end_lost(self, tracer: RecordingTracer) -> None:
        end_lost_run(tracer, f"engine replica {self.index} died mid-run: this run was interrupted; Ray restarts "
                             "the replica, and new runs go to the live ones")

    def _orphan_all(self) -> None:
        super()._orphan_all()
        if not self._stopping:
            threading.Thread(target=self._relaunch, name=f"specscope-replica-{self.index}", daemon=True).start()

    def _relaunch(self) -> None:
        """Serve again on the actor Ray restarts, trying until it answers (a call made while it restarts fails) or
        Ray gives up on it (past MAX_RESTARTS)."""
        self.restarts += 1
        for attempt in range(RELAUNCH_TRIES):
            if self._stopping:
                return
            self._reader = None
            try:
                self.start()
                log.warning("engine replica %d serves again (restart %d)", self.index, self.restarts)
                return
            except ray.exceptions.ActorDiedError:
                log.error("engine replica %d is gone for good: Ray stopped restarting it", self.index)
                return
            except Exception as e:
                log.info("engine replica %d not back yet (try %d): %s", self.index, attempt + 1, e)
                time.sleep(RELAUNCH_WAIT_S)
        log.error("engine replica %d did not come back", self.index)


class Replicas:
    """An `EngineService` over N engine replicas on a Ray cluster (started here on this machine, or joined at
    `address`). A run goes to the live replica holding the fewest runs; a model switch switches every replica."""

    def __init__(self, build: Build, replicas: int, max_queued: int, address: str | None = None,
                 cpus: float = 1.0):
        self.build = build
        self.count = replicas
        self.max_queued = max_queued
        self.address = address
        self.cpus = cpus
        self.links: list[RayReplica] = []
        self.placed: OrderedDict[str, int] = OrderedDict()
        """The replica each of the latest runs went to (run id -> replica), PLACED_KEPT of them."""

    @property
    def model(self) -> ServedModel:
        return next((link for link in self.links if link.serving), self.links[0]).model

    def start(self) -> None:
        if self.links:
            return
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        self.links = [RayReplica(self.build, i, self.cpus, self.max_queued) for i in range(self.count)]
        errors: list[BaseException] = []

        def start(link: RayReplica) -> None:
            try:
                link.start()
            except BaseException as e:
                errors.append(e)
        threads = [threading.Thread(target=start, args=(link,)) for link in self.links]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.stop(10)
            raise errors[0]

    def stop(self, timeout: float = 60.0) -> None:
        for link in self.links:
            link.stop(timeout)

    def submit(self, prompt: Prompt, mode: str, params: dict[str, Any], tracer: RecordingTracer) -> Run:
        held = sum(link.held for link in self.links)
        if held >= self.max_queued:
            raise Busy(f"the server has {held} runs queued or running, its limit; try again when one has ended")
        live = [link for link in self.links if link.serving]
        if not live:
            raise Busy("no engine replica is serving (they are restarting); try again shortly")
        link = min(live, key=lambda link: (link.held, link.index))
        run = link.submit(prompt, mode, params, tracer)
        self.placed[tracer.run_id] = link.index
        while len(self.placed) > PLACED_KEPT:
            self.placed.popitem(last=False)
        return run

    def switch(self, folder: Any) -> ServedModel:
        return [link.switch(folder) for link in self.links if link.serving][0]

    def rate(self, prompt_ids: list[int], answer: list[int]) -> AnswerFit:
        return self._first().rate(prompt_ids, answer)

    def stats(self) -> dict[str, Any]:
        """The replicas' counts summed, and each replica's own (`replicas`)."""
        each: list[dict[str, Any]] = []
        for link in self.links:
            mine = link.stats() if link.serving else None
            each.append({"replica": link.index, "serving": link.serving, "restarts": link.restarts,
                         "active": mine["active"] if mine else 0, "held": link.held,
                         "pool": mine["pool"] if mine else None})
        pools = [e["pool"] for e in each if e["pool"]]
        return {"active": sum(e["active"] for e in each), "held": sum(e["held"] for e in each),
                "pool": {k: sum(p[k] for p in pools) for k in ("used", "slots", "peak")}, "replicas": each}

    def forwards(self, since: int, limit: int) -> list[dict[str, Any]]:
        """The first serving replica's forwards (each replica counts its own)."""
        return self._first().forwards(since, limit)

    def _first(self) -> RayReplica:
        live = [link for link in self.links if link.serving]
        if not live:
            raise RuntimeError("no engine replica is serving (they are restarting); try again shortly")
        return live[0]
