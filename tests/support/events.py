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


TREE_START = 35
"""Where the tree rounds' blocks start: the seed at 35, the drafts at 36 on."""


def tree_round(r: int, path: list[int], bonus: int, start: int = TREE_START, depth: int = 4) -> dict[str, Any]:
    """A linear_spec tree round (its mode's own view of it) at `start`: two branches of `depth` drafts each,
    the verify accepting the nodes of `path` (a chain from the seed) and giving `bonus`."""
    from specscope.backend.engine.draft_tree import ROOT, DraftTree
    from specscope.backend.engine.modes.linear_spec import LinearSpec

    drafts = [[2, 3, 4, 5, 1, 2, 3, 4][:depth], [3, 1, 4, 5, 2, 1, 3, 5][:depth]]
    tree = DraftTree([], [], [], [], [])
    for branch, tokens in enumerate(drafts):
        for d, token in enumerate(tokens, start=1):
            tree.tokens.append(token)
            tree.parents.append(ROOT if d == 1 else len(tree.tokens) - 2)
            tree.depths.append(d)
            tree.chances.append(0.9 ** d / (branch + 1))
            tree.branches.append(branch)
    view = LinearSpec._tree_view(start, [1, *tree.tokens], tree, path, bonus, "fixed")
    return rnd(r, start, view.tokens, view.states, [tree.tokens[n] for n in path] + [bonus], nfe=2,
               conf=view.conf, block_size=view.block_size, extra=view.extra)


def tree_run_events(run_id: str = "r_tree") -> list[dict]:
    """A linear_spec run of two tree rounds after its prefill: round 1 accepts all of branch 0 (its bonus lies where
    branch 1's fifth draft would), round 2 the first two drafts of branch 0 (its bonus where branch 0's third
    draft lies)."""
    prompt = [1, 2] * 17 + [1]
    rounds = [rnd(0, TREE_START, [1], ["accepted"], [1], nfe=1), tree_round(1, [0, 1, 2, 3], 1),
              tree_round(2, [0, 1], 5, start=TREE_START + 5)]
    ids = [c for r in rounds for c in r["committed"]]
    start = {"v": 1, "run_id": run_id, "seq": 0, "t_ms": 0.0, "type": "run_start", "mode": "linear_spec",
             "model": "m", "matmul": "bf16", "params": {"max_new_tokens": len(ids), "branches": 2},
             "prompt": "tree", "prompt_ids": prompt, "pieces": ["Hi", "<script>"] * 17 + ["Hi"]}
    end = {"v": 1, "run_id": run_id, "seq": 9, "t_ms": 1.0, "type": "run_end", "status": "done", "output_ids": ids,
           "text": "out", "metrics": {"nfe": 5, "tokens": len(ids), "tpf": len(ids) / 5, "tok_per_s": 50.0,
                                      "wall_ms": 100.0, "accept_len_mean": 3.0, "kv_peak": 48, "kv_leaked": 0}}
    return [start, *[dict(r, run_id=run_id) for r in rounds], end]
