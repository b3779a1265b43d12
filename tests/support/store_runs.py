"""A synthetic traced run for store tests: a run_start, rounds that draft one accepted and one rejected token, and a
run_end, emitted through a RecordingTracer into any sink (a Store, a StoreWriter)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specscope.backend.tracing import Phase, RecordingTracer, RoundEvent

PROMPT = "What is 12 + 30?"
N_ROUNDS = 3
DRAFT_SLOT = 9  # every round drafts one rejected token into slot 9, so the slot is reused


def start(sink: Callable[[dict[str, Any]], None], mode: str = "isd", prompt: str = PROMPT) -> RecordingTracer:
    tracer = RecordingTracer(sink=sink)
    tracer.emit("run_start", {"mode": mode, "params": {"n": 2, "alpha": 0.5}, "model": "tiny", "prompt": prompt,
                              "prompt_ids": [1, 2], "pieces": ["Wh", "at"]})
    tracer.kv("alloc", [0, 1], [0, 1], 0)
    tracer.kv("commit", [0, 1], [0, 1], 0)
    return tracer


def play_round(tracer: RecordingTracer, r: int) -> None:
    """Round r drafts two tokens: the first (slot 2+r, position 2+r) is accepted, the second (slot 9) rejected."""
    accepted, position = 2 + r, 2 + r
    tracer.kv("alloc", [accepted, DRAFT_SLOT], [position, position + 1], r)
    tracer.round(RoundEvent(
        round=r, phases=[Phase("draft", "block", True, 2, 1.5), Phase("verify", "causal", False, 2, 2.5)],
        block_start=position, tokens=[100 + r, 200 + r], states=["accepted", "rejected"], conf=[0.9, float("nan")],
        accepted_len=1, committed=[100 + r], nfe=2, text_delta=f"t{r}", case="VRC"[r % 3],
        pq=[{"p": 0.9, "q": 0.8, "accepted": True}]))
    tracer.kv("commit", [accepted], [position], r)
    tracer.kv("free", [DRAFT_SLOT], [position + 1], r, "rejected")
    tracer.flush()   # the round's events reach the sink now (an engine's tracer hands them on in batches)


def finish(tracer: RecordingTracer, status: str = "done") -> None:
    tracer.kv("free", [0, 1, 2, 3, 4], [0, 1, 2, 3, 4], N_ROUNDS - 1, "finished")
    tracer.emit("run_end", {"status": status, "output_ids": [100, 101, 102], "text": "t0t1t2",
                            "metrics": {"nfe": 6, "tokens": 3, "tpf": 0.5, "wall_ms": 1.0, "tok_per_s": 3000.0,
                                        "accept_len_mean": 1.0, "accept_hist": {"1": 3}, "fold_ratio": None,
                                        "kv_peak": 6, "kv_leaked": 0}})
