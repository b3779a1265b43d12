"""The run recorder: what a run shows of itself. Round and run_end events, run metrics, output text and its
incremental deltas; the scheduler only applies round results and asks the recorder to record them."""
from __future__ import annotations

import time
from typing import Any

from backend.engine.request import Request
from backend.model.tokenizer import text_decoder
from backend.tracing import RoundEvent

SHOWN_EOS_STATES = ("accepted", "committed", "bonus")
TEXT_WINDOW = 24   # output ids decoded per round at most (plus that round's new ones)
TEXT_CONTEXT = 4   # ids a restarted window keeps before the read point (a token's text can depend on them)


class RunRecorder:
    def __init__(self, tokenizer: Any, pool_held: Any):
        self.decode = text_decoder(tokenizer)
        self.pool_held = pool_held        # rid -> slots still held (kv_leaked)

    # -- output --------------------------------------------------------------------------------------
    def output_ids(self, req: Request) -> list[int]:
        out = req.generated
        return out[:out.index(req.eos_id)] if req.eos_id in out else out

    def output_text(self, req: Request) -> str:
        return self.decode(self.output_ids(req))

    def text_delta(self, req: Request) -> str:
        """New text since the last call. Only a short window of recent tokens is decoded, once per round: the
        window's text so far is kept, and the window restarts a few tokens back once it holds TEXT_WINDOW ids.
        A window that ends inside a multi-byte character waits for the next round."""
        ids = self.output_ids(req)
        start, read_at, shown = req.text_window
        if len(ids) == read_at:
            return ""
        full = self.decode(ids[start:])
        if full.endswith("\ufffd") or len(full) <= len(shown):
            return ""
        if len(ids) - start >= TEXT_WINDOW:    # restart the window on the last tokens (their text: a second decode)
            start = len(ids) - TEXT_CONTEXT
            req.text_window = (start, len(ids), self.decode(ids[start:]))
        else:
            req.text_window = (start, len(ids), full)
        return full[len(shown):]

    # -- events --------------------------------------------------------------------------------------
    def round(self, req: Request, view: RoundEvent | None, accepted_len: int, emitted: list[int]) -> None:
        """Complete the mode's view of the round with the bookkeeping and emit it."""
        if view is None:
            raise ValueError(f"mode {req.mode.name} returned no view while tracing is on")
        if req.eos_id in emitted:
            shown = [i for i, (t, s) in enumerate(zip(view.tokens, view.states, strict=True))
                     if t == req.eos_id and s in SHOWN_EOS_STATES]
            if shown:
                view.cut_after(shown[0])
        view.round, view.phases, view.accepted_len, view.committed = req.round, list(req.phases), accepted_len, emitted
        view.nfe = sum(p.kind != "prefill" for p in req.phases)
        view.text_delta = self.text_delta(req)
        req.tracer.round(view)

    def run_end(self, req: Request) -> None:
        req.tracer.emit("run_end", {"status": req.status, "output_ids": self.output_ids(req),
                                    "text": self.output_text(req), "metrics": self.metrics(req)})

    def error(self, req: Request, message: str) -> None:
        req.tracer.emit("error", {"code": "run_failed", "message": message})

    # -- metrics -------------------------------------------------------------------------------------
    def metrics(self, req: Request) -> dict[str, Any]:
        wall = ((req.t_end or time.perf_counter()) - req.t_start) * 1000
        tokens = len(self.output_ids(req))
        hist: dict[str, int] = {}
        for n in req.accept_lens:
            hist[str(n)] = hist.get(str(n), 0) + 1
        return {
            "nfe": req.nfe, "tokens": tokens, "tpf": tokens / req.nfe if req.nfe else None,
            "wall_ms": round(wall, 3), "tok_per_s": tokens / wall * 1000 if wall > 0 else None,
            "accept_len_mean": sum(req.accept_lens) / len(req.accept_lens) if req.accept_lens else None,
            "accept_hist": hist, "rounds": req.round, "kv_peak": req.kv_peak,
            "kv_leaked": self.pool_held(req.rid),
            **req.mode.metrics(req),
        }
