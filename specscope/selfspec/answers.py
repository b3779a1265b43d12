"""The training and held-out answers (tools.selfspec_data's JSONL) as the token sequences training reads."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERATION_CAP = 128
"""tools.selfspec_data's default max_new_tokens: a shorter answer stopped by itself."""


def read_rows(path: Path, max_len: int, eos_id: int | None) -> list[dict[str, Any]]:
    """Prompt + answer sequences; an answer that ended before the generation cap ends with the stop token (the
    engine's outputs leave it out), so drafts learn where answers end."""
    rows = []
    for line in path.open():
        r = json.loads(line)
        ended = r.get("stopped", len(r["answer_ids"]) < GENERATION_CAP) and eos_id is not None
        seq = (r["prompt_ids"] + r["answer_ids"] + ([eos_id] if ended else []))[:max_len]
        if len(seq) > len(r["prompt_ids"]) + 1:
            rows.append({"seq": seq, "prompt_len": len(r["prompt_ids"]), "category": r["category"]})
    return rows
