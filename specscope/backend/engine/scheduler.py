"""Continuous batching at round granularity: admit, run one round of every request, apply results, finish.

A round is a generator of the forwards it needs (`Ask`, `BranchAsk`). A step advances every running round in waves:
each wave gathers the forward each round waits on and packs the asks that share a key (`Ask.key`: rows that write
their K/V causally or under a mask, and bidirectional blocks; `BranchAsk.key`: a branched verify's states, unfolded)
flat into one ragged forward, whatever their lengths and attention, one row group per request (per state) and at
most `Runtime.group_limit` asks: any number on the batch-invariant torch forward, as many as keep the forward on the
fused CPU step (whose rows never depend on their neighbours either), one where a plan would fall back to the eager
backend. A folded `BranchAsk`, or an ask without a key, runs alone. Every round then gets its own rows. So requests
of any mode and parameters share forwards, and none changes another's numbers.

A request is admitted when the pool can hold its worst
case (prompt + max_new_tokens + the mode's extra positions, sized for the largest block-size tier) on top of
what running requests may still grow to, so a round never runs out of slots. Modes with a `block_size` take
it from `block_size_tiers` when set: the first tier whose max_running covers the running count (SGLang
DllmConfig). A request whose `tiers` parameter is off keeps its own parameters whatever the load (Race and
Compare run each mode as it runs alone). What a run shows of itself (events, metrics, text) is the recorder's job.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from specscope.backend.engine.ask import Ask, BranchAsk, Round, RoundResult
from specscope.backend.engine.draft_tiers import DraftTiers, budget
from specscope.backend.engine.kv import KVError
from specscope.backend.engine.modes import get_mode
from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.params import ParamError
from specscope.backend.engine.recorder import RunRecorder
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.spec_alarm import read_card
from specscope.backend.model.checkpoint import CARD_FILE
from specscope.backend.tracing import RoundEvent

FREE_REASON = {"done": "finished", "cancelled": "cancelled", "error": "error"}
MAX_RUNNING = 64
"""Requests running at once; a block-size tier table must cover this many (its catch-all tier)."""

Tiers = list[tuple[int, int]]


@dataclass
class Pending:
    """A round waiting on a forward (by request id)."""
    round: Round
    ask: Ask | BranchAsk


def _raise(error: Exception) -> None:
    raise error


def check_tiers(tiers: Tiers, max_running: int = MAX_RUNNING) -> Tiers:
    """Tiers (max_running, block_size) sorted; ParamError unless strictly ascending with a catch-all."""
    tiers = sorted(tiers)
    if not tiers:
        return tiers
    runs = [t[0] for t in tiers]
    if len(set(runs)) != len(runs) or min(runs) < 1:
        raise ParamError(f"block_size_tiers need distinct max_running values >= 1, got {tiers}")
    if any(not 2 <= size <= 256 for _, size in tiers):
        raise ParamError(f"block_size_tiers block sizes must be in [2, 256], got {tiers}")
    if runs[-1] < max_running:
        raise ParamError(f"block_size_tiers need a catch-all tier covering {max_running} running requests "
                         f"(e.g. {max_running}:{tiers[-1][1]}); the largest is {runs[-1]}")
    return tiers


def parse_tiers(text: str) -> Tiers:
    """'1:32,4:16,64:8' -> [(1, 32), (4, 16), (64, 8)] (max_running:block_size), checked."""
    try:
        tiers = [(int(a), int(b)) for a, b in (item.split(":") for item in text.split(",") if item.strip())]
    except ValueError:
        raise ParamError(f"block_size_tiers must look like 1:32,4:16,64:8, got {text!r}") from None
    return check_tiers(tiers)


class Scheduler:
    def __init__(self, rt: Runtime, tiers: Tiers | None = None, check_invariants: bool = False,
                 max_running: int = MAX_RUNNING, draft_tiers: DraftTiers | None = None):
        self.rt = rt
        self.max_running = max_running
        self.tiers = check_tiers(tiers or [], max_running)
        self.draft_tiers = draft_tiers or []
        """Extra rows a drafting round may run, by running requests (draft_tiers.py); none: every request drafts
        at its own parameters."""
        self.check_invariants = check_invariants
        self.policies: dict[str, Mode] = {}
        card = read_card(rt.loaded.shipped_file(CARD_FILE))
        self.recorder = RunRecorder(rt.tokenizer, rt.pool.held, self.policy, card)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.steps = 0
        """Steps run so far (each advances every running round by one)."""
        self._lock = threading.Lock()

    def policy(self, mode: str) -> Mode:
        """The stateless policy of a mode, by name: one instance per engine (ParamError if unknown)."""
        if mode not in self.policies:
            self.policies[mode] = get_mode(mode)
        return self.policies[mode]

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

    def sizing_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Parameters as KV and context sizing must see them: the largest block any tier may give."""
        if self.tiers and "block_size" in params:
            return {**params, "block_size": max(params["block_size"], *(s for _, s in self.tiers))}
        return params

    def worst_case_slots(self, req: Request) -> int:
        return (len(req.prompt_ids) + req.params["max_new_tokens"]
                + self.policy(req.mode).extra_positions(self.sizing_params(req.params)))

    def step(self) -> list[Request]:
        """Admit what fits, run one round of every running request; return the requests that finished."""
        self.steps += 1
        finished = self._drop_cancelled(self.waiting) + self._drop_cancelled(self.running)
        self._admit()
        running = len(self.running)
        tier, rows = self.block_size_for(running), budget(self.draft_tiers, running)
        for req in self.running:
            if not req.params.get("tiers", True):   # a run that asked to draft as it would alone
                continue
            if "block_size" in req.params:
                req.block_size = tier
            req.draft_rows = rows
            if self.tiers or self.draft_tiers:
                req.tier = {"running": running, "block_size": tier, "extra_rows": rows,
                            "own_rows": self.policy(req.mode).tier_rows(req.params)}
        self._run_rounds([r for r in self.running if not r.finished])
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
        growth = sum(self.worst_case_slots(r) - self.rt.pool.held(r.rid) for r in self.running)
        while self.waiting and len(self.running) < self.max_running:
            req = self.waiting[0]
            need = self.worst_case_slots(req)
            if self.running and self.rt.pool.free_count - growth < need:
                return
            with self._lock:
                self.waiting.popleft()
            growth += need
            self.running.append(req)
            self._guarded([req], partial(self._prefill, req))

    def _prefill(self, req: Request) -> None:
        req.status = "running"
        first = self.rt.prefill(req)
        req.state = self.policy(req.mode).start(req, self.rt)
        view = RoundEvent(len(req.prompt_ids), [first], ["accepted"]) if req.tracer.enabled else None
        self.apply(req, RoundResult([first], 1, view=view))

    def _run_rounds(self, reqs: list[Request]) -> None:
        """One round of every request, in waves of shared forwards (the module's docstring)."""
        pending: dict[str, Pending] = {}
        for req in reqs:
            self._guarded([req], partial(self._advance, req, self.policy(req.mode).round(req, self.rt), None,
                                         pending))
        while pending:
            for group in self._waves(pending):
                answered = [a.req for a in group]
                try:
                    answers = self.rt.answer(group)
                except Exception as e:   # the forward failed: its requests fail, the others go on
                    for req in answered:
                        pending.pop(req.rid, None)
                    self._guarded(answered, partial(_raise, e))
                    continue
                for req, rows in zip(answered, answers, strict=True):
                    self._guarded([req], partial(self._advance, req, pending[req.rid].round, rows, pending))

    def _waves(self, pending: dict[str, Pending]) -> list[list[Ask | BranchAsk]]:
        """This wave's forwards: the pending asks grouped by key (each group at most its `group_limit`), the
        keyless alone."""
        groups: dict[Any, tuple[int, list[Ask | BranchAsk]]] = {}
        alone: list[list[Ask | BranchAsk]] = []
        for waits in list(pending.values()):
            ask = waits.ask
            key = ask.key()
            limit = self.rt.group_limit(ask) if key is not None else 1
            if limit == 1:
                alone.append([ask])
            else:
                groups.setdefault(key, (limit, []))[1].append(ask)
        shared = [asks[i:i + limit] for limit, asks in groups.values() for i in range(0, len(asks), limit)]
        return shared + alone

    def _advance(self, req: Request, round_: Round, rows: Any, pending: dict[str, Pending]) -> None:
        """Hand the round its rows (None to start it): it waits on its next forward, or it ends and is applied."""
        pending.pop(req.rid, None)
        try:
            ask = round_.send(rows)
        except StopIteration as done:
            self.apply(req, done.value)
            return
        pending[req.rid] = Pending(round_, ask)

    def _guarded(self, reqs: list[Request], work: Callable[[], None]) -> None:
        """Run work; any exception fails these requests cleanly (error event, KV freed), never the engine."""
        try:
            work()
        except Exception as e:  # a mode bug or OutOfSlots must not take other runs down
            for r in reqs:
                if not r.finished:
                    r.error = f"{type(e).__name__}: {e}"
                    if r.tracer.enabled:
                        self.recorder.error(r, r.error)
                    self.finish(r, "error")

    def apply(self, req: Request, res: RoundResult) -> None:
        """Free, commit, emit (cut at EOS / max_new_tokens; nothing after EOS counts as accepted), record,
        then check invariants."""
        for rel in res.free:
            self.rt.release(req, rel.slots, rel.positions, rel.reason)
        self.rt.commit(req, res.commit)
        room = req.params["max_new_tokens"] - len(req.generated)
        emitted = res.emitted[:room]
        if req.eos_id in emitted:
            emitted = emitted[:emitted.index(req.eos_id) + 1]
        cut = len(emitted) < len(res.emitted)
        accepted = min(res.accepted_len, len(emitted)) if cut else res.accepted_len
        req.tokens.extend(emitted)
        if res.draft is not None:
            req.draft_steps.append(res.draft.kept(len(emitted)))
        if req.round > 0:
            req.accept_lens.append(accepted)
            req.tier_log.append(req.tier)
        if req.tracer.enabled:
            self.recorder.round(req, res.view, accepted, emitted)
        req.round += 1
        req.phases = []
        if cut or req.eos_id in emitted or len(req.generated) >= req.params["max_new_tokens"]:
            self.finish(req, "done")
        elif self.check_invariants:
            self.check(req)

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

    def finish(self, req: Request, status: str) -> None:
        """Free every slot, mark the request finished, record run_end."""
        self.rt.release_all(req, FREE_REASON[status])
        req.kv_peak = self.rt.pool.forget(req.rid)
        req.status = status
        req.t_end = time.perf_counter()
        if req.tracer.enabled:
            self.recorder.run_end(req)
