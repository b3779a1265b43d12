"""The run recorder: what a run shows of itself. Round and run_end events, run metrics, output text and its
incremental deltas; the scheduler only applies round results and asks the recorder to record them."""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from specscope.backend.engine.draft_tiers import tier_cut
from specscope.backend.engine.modes.base import Mode
from specscope.backend.engine.request import Request
from specscope.backend.engine.spec_alarm import alarm, card_figure
from specscope.backend.engine.spec_counts import spec_counts
from specscope.backend.model.tokenizer import byte_table, text_decoder, text_stream
from specscope.backend.tracing import Phase, RoundEvent

KEPT_STATES = ("accepted", "committed", "bonus")
"""States of a cell whose token the mode keeps: a kept EOS ends the view; one past max_new_tokens is cut."""


class RunRecorder:
    def __init__(self, tokenizer: Any, pool_held: Any, policy: Callable[[str], Mode],
                 card: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.policy = policy              # mode name -> its policy (mode-specific metrics)
        self.card = card                  # the model card (its held-out figures set the acceptance alarm)
        self.decode = text_decoder(tokenizer)
        self.pool_held = pool_held        # rid -> slots still held (kv_leaked)

    @functools.cached_property
    def bytes_of(self) -> list[bytes] | None:
        """The tokenizer's byte_table, made for the first traced run (untraced engines never pay for it)."""
        return byte_table(self.tokenizer)

    # -- output --------------------------------------------------------------------------------------
    def output_ids(self, req: Request) -> list[int]:
        out = req.generated
        return out[:out.index(req.eos_id)] if req.eos_id in out else out

    def output_text(self, req: Request) -> str:
        return self.decode(self.output_ids(req))

    def text_delta(self, req: Request, emitted: list[int]) -> str:
        """The text that this round's emitted ids add to the output (nothing from EOS on; a stream per run)."""
        if req.text is None:
            req.text = text_stream(self.tokenizer, self.bytes_of)
        return req.text.push(emitted[:emitted.index(req.eos_id)] if req.eos_id in emitted else emitted)

    # -- events --------------------------------------------------------------------------------------
    def round(self, req: Request, view: RoundEvent | None, accepted_len: int, emitted: list[int]) -> None:
        """Hand the mode's view of the round to the tracer, to be completed with the bookkeeping when it is made."""
        if view is None:
            raise ValueError(f"mode {req.mode} returned no view while tracing is on")
        if req.alternatives:
            view.topk = self.alternatives(view, req.alternatives)
            req.alternatives = {}
        req.tracer.round(view, self.complete, req, req.round, req.phases, accepted_len, emitted)

    @staticmethod
    def alternatives(view: RoundEvent, by_position: dict[int, list[dict[str, Any]]]) -> list[Any]:
        """The round's recorded top-k per cell (None where no forward predicted its position); a cell sits at
        block_start + its offset (quadratic's `extra.offsets`) or + its index."""
        return [by_position.get(pos) for pos in view.positions()]

    def complete(self, req: Request, round_: int, phases: list[Phase], accepted_len: int, emitted: list[int],
                 view: RoundEvent) -> None:
        """Fill in the round's bookkeeping (number, forwards, accepted and committed tokens, NFE, text delta);
        nothing after an emitted EOS is shown as drafted or accepted, and what the mode kept past max_new_tokens
        is shown cut, so the accepted cells and the bonus are exactly the committed tokens. The scheduler starts
        a new phases list for the next round, so `phases` stays this round's."""
        if req.eos_id in emitted:
            shown = [i for i, (t, s) in enumerate(zip(view.tokens, view.states, strict=True))
                     if t == req.eos_id and s in KEPT_STATES]
            if shown:
                view.cut_after(shown[0])
        self.cut(view, len(req.prompt_ids) + req.params["max_new_tokens"])
        view.round, view.phases, view.accepted_len, view.committed = round_, phases, accepted_len, emitted
        if req.tier is not None:
            view.extra["tier"] = req.tier
        view.accepted = view.states.count("accepted")
        view.nfe = len(phases) - [p.kind for p in phases].count("prefill")
        view.text_delta = self.text_delta(req, emitted)

    @staticmethod
    def cut(view: RoundEvent, end: int) -> None:
        """Mark `cut` every kept cell at a position from `end` on (the first one max_new_tokens leaves out)."""
        if view.block_start + len(view.tokens) <= end and "offsets" not in view.extra:
            return
        view.states = [("cut" if pos >= end and s in KEPT_STATES else s)
                       for pos, s in zip(view.positions(), view.states, strict=True)]

    def outcome(self, req: Request) -> dict[str, Any]:
        """An ended run's output_ids, text and metrics, made once (run_end and the engine's result share them)."""
        if req.outcome is None:
            req.outcome = {"output_ids": self.output_ids(req), "text": self.output_text(req),
                           "metrics": self.metrics(req)}
        return req.outcome

    def run_end(self, req: Request) -> None:
        reason = {"reason": req.cancel_reason} if req.status == "cancelled" else {}
        req.tracer.emit("run_end", {"status": req.status, **reason, **self.outcome(req)})

    def error(self, req: Request, message: str) -> None:
        req.tracer.emit("error", {"code": "run_failed", "message": message})

    # -- metrics -------------------------------------------------------------------------------------
    def alarm(self, req: Request) -> dict[str, Any]:
        """The run's acceptance alarm (engine/spec_alarm.py) against the card's figure for the mode's drafts."""
        figure = card_figure(self.card, self.policy(req.mode).heldout_layout)
        return alarm(req.draft_steps, self.output_ids(req), figure)

    def metrics(self, req: Request) -> dict[str, Any]:
        wall = ((req.t_end or time.perf_counter()) - req.t_start) * 1000
        tokens = len(self.output_ids(req))
        hist: dict[str, int] = {}
        for n in req.accept_lens:
            hist[str(n)] = hist.get(str(n), 0) + 1
        cut = tier_cut(req.tier_log, req.params)
        return {
            "nfe": req.nfe, "tokens": tokens, "tpf": tokens / req.nfe if req.nfe else None,
            "wall_ms": round(wall, 3), "tok_per_s": tokens / wall * 1000 if wall > 0 else None,
            "accept_len_mean": sum(req.accept_lens) / len(req.accept_lens) if req.accept_lens else None,
            "accept_hist": hist, "rounds": req.round, "kv_peak": req.kv_peak,
            "kv_leaked": self.pool_held(req.rid),
            "forward_ms": round(req.forward_ms, 3),
            "mean_forward_ms": round(req.forward_ms / req.nfe, 4) if req.nfe else None,
            "forward_share": round(req.forward_ms / wall, 4) if wall > 0 else None,
            "forward_rows": {str(k): v for k, v in sorted(req.forward_rows.items())},
            **spec_counts(req.draft_steps),
            "alarm": self.alarm(req),
            **({"tier_cut": cut} if cut else {}),
            **self.policy(req.mode).metrics(req),
        }
