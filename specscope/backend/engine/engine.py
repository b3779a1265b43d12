"""The engine: validate a request, run it through the scheduler, return or stream its trace."""
from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from specscope.backend.engine.cost_curve import FLAT, CostCurve
from specscope.backend.engine.draft_tiers import DraftTiers
from specscope.backend.engine.messages import Prompt, check_messages, last_user
from specscope.backend.engine.modes import param_specs
from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.params import ParamError, PromptTooLong, validate
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.scheduler import Scheduler, Tiers
from specscope.backend.model.checkpoint import LoadedModel, load_checkpoint
from specscope.backend.model.tokenizer import PieceTable
from specscope.backend.tracing import NULL_TRACER, RecordingTracer, Tracer, new_run_id


def freeze_long_lived() -> None:
    """Collect what is garbage now, then exempt every object left (the models, tokenizers and tables loaded so
    far) from the cyclic GC's scans, which a traced run's many event dicts set off (docs/performance.md, "Tracing").
    Call again after dropping an engine: unfreezing first lets its cycles be collected."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


@dataclass
class RunResult:
    run_id: str
    mode: str
    status: str
    output_ids: list[int]
    text: str
    metrics: dict[str, Any]
    error: str | None = None


def run_matmul(engine_matmul: str, mode: Mode) -> str:
    """The matmul precision a run of `mode` computes in: the engine's, with the mode's own verify precision named
    where it differs ('int8, verify float32')."""
    verify = mode.verify_matmul
    return engine_matmul if verify in (None, engine_matmul) else f"{engine_matmul}, verify {verify}"


class Engine:
    """Owns the model runtime, the KV pool and the scheduler. Building one measures nothing and writes nothing:
    it prices rows with `cost_curve`, FLAT when none is given; a command that wants the machine's curve measures
    or loads it as a step of its own (`cost_measure.machine_curve`, as `cli.common.build_engine` does) and hands
    it over with `use_cost_curve`."""

    def __init__(self, loaded: LoadedModel | None = None, num_slots: int = 16384,
                 tiers: Tiers | None = None, check_invariants: bool = False, matmul: str = "float32",
                 draft_tiers: DraftTiers | None = None, cost_curve: CostCurve = FLAT, forward: str = "auto"):
        self.rt = Runtime(loaded or load_checkpoint(), num_slots, matmul, forward)
        self.scheduler = Scheduler(self.rt, tiers, check_invariants, draft_tiers=draft_tiers)
        self.pieces = PieceTable(self.rt.tokenizer)
        """Each prompt id's own text, for run_start."""
        self.use_cost_curve(cost_curve)
        freeze_long_lived()

    @property
    def cost_curve(self) -> CostCurve:
        """What a forward costs by its rows here, as the cost-aware verify length and the draft tiers price them."""
        return self.rt.cost

    def use_cost_curve(self, curve: CostCurve) -> None:
        """Price rows with `curve` from the next round on (runs record the curve they started with)."""
        self.rt.cost = curve

    @property
    def model_name(self) -> str:
        return self.rt.loaded.name

    def render(self, prompt: Prompt, raw: bool) -> str:
        """The text the model reads: a conversation (or a one-line prompt, as one user message) through the
        model's chat template; a raw prompt as it is. A model without a template reads a prompt, or a conversation
        of one user message, as its text; a longer conversation is refused."""
        tok = self.rt.tokenizer
        if isinstance(prompt, str) and (raw or not tok.chat_template):
            return prompt
        messages = check_messages(prompt)
        if not tok.chat_template:
            if len(messages) == 1 and not raw:
                return messages[0]["content"]
            raise ParamError("this model has no chat template, so it reads one message as plain text; send a raw "
                             "prompt or a single user message instead of a conversation")
        if raw:
            raise ParamError("raw=true takes a prompt string, not messages")
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode_prompt(self, prompt: Prompt, raw: bool) -> list[int]:
        return self.rt.tokenizer(self.render(prompt, raw), add_special_tokens=False)["input_ids"]

    def new_request(self, prompt: Prompt, mode: str, params: dict[str, Any] | None = None,
                    tracer: Tracer = NULL_TRACER, cancel: threading.Event | None = None) -> Request:
        """A validated request (ParamError names the bad parameter); emits run_start when tracing. `prompt` is a
        string or a conversation: a list of {"role": system / user / assistant, "content": str}."""
        if isinstance(prompt, str) and not prompt.strip():
            raise ParamError("prompt is empty")
        m = self.scheduler.policy(mode)
        checked = validate(param_specs(m), params)
        if m.needs_mask and self.rt.mask_id is None:
            raise ParamError(f"this model has no mask token (mask_token_id); {mode} needs one")
        m.check(checked, self.rt)
        ids = self.encode_prompt(prompt, checked["raw"])
        ctx = self.rt.context
        if len(ids) >= ctx:
            raise PromptTooLong(f"prompt is {len(ids)} tokens; the model's context is {ctx}")
        room = ctx - len(ids) - m.extra_positions(self.scheduler.sizing_params(checked))
        if checked["max_new_tokens"] > room:
            raise ParamError(f"max_new_tokens {checked['max_new_tokens']} does not fit: prompt {len(ids)} "
                             f"tokens + block leaves room for {max(room, 0)} in context {ctx}")
        req = Request(rid=tracer.run_id or new_run_id(), prompt_ids=ids, mode=m.name, params=checked,
                      eos_id=self.rt.eos_id, tracer=tracer, cancel=cancel or threading.Event())
        need = self.scheduler.worst_case_slots(req)
        if need > self.rt.pool.num_slots:
            raise ParamError(f"request needs up to {need} KV slots; the pool has {self.rt.pool.num_slots}")
        if tracer.enabled:
            tiered = checked["tiers"]
            tiers = self.scheduler.tiers if "block_size" in checked and tiered else []
            tracer.emit("run_start", {"mode": mode, "params": checked, "model": self.model_name,
                                      "model_hash": self.rt.loaded.weights_hash,
                                      "matmul": run_matmul(self.rt.matmul, m), "forward": self.rt.backend_name,
                                      "block_size_tiers": [list(t) for t in tiers],
                                      "draft_tiers": [list(t) for t in self.scheduler.draft_tiers if tiered],
                                      "cost_curve": self.cost_curve.to_json(),
                                      "engine": self.rt.engine_id, "kv_slots": self.rt.pool.num_slots,
                                      "prompt": prompt if isinstance(prompt, str) else last_user(prompt),
                                      **({} if isinstance(prompt, str) else {"messages": prompt}),
                                      "prompt_ids": ids,
                                      "pieces": self.pieces(ids)})
        return req

    def result(self, req: Request) -> RunResult:
        out = self.scheduler.recorder.outcome(req)
        return RunResult(req.rid, req.mode, req.status, out["output_ids"], out["text"], out["metrics"], req.error)

    def run(self, reqs: list[Request]) -> list[RunResult]:
        """Run several requests together (continuous batching) until all finish."""
        for r in reqs:
            self.scheduler.add(r)
        while not all(r.finished for r in reqs):
            self.scheduler.step()
        return [self.result(r) for r in reqs]

    def generate(self, prompt: Prompt, mode: str, params: dict[str, Any] | None = None,
                 tracer: Tracer = NULL_TRACER, cancel: threading.Event | None = None) -> RunResult:
        return self.run([self.new_request(prompt, mode, params, tracer, cancel)])[0]

    def stream(self, prompt: Prompt, mode: str, params: dict[str, Any] | None = None,
               cancel: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """Trace events of one run as the tracer makes them (between rounds, a batch every ~50 ms or more)."""
        pending: list[dict[str, Any]] = []
        req = self.new_request(prompt, mode, params, RecordingTracer(sink=pending.append, keep=False), cancel)
        self.scheduler.add(req)
        while True:
            yield from pending
            pending.clear()
            if req.finished:
                return
            self.scheduler.step()
