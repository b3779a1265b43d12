"""Engine replicas on Ray (`specscope serve --ray [ADDRESS] --replicas N`): each replica is one Ray actor holding one
batched engine, stepped on the actor's main thread as the engine process steps its own, and linked to the server by
the engine process's messages over a pair of Ray queues. The server stays one: it routes each run to a live replica
(below), relays every replica's events into the one store, and answers health for all.

A replica that dies mid-run ends its runs `interrupted` (an error event, then run_end), Ray restarts its actor
(`max_restarts`), and the link serves again once the new engine is built; meanwhile new runs go to the live
replicas, and a run no replica can take is refused as busy.

A run goes to the live replica with room for it in its KV pool (free slots at least its prompt's rough token count
plus its max_new_tokens), then holding the fewest runs, then with the most free slots. Without `--ray` nothing here
is imported."""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import ray
from ray.util.queue import Empty, Queue

from specscope.backend.engine.answer_fit import AnswerFit
from specscope.backend.engine.diverge import Probe, Rescored
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
"""A link's queues take no CPU of the cluster's: the replicas' engines hold them."""
PLACED_KEPT = 1000
RELAUNCH_TRIES, RELAUNCH_WAIT_S = 120, 0.5
"""How long a dead replica's link waits for Ray's restart of it: a minute."""
POOL_FRESH_S, POOL_TIMEOUT_S = 0.5, 2.0
"""How old a replica's free-slot count may be when a run is routed, and how long reading it may take."""
CHARS_PER_TOKEN = 3
"""A prompt's rough token count for routing: its characters over this (the tokenizer runs on the replica)."""


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
        self._free, self._free_read = 0, -POOL_FRESH_S

    def free_slots(self) -> int:
        """The replica's free KV slots, read at most every POOL_FRESH_S (0 when it does not answer in time)."""
        if time.monotonic() - self._free_read > POOL_FRESH_S:
            try:
                pool = self._call("stats", None, timeout=POOL_TIMEOUT_S)["pool"]
                self._free = pool["slots"] - pool["used"]
            except (RuntimeError, TimeoutError):
                self._free = 0
            self._free_read = time.monotonic()
        return self._free

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


def rough_need(prompt: Prompt, params: dict[str, Any]) -> int:
    """The KV slots a run will roughly take: its prompt's characters over CHARS_PER_TOKEN, plus max_new_tokens when
    given (a bad value counts nothing here: the replica refuses it)."""
    text = prompt if isinstance(prompt, str) else "".join(str(m.get("content", "")) for m in prompt)
    answer = params.get("max_new_tokens")
    return len(text) // CHARS_PER_TOKEN + (answer if type(answer) is int and answer > 0 else 0)


class Replicas:
    """An `EngineService` over N engine replicas on a Ray cluster (started here on this machine, or joined at
    `address`). A run goes to a live replica with KV room for it holding the fewest runs (see the module's doc); a
    model switch switches every replica."""

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
        need, free = rough_need(prompt, params), {link.index: link.free_slots() for link in live}
        link = min(live, key=lambda link: (free[link.index] < need, link.held, -free[link.index], link.index))
        run = link.submit(prompt, mode, params, tracer)
        self.placed[tracer.run_id] = link.index
        while len(self.placed) > PLACED_KEPT:
            self.placed.popitem(last=False)
        return run

    def switch(self, folder: Any) -> ServedModel:
        return [link.switch(folder) for link in self.links if link.serving][0]

    def rate(self, prompt_ids: list[int], answer: list[int]) -> AnswerFit:
        return self._first().rate(prompt_ids, answer)

    def rescore(self, probes: list[Probe]) -> list[Rescored]:
        return self._first().rescore(probes)

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

    def forwards(self, since: int, limit: int, replica: int = 0) -> list[dict[str, Any]]:
        """Replica `replica`'s forwards (each replica counts its own), each record naming it."""
        link = next((link for link in self.links if link.index == replica), None)
        if link is None:
            raise LookupError(f"no engine replica {replica}: this server runs replicas 0 to {len(self.links) - 1}")
        if not link.serving:
            raise RuntimeError(f"engine replica {replica} is restarting; try again shortly")
        return [{**record, "replica": replica} for record in link.forwards(since, limit)]

    def _first(self) -> RayReplica:
        live = [link for link in self.links if link.serving]
        if not live:
            raise RuntimeError("no engine replica is serving (they are restarting); try again shortly")
        return live[0]
