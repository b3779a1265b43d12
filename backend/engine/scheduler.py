"""Continuous batching at round granularity: admit, run one round per request, apply results, finish.

Requests of a batchable mode (ar) share one forward per round; other modes run their rounds one request
after another inside the same step. A request is admitted when the pool can hold its worst case (prompt +
max_new_tokens + the mode's extra positions) on top of what running requests may still grow to, so a
round never runs out of slots. Block modes take their block size from `block_size_tiers` when set: the
first tier whose max_running covers the running count (SGLang DllmConfig).
"""
from __future__ import annotations

import threading
import time
from collections import deque

from backend.engine.kv import KVError
from backend.engine.modes.base import RoundResult, RoundView
from backend.engine.request import Request
from backend.engine.runtime import Runtime
from backend.tracing import RoundEvent

FREE_REASON = {"done": "finished", "cancelled": "cancelled", "error": "error"}


def worst_case_slots(req: Request) -> int:
    return len(req.prompt_ids) + req.params["max_new_tokens"] + req.mode.extra_positions(req.params)


class Scheduler:
    def __init__(self, rt: Runtime, tiers: list[tuple[int, int]] | None = None, check_invariants: bool = False):
        self.rt = rt
        self.tiers = sorted(tiers or [])
        self.check_invariants = check_invariants
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._lock = threading.Lock()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: Request) -> None:
        with self._lock:
            self.waiting.append(req)

    def block_size_for(self, running: int) -> int | None:
        for max_running, size in self.tiers:
            if running <= max_running:
                return size
        return self.tiers[-1][1] if self.tiers else None

    def step(self) -> list[Request]:
        """Admit what fits, run one round of every running request; return the requests that finished."""
        finished = self._drop_cancelled(self.waiting) + self._drop_cancelled(self.running)
        self._admit()
        tier = self.block_size_for(len(self.running))
        groups: dict[str, list[Request]] = {}
        for req in self.running:
            if "block_size" in req.params:
                req.block_size = tier
            groups.setdefault(req.mode.name, []).append(req)
        for reqs in groups.values():
            self._run_group(reqs)
        finished += [r for r in self.running if r.finished]
        self.running = [r for r in self.running if not r.finished]
        return finished

    def _drop_cancelled(self, queue: deque[Request] | list[Request]) -> list[Request]:
        dropped = [r for r in list(queue) if r.cancel.is_set()]
        for r in dropped:
            queue.remove(r)
            self.finish(r, "cancelled")
        return dropped

    def _admit(self) -> None:
        growth = sum(worst_case_slots(r) - self.rt.pool.held(r.rid) for r in self.running)
        while self.waiting:
            req = self.waiting[0]
            need = worst_case_slots(req)
            if self.running and self.rt.pool.free_count - growth < need:
                return
            with self._lock:
                self.waiting.popleft()
            growth += need
            self.running.append(req)
            self._guarded([req], lambda r=req: self._prefill(r))

    def _prefill(self, req: Request) -> None:
        req.status = "running"
        first = self.rt.prefill(req)
        req.mode.start(req, self.rt)
        view = RoundView(len(req.prompt_ids), [first], ["accepted"]) if req.tracer.enabled else None
        self.apply(req, RoundResult([first], 1, view=view))

    def _run_group(self, reqs: list[Request]) -> None:
        live = [r for r in reqs if not r.finished]
        if not live:
            return
        mode = live[0].mode
        if mode.batchable:
            self._guarded(live, lambda: self._apply_all(live, mode.round_batch(live, self.rt)))
        else:
            for r in live:
                self._guarded([r], lambda r=r: self.apply(r, mode.round(r, self.rt)))

    def _apply_all(self, reqs: list[Request], results: list[RoundResult]) -> None:
        for r, res in zip(reqs, results, strict=True):
            self.apply(r, res)

    def _guarded(self, reqs: list[Request], work) -> None:
        """Run work; any exception fails these requests cleanly (error event, KV freed), never the engine."""
        try:
            work()
        except Exception as e:  # a mode bug or OutOfSlots must not take other runs down
            for r in reqs:
                if not r.finished:
                    r.error = f"{type(e).__name__}: {e}"
                    if r.tracer.enabled:
                        r.tracer.emit("error", {"code": "run_failed", "message": r.error})
                    self.finish(r, "error")

    def apply(self, req: Request, res: RoundResult) -> None:
        """Free, commit, emit (cut at EOS / max_new_tokens), trace, then check invariants."""
        for rel in res.free:
            self.rt.release(req, rel.slots, rel.positions, rel.reason)
        self.rt.commit(req, res.commit)
        room = req.params["max_new_tokens"] - len(req.generated)
        emitted = res.emitted[:room]
        if req.eos_id in emitted:
            emitted = emitted[:emitted.index(req.eos_id) + 1]
        req.tokens.extend(emitted)
        if req.round > 0:
            req.accept_lens.append(res.accepted_len)
        done = len(emitted) < len(res.emitted) or req.eos_id in emitted or len(req.generated) >= req.params[
            "max_new_tokens"]
        if req.tracer.enabled:
            self._trace_round(req, res, emitted)
        req.round += 1
        req.phases = []
        if done:
            self.finish(req, "done")
        elif self.check_invariants:
            self.check(req)

    def _trace_round(self, req: Request, res: RoundResult, emitted: list[int]) -> None:
        text = self.output_text(req)
        delta = text[len(req.text):] if text.startswith(req.text) else text
        req.text = text
        v = res.view
        if v is None:
            raise ValueError(f"mode {req.mode.name} returned no view while tracing is on")
        req.tracer.round(RoundEvent(
            round=req.round, phases=list(req.phases), block_start=v.block_start, tokens=v.tokens,
            states=v.states, conf=v.conf, accepted_len=res.accepted_len, committed=emitted,
            nfe=sum(p.kind != "prefill" for p in req.phases), text_delta=delta, case=v.case, pq=v.pq,
            branches=v.branches, fold=v.fold, extra=v.extra))

    def check(self, req: Request) -> None:
        """KV invariants between rounds: committed slots == committed tokens, no stray or shared slot."""
        pool = self.rt.pool
        pool.check()
        if len(set(req.slots)) != len(req.slots):
            raise KVError(f"{req.rid}: a slot appears twice in the slot table")
        if len(req.tokens) - len(req.slots) not in (0, 1):
            raise KVError(f"{req.rid}: {len(req.slots)} committed slots for {len(req.tokens)} tokens")
        if pool.owned_by(req.rid) != sorted(req.slots):
            raise KVError(f"{req.rid}: holds slots outside its committed prefix")

    def output_ids(self, req: Request) -> list[int]:
        out = req.generated
        return out[:out.index(req.eos_id)] if req.eos_id in out else out

    def output_text(self, req: Request) -> str:
        return self.rt.tokenizer.decode(self.output_ids(req), skip_special_tokens=True)

    def finish(self, req: Request, status: str) -> None:
        """Free every slot, emit run_end with metrics, mark the request finished."""
        self.rt.release_all(req, FREE_REASON[status])
        req.kv_peak = self.rt.pool.forget(req.rid)
        req.status = status
        req.t_end = time.perf_counter()
        if req.tracer.enabled:
            req.tracer.emit("run_end", {"status": status, "output_ids": self.output_ids(req),
                                        "text": self.output_text(req), "metrics": self.metrics(req)})

    def metrics(self, req: Request) -> dict:
        wall = ((req.t_end or time.perf_counter()) - req.t_start) * 1000
        tokens = len(self.output_ids(req))
        hist: dict[str, int] = {}
        for n in req.accept_lens:
            hist[str(n)] = hist.get(str(n), 0) + 1
        return {
            "nfe": req.nfe, "tokens": tokens, "tpf": tokens / req.nfe if req.nfe else None,
            "wall_ms": round(wall, 3), "tok_per_s": tokens / wall * 1000 if wall > 0 else None,
            "accept_len_mean": sum(req.accept_lens) / len(req.accept_lens) if req.accept_lens else None,
            "accept_hist": hist, "fold_ratio": None, "rounds": req.round,
            "kv_peak": req.kv_peak,
            "kv_leaked": self.rt.pool.held(req.rid),
            **req.mode.metrics(req),
        }
