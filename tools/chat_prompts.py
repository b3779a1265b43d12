"""The self-distillation prompt set (backend/model/chat_prompts.py) as a JSONL file, one prompt a line.

    python -m tools.chat_prompts --count 3000 --out prompts.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from specscope.backend.model.chat_prompts import TEMPLATES, prompt_set


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    rows = prompt_set(args.count, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = sum(r["held_out"] for r in rows)
    print(f"{len(rows)} prompts from {len(TEMPLATES)} templates ({held} held out) -> {args.out}")


if __name__ == "__main__":
    main()
