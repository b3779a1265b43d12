"""Synthetic trace events for the figure and token-grid tests: a three-round linear_spec run whose pieces hold
markup, an entity and whitespace."""
from __future__ import annotations

from typing import Any

from specscope.app.trace import make_piece

PIECES = {1: "Hi", 2: "<script>", 3: " there", 4: "\n", 5: "&amp;", 9: "[M]"}
piece = make_piece(None, PIECES)


def rnd(r: int, block_start: int, tokens: list[int], states: list[str], committed: list[int], nfe: int = 1,
        **extra: Any) -> dict[str, Any]:
    return {"v": 1, "run_id": "r_test", "seq": r + 1, "t_ms": 0.0, "type": "round", "round": r,
            "phases": [{"kind": "verify", "attn": "causal", "lora": False, "n_query": len(tokens), "ms": 1.0}],
            "block_start": block_start, "tokens": tokens, "states": states, "conf": extra.pop("conf", None),
            "accepted_len": len(committed), "committed": committed, "nfe": nfe, "text_delta": "", **extra}


def run_events(run_id: str = "r_test", mode: str = "linear_spec", output: list[int] | None = None) -> list[dict]:
    rounds = [
        rnd(0, 2, [3], ["accepted"], [3], nfe=0),
        rnd(1, 2, [3, 2, 4, 9], ["committed", "accepted", "bonus", "rejected"], [2, 4], nfe=2,
            conf=[None, 0.95, 0.4, 0.2], extra={"threshold": 0.9}),
        rnd(2, 4, [4, 5, 1], ["committed", "accepted", "bonus"], [5, 1], nfe=2, conf=[None, 0.7, None]),
    ]
    ids = output if output is not None else [3, 2, 4, 5, 1]
    start = {"v": 1, "run_id": run_id, "seq": 0, "t_ms": 0.0, "type": "run_start", "mode": mode, "model": "m",
             "matmul": "bf16", "params": {"max_new_tokens": 5}, "prompt": "<b>hi</b>", "prompt_ids": [1, 2],
             "pieces": ["Hi", "<script>"]}
    end = {"v": 1, "run_id": run_id, "seq": 9, "t_ms": 1.0, "type": "run_end", "status": "done", "output_ids": ids,
           "text": "out", "metrics": {"nfe": 4, "tokens": 5, "tpf": 1.25, "tok_per_s": 50.0, "wall_ms": 100.0,
                                      "accept_len_mean": 2.0, "kv_peak": 8, "kv_leaked": 0}}
    return [start, *[dict(r, run_id=run_id) for r in rounds], end]
