"""The model runner: the only place that builds tensors for a forward, allocates slots and records phases."""
from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from specscope.backend.engine.ask import Ask, BranchAsk
from specscope.backend.engine.cost_curve import FLAT, CostCurve
from specscope.backend.engine.draft_chain import draft_chain
from specscope.backend.engine.kv import KVPool
from specscope.backend.engine.request import Request
from specscope.backend.engine.sampling import alternatives
from specscope.backend.engine.scores import Scores
from specscope.backend.forward.choice import forward_backend
from specscope.backend.forward.folded import folded_backend
from specscope.backend.forward.fused_step import FusedDecode
from specscope.backend.forward.invariant import InvariantForward
from specscope.backend.forward.plan import Eager, Fold, FoldCounts, ForwardBackend, ForwardPlan, ForwardResult
from specscope.backend.model.checkpoint import LoadedModel
from specscope.backend.model.transformer import KVContext
from specscope.backend.tracing import Phase

EAGER_MATMUL = {torch.float32: "float32", torch.bfloat16: "bf16", torch.float16: "float16"}
"""The eager backend's matmul precision: its weights' dtype, named as MATMULS names them."""
FORWARD_LOG = 4096
"""Forwards the runtime keeps a record of (the oldest drop out)."""
MAX_SHARED = 64
"""Requests whose row groups may share one causal forward (the scheduler's MAX_RUNNING)."""
MAX_ALTERNATIVES = 8


@dataclass
class Served:
    """One row group of a forward (one request's, or several requests' of one shape): what `account` records."""
    owners: list[Request]
    kind: str
    plan: ForwardPlan
    rows_at: list[list[int]]
    write: list[list[int]] | None
    kv_op: str
   # top-k entries kept per position and round (one per forward that predicted it)


def shifted(rows: Tensor) -> Tensor:
    """Rows [R, Q, ...] of a model whose row i predicts position i, moved so row i predicts i + 1 (the last row,
    which has no successor, repeated)."""
    return torch.cat([rows[:, 1:], rows[:, -1:]], dim=1)


class Runtime:
    def __init__(self, loaded: LoadedModel, num_slots: int, matmul: str = "float32", forward: str = "auto"):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.mask_id = loaded.mask_token_id
        self.eos_id = loaded.eos_token_id
        self.context = self.model.cfg.max_position_embeddings
        param = next(self.model.parameters())
        self.device = param.device
        if self.device.type == "cpu":
            self.model.store_weights_input_major()   # the eager backend's layout: x @ W for CPU matmuls
        self.pool = KVPool(self.model.cfg, num_slots, param.dtype, param.device)
        self.eager = Eager(self.model)
        self.backend_name, self.backend = forward_backend(self.model, self.pool.memory, self.eager, matmul, forward)
        """Every plan but a fold, by `forward` (forward.choice.FORWARDS): the fused CPU step ("fused": float32
        models on the CPU, its matmuls in `matmul` precision; what it cannot take runs on self.eager) or the
        batch-invariant torch forward ("torch", any device; auto's choice where the fused step does not apply).
        Runs record which (run_start's `forward`), as their tokens depend on it."""
        fused = self.backend if isinstance(self.backend, FusedDecode) else None
        self.matmul = fused.matmul if fused else EAGER_MATMUL.get(param.dtype, str(param.dtype))
        """The precision of the forwards' matmuls: the fused step's ("float32" or "bf16", `matmul` resolved), else
        the weights' dtype. Runs record it (run_start), as their tokens depend on it."""
        self._folded: dict[str, ForwardBackend] = {}
        self.chain = draft_chain(self.model, loaded.adapter_dir, self.mask_id)
        """The adapter's sampler head, if it ships one: chained MASK drafts (`drafts`)."""
        self.cost: CostCurve = FLAT
        """What a forward costs by its rows on this machine (FLAT unless the engine is handed its curve): the
        cost-aware verify length and the draft tiers price rows with it."""
        self.engine_id = os.urandom(6).hex()
        """This runtime's name in traces (run_start's `engine`): forward ids count within it."""
        self.forwards = 0
        """Forwards run so far (each phase records the one it was part of)."""
        self.log: deque[dict[str, Any]] = deque(maxlen=FORWARD_LOG)
        """The latest forwards, one record each (`account`): what the scheduler did, for /api/forwards."""
        self.round_forwards = 0
        self.round_rows = 0
        """Forwards run for rounds (prefills left out), and the query rows they computed, every request's."""

    @property
    def mask(self) -> int:
        """The mask token id; modes that need it refuse to start (Mode.check) when the model has none."""
        if self.mask_id is None:
            raise RuntimeError("this model has no mask token")
        return self.mask_id

    # -- slots ---------------------------------------------------------------------------------------
    def alloc(self, req: Request, positions: Sequence[int]) -> list[int]:
        slots = self.pool.alloc(req.rid, len(positions))
        if req.tracer.enabled:
            req.tracer.kv("alloc", slots, positions, req.round)
        return slots

    def commit(self, req: Request, slots: list[int]) -> None:
        """Append freshly written slots to the committed prefix, in position order."""
        start = req.cached
        self._extend_slot_index(req, slots)
        req.slots.extend(slots)
        if req.tracer.enabled and slots:
            req.tracer.kv("commit", slots, range(start, start + len(slots)), req.round)

    def release(self, req: Request, slots: list[int], positions: list[int], reason: str) -> None:
        if not slots:
            return
        self.pool.free(req.rid, slots)
        if req.tracer.enabled:
            req.tracer.kv("free", slots, positions, req.round, reason)

    def release_all(self, req: Request, reason: str) -> None:
        """Free every slot the request still holds (committed or not): finish, cancel and error paths."""
        owned = self.pool.owned_by(req.rid)
        committed = set(req.slots)
        self.release(req, [s for s in req.slots if s in owned], list(range(len(req.slots))), reason)
        stray = [s for s in owned if s not in committed]
        self.release(req, stray, [-1] * len(stray), reason)
        req.slots = []
        req.slot_index = None

    # -- forwards ------------------------------------------------------------------------------------
    def forward(self, reqs: list[Request], ids: Tensor, start: Sequence[int], attn: str, *,
                kind: str, write: list[list[int]] | None = None, lora: bool = False,
                kv_op: str = "write", mask: Tensor | None = None, offsets: Sequence[int] | None = None) -> Tensor:
        """Logits [R, Q, V] of query rows ids [R, Q], one row per request, shifted: row j predicts position
        start[r] + j + 1 (realigned here for a model whose logits in `attn` predict their own position). Row r
        sits at positions start[r] + offsets (default 0..Q-1) and attends to reqs[r]'s committed prefix. `write`
        gives each row's slots (None = read-only forward); `mask` [R, 1, Q, P+Q] replaces the attention mode's
        mask. `lora` asks for a draft-scope adapter in this pass. One call is one forward on the critical path:
        +1 NFE for each request (not for prefill)."""
        return self.run(reqs, ids, start, attn, self._context(reqs, write), kind=kind, write=write, lora=lora,
                        kv_op=kv_op, mask=mask, offsets=offsets).logits

    # -- what rounds ask for, and how the scheduler answers ----------------------------------------------
    @staticmethod
    def ask(req: Request, ids: list[int], start: int, attn: str, *, kind: str, write: list[int] | None = None,
            lora: bool = False, kv_op: str = "write", mask: Tensor | None = None,
            offsets: Sequence[int] | None = None) -> Ask:
        """A round's request for one forward of its query rows (`score`'s arguments), to yield to the scheduler."""
        return Ask(req, ids, start, attn, kind, write, lora, kv_op, mask, offsets)

    def answer(self, asks: Sequence[Ask | BranchAsk]) -> list[Any]:
        """Run the asks as one forward (several only when they share a key), each answered with its rows."""
        first = asks[0]
        if len(asks) == 1:
            if isinstance(first, BranchAsk) and first.fold is None:
                return [self.branches(first.req, first.states, first.start)]
            if isinstance(first, BranchAsk):
                return [self.folded_branches(first.req, first.states, first.start, cast(Fold, first.fold),
                                             cast(str, first.backend))]
            return [self.score(first.req, first.ids, first.start, first.attn, kind=first.kind, write=first.write,
                               lora=first.lora, kv_op=first.kv_op, mask=first.mask, offsets=first.offsets)]
        packed = self.score_ragged(asks)   # asks share a key only when it is RAGGED
        return packed if packed is not None else [self.answer([a])[0] for a in asks]

    def group_limit(self, ask: Ask | BranchAsk) -> int:
        """How many asks of this one's key may share a forward: on the torch forward any number (it takes every
        plan, and its rows never depend on the rows beside them); on the fused CPU step as many as keep the forward
        there (the same plan alone would run there too), or 1 where the ask's plan would fall back to the eager
        backend, whose numbers may depend on the batch."""
        fused = self.backend
        if isinstance(fused, InvariantForward):
            return MAX_SHARED
        if not isinstance(fused, FusedDecode):
            return 1
        if isinstance(ask, BranchAsk):   # R read-only block states over one prefix
            ids, lora, attn, writes = torch.tensor(ask.states), False, "block", False
        else:
            ids, lora, attn, writes = torch.tensor([ask.ids]), ask.lora, ask.attn, ask.write is not None
        requests, q = ids.shape
        if fused.adapter_rows(self.adapter(ids, lora), ids.numel()) is False:
            return 1
        if not fused.accepts(q, attn, None, writes, requests, fused.max_chunk):
            return 1
        return MAX_SHARED

    def branches(self, req: Request, states: Sequence[Sequence[int]], start: int) -> list[Scores]:
        """One read-only `block` forward of R states of one request's open block (row 0 the main state), as R
        row groups over the request's one committed prefix (read once, `KVContext.shared`): +1 NFE."""
        result = self.branch_forward(req, states, start, None, self.backend)
        return [Scores(row, req, self.mask_id) for row in result.logits]

    def folded_branches(self, req: Request, states: Sequence[Sequence[int]], start: int, fold: Fold,
                        backend: str) -> tuple[list[Scores], FoldCounts]:
        """`branches`, with the row groups folded along the fold's tree (SpecFold) by the named folded backend
        (backend.forward.folded.FOLD_BACKENDS); also the fold counts."""
        if backend not in self._folded:
            self._folded[backend] = folded_backend(self.model, backend)
        result = self.branch_forward(req, states, start, fold, self._folded[backend])
        return [Scores(row, req, self.mask_id) for row in result.logits], cast(FoldCounts, result.folds)

    def branch_forward(self, req: Request, states: Sequence[Sequence[int]], start: int, fold: Fold | None,
                       backend: ForwardBackend) -> ForwardResult:
        """The forward under `branches` and `folded_branches`, on the given backend."""
        r = len(states)
        return self.run([req], torch.tensor(states), [start] * r, "block", self._branch_context(req, r),
                        kind="verify" if r > 1 else "denoise", fold=fold, backend=backend)

    def _branch_context(self, req: Request, r: int) -> KVContext:
        """R row groups that all read the request's one committed prefix (read once), read-only."""
        kv = self._context([req], None)
        kv.prefix_slots, kv.shared = kv.prefix_slots.expand(r, -1), True
        return kv

    def run(self, owners: list[Request], ids: Tensor, start: Sequence[int], attn: str, kv: KVContext, *,
            kind: str, write: list[list[int]] | None = None, lora: bool = False, kv_op: str = "write",
            mask: Tensor | None = None, fold: Fold | None = None, backend: ForwardBackend | None = None,
            offsets: Sequence[int] | None = None) -> ForwardResult:
        """The one forward every verb goes through: builds its plan and runs it on `backend` (default: the
        runtime's); `owners` are the distinct requests it serves (NFE, phases)."""
        t0 = time.perf_counter()
        plan, rows_at = self.plan(ids, start, attn, kv, lora, mask, fold, offsets)
        with torch.inference_mode():
            result = self.aligned((backend or self.backend).run(plan), attn)
        self.account([Served(owners, kind, plan, rows_at, write, kv_op)], [result], t0)
        return result

    def plan(self, ids: Tensor, start: Sequence[int], attn: str, kv: KVContext, lora: bool, mask: Tensor | None,
             fold: Fold | None, offsets: Sequence[int] | None) -> tuple[ForwardPlan, list[list[int]]]:
        """The forward's plan, and each row group's positions."""
        steps = range(ids.shape[1]) if offsets is None else offsets
        rows_at = [[s + j for j in steps] for s in start]
        ids = ids.to(self.device)
        adapter = self.adapter(ids, lora)
        chained = self.chain is not None and fold is None and adapter is not False   # the chain reads the states
        return ForwardPlan(ids, torch.tensor(rows_at, device=self.device), attn, kv,
                           None if mask is None else mask.to(self.device), adapter, fold, hidden=chained), rows_at

    def aligned(self, result: ForwardResult, attn: str) -> ForwardResult:
        """The result with row j predicting position j + 1, for a model whose logits in `attn` predict their own."""
        if self.loaded.logits_shifted.get(attn, True):
            return result
        return ForwardResult(shifted(result.logits), result.folds,
                             None if result.hidden is None else shifted(result.hidden))

    def account(self, served: list[Served], results: list[ForwardResult], t0: float) -> None:
        """After one forward: top-k alternatives where asked, +1 NFE and a phase for every request it served (its
        own rows, and what it shared), and the KV trace of what it wrote."""
        ms = round((time.perf_counter() - t0) * 1000, 3)
        requests = sum(len(s.owners) for s in served)
        rows = sum(int(s.plan.ids.numel()) for s in served)
        self.forwards += 1
        self.log.append({"id": self.forwards, "t": time.time(), "ms": ms, "rows": rows,
                         "pool_used": self.pool.used, "pool_slots": self.pool.num_slots,
                         "groups": [{"run_id": r.rid, "mode": r.mode, "round": r.round, "kind": s.kind,
                                     "rows": s.plan.ids.shape[1]} for s in served for r in s.owners]})
        if served[0].kind != "prefill":
            self.round_forwards += 1
            self.round_rows += rows
        for s, result in zip(served, results, strict=True):
            if any(r.params.get("trace_topk") for r in s.owners):
                self._note_alternatives(s.owners, s.rows_at, result.logits, s.kind)
            adapter = s.plan.adapter
            adapter_on = bool(adapter.any()) if isinstance(adapter, Tensor) else adapter
            for req in s.owners:
                if s.kind != "prefill":
                    req.nfe += 1
                    req.forward_ms += ms
                    own = s.plan.ids.shape[1]
                    req.forward_rows[own] = req.forward_rows.get(own, 0) + 1
                req.phases.append(Phase(s.kind, s.plan.attn, adapter_on, s.plan.ids.shape[1], ms, self.forwards,
                                        requests, rows, self.pool.used))
            if s.write is not None:
                for req, slots, row in zip(s.owners, s.write, s.rows_at, strict=True):
                    if req.tracer.enabled:
                        req.tracer.kv(s.kv_op, slots, row, req.round)

    def score_ragged(self, asks: Sequence[Ask | BranchAsk]) -> list[Scores | list[Scores]] | None:
        """One forward of several requests' row groups of any lengths, positions and attention (causal ones write
        their K/V; bidirectional blocks may or may not; a branched verify's states, `branches`' rows), packed flat on
        the fused step or the torch forward; None where the fused step cannot take them all."""
        if not isinstance(self.backend, (FusedDecode, InvariantForward)):
            return None
        t0 = time.perf_counter()
        served = [self._served(a) for a in asks]
        with torch.inference_mode():
            raw = self.backend.run_ragged([s.plan for s in served])
        if raw is None:
            return None
        results = [self.aligned(r, s.plan.attn) for r, s in zip(raw, served, strict=True)]
        self.account(served, results, t0)
        return [[Scores(row, a.req, self.mask_id) for row in r.logits] if isinstance(a, BranchAsk) else
                Scores(r.logits[0], a.req, self.mask_id, None if r.hidden is None else r.hidden[0])
                for r, a in zip(results, asks, strict=True)]

    def _served(self, ask: Ask | BranchAsk) -> Served:
        """An ask's row group in a packed forward: its plan, as `score` (or `branches`) would run it alone."""
        if isinstance(ask, BranchAsk):
            r = len(ask.states)
            plan, rows_at = self.plan(torch.tensor(ask.states), [ask.start] * r, "block",
                                      self._branch_context(ask.req, r), False, None, None, None)
            return Served([ask.req], "verify" if r > 1 else "denoise", plan, rows_at, None, "write")
        writes = None if ask.write is None else [ask.write]
        plan, rows_at = self.plan(torch.tensor([ask.ids]), [ask.start], ask.attn, self._context([ask.req], writes),
                                  ask.lora, ask.mask, None, ask.offsets)
        return Served([ask.req], ask.kind, plan, rows_at, writes, ask.kv_op)

    def score(self, req: Request, ids: list[int], start: int, attn: str, *, kind: str,
              write: list[int] | None = None, lora: bool = False, kv_op: str = "write", mask: Tensor | None = None,
              offsets: Sequence[int] | None = None, backend: ForwardBackend | None = None) -> Scores:
        """One request's forward of the query row `ids` at positions start + offsets (see `forward`), its logits
        as Scores; on `backend` where given (a re-scoring in another precision), else the runtime's."""
        writes = None if write is None else [write]
        result = self.run([req], torch.tensor([ids]), [start], attn, self._context([req], writes), kind=kind,
                          write=writes, lora=lora, kv_op=kv_op, mask=mask, offsets=offsets, backend=backend)
        return Scores(result.logits[0], req, self.mask_id, None if result.hidden is None else result.hidden[0])

    def _note_alternatives(self, reqs: list[Request], rows_at: list[list[int]], logits: Tensor, kind: str) -> None:
        """For each traced request that asked (params.trace_topk): the top-k of every row's next position, kept per
        position until its round is recorded. A request's first row group only (its main state, in a branched
        verify); a prefill's last row only (it predicts the first new token)."""
        n = len(reqs)     # a branched verify has one owner: its first row group
        for req, positions, rows in zip(reqs, rows_at[:n], logits[:n], strict=True):
            k = req.params.get("trace_topk", 0)
            if not k or not req.tracer.enabled:
                continue
            if kind == "prefill":
                positions, rows = positions[-1:], rows[-1:]
            for pos, entry in zip(positions, alternatives(rows, k, self.mask_id), strict=True):
                kept = req.alternatives.setdefault(pos + 1, [])
                if len(kept) < MAX_ALTERNATIVES:
                    kept.append({"kind": kind, **entry})

    def drafts(self, masks: Scores, previous: int, argmax: bool = False,
               chained: bool = True) -> tuple[list[int], Scores]:
        """The tokens a run of MASK rows drafts after the token `previous`, and the rows they were drawn from (their
        proposal): chained through the sampler head when the adapter ships one and `chained`, else each row's own
        pick (its argmax if `argmax`, else the request's rule)."""
        if chained and self.chain is not None:
            return self.chain.draw(masks, previous, argmax)
        return (masks.argmax() if argmax else masks.tokens()), masks

    def adapter(self, ids: Tensor, draft: bool) -> bool | Tensor:
        """Where the model's adapter is on in this forward, by its declared scope: `draft` passes that ask for
        it (Nemotron's linear-spec LoRA), or MASK positions only in every forward (I-DLM's R-ISD)."""
        scope = self.loaded.adapter_scope      # None unless the model was loaded with an adapter
        if scope == "mask" and self.mask_id is not None:
            on = ids == self.mask_id
            return on if bool(on.any()) else False
        return draft and scope == "draft"

    def _extend_slot_index(self, req: Request, slots: list[int]) -> None:
        """Mirror the committed slot table in a persistent device tensor (grown by doubling), so a forward
        reads its prefix as a view instead of rebuilding it from a Python list."""
        start, end = req.cached, req.cached + len(slots)
        index = req.slot_index
        if index is None or index.numel() < end:
            grown = torch.empty(max(64, 2 * end), dtype=torch.long, device=self.device)
            if index is not None:
                grown[:start] = index[:start]
            index = req.slot_index = grown
        if index.device.type == "cpu":
            index.numpy()[start:end] = slots   # a few times cheaper than a torch copy, once per token
        else:
            index[start:end] = torch.tensor(slots, dtype=torch.long)

    def _context(self, reqs: list[Request], write: list[list[int]] | None) -> KVContext:
        lengths = [r.cached for r in reqs]
        width = max(lengths)
        valid = None
        if width == 0:
            prefix = torch.zeros(len(reqs), 0, dtype=torch.long, device=self.device)
        elif len(reqs) == 1:
            prefix = cast(Tensor, reqs[0].slot_index)[None, :width]
        elif min(lengths) == width:
            prefix = torch.stack([cast(Tensor, r.slot_index)[:width] for r in reqs])
        else:
            prefix = torch.zeros(len(reqs), width, dtype=torch.long, device=self.device)
            for i, r in enumerate(reqs):
                prefix[i, :lengths[i]] = cast(Tensor, r.slot_index)[:lengths[i]]
            held = torch.tensor(lengths, device=self.device)
            valid = torch.arange(width, device=self.device)[None, :] < held[:, None]
        write_t = None if write is None else torch.tensor(write, dtype=torch.long, device=self.device)
        return KVContext(self.pool.memory, prefix, valid, write_t)

    def prefill(self, req: Request) -> int:
        """Write the prompt's KV (causal) and return the first generated token (not yet in the KV): in one forward,
        or with reduced-precision matmuls in chunks the fused step takes, so the prompt's rows round as the run's
        do."""
        ids = req.prompt_ids
        chunk = len(ids) if self.matmul == "float32" else getattr(self.backend, "max_chunk", len(ids))
        for start in range(0, len(ids), chunk):
            slots = self.alloc(req, list(range(start, min(start + chunk, len(ids)))))
            scores = self.score(req, ids[start:start + chunk], start, "causal", kind="prefill", write=slots)
            self.commit(req, slots)
        (first,) = scores.rows(slice(-1, None)).tokens()
        return first
