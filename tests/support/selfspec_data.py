"""Training answers for the self-speculation pipelines' tests: the tiny model's own greedy answers to training
prompts, in `specscope data answers`' JSONL layout."""
from __future__ import annotations

import json
from pathlib import Path

from specscope.backend.engine.engine import Engine
from specscope.backend.train.prompts import prompt_set


def write_answers(engine: Engine, path: Path, count: int = 8) -> Path:
    """`count` training prompts answered by `engine`'s ar (12 tokens each), written to `path`."""
    rows = []
    for r in prompt_set(count, 0, held_out=False):
        req = engine.new_request(r["messages"], "ar", {"max_new_tokens": 12})
        rows.append({"prompt_ids": req.prompt_ids, "answer_ids": engine.run([req])[0].output_ids,
                     "category": r["category"]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
