"""Chat tasks of the declared domain (train.domain), split by values and by phrasing.

Two independent, stable hashes decide where a task belongs, so no seed can leak one split into another:
- its values (the family's canonical key, not the wording): 80 % train, 10 % held-out, 10 % calibration;
- its wording (see domain.phrasing): 80 % of wordings are trained, 20 % are never trained.
Training draws train values in trained wordings; the held-out set alternates trained and held-out wordings
(`Task.phrasing` says which); calibration uses calibration values in trained wordings.
"""
from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from specscope.backend.train.domain import TASK_FAMILIES, TaskFamily
from specscope.backend.train.domain.phrasing import decorate, wordings

SPLITS = ("train", "heldout", "calibration")
REQUIRED = ("count", "table", "add", "sort", "reverse", "spell", "json", "pyfunc")


@dataclass(frozen=True)
class Task:
    kind: str
    prompt: str
    answer: str
    phrasing: str = "train"   # the phrasing split of the prompt's wording
    key: str = ""             # the canonical values (decide the value split)
    wording: str = ""         # the wording pattern the prompt was filled from


def split_of(key: str) -> str:
    """The value split of a family's canonical value key: 80 % train, 10 % held-out, 10 % calibration."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") % 10
    return "heldout" if h == 0 else "calibration" if h == 1 else "train"


@cache
def family_wordings(kind: str, variant: str, phrasing: str) -> tuple[str, ...]:
    return tuple(wordings(TASK_FAMILIES[kind].patterns[variant], phrasing))


def draw(family: TaskFamily, rng: random.Random, split: str, phrasing: str = "train") -> Task:
    """One task of a family whose values fall in `split`, worded in the `phrasing` split."""
    while True:
        inst = family.draw(rng)
        if split_of(inst.key) == split:
            break
    wording = rng.choice(family_wordings(family.name, inst.variant, phrasing))
    return Task(family.name, decorate(wording.format(**inst.slots), rng), inst.answer, phrasing, inst.key, wording)


def generate(split: str, seed: int, kinds: tuple[str, ...] = tuple(TASK_FAMILIES)) -> Iterator[Task]:
    """An endless, seeded stream of tasks of one split; held-out tasks alternate trained / held-out wordings."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    rng = random.Random(f"{split}:{seed}")
    i = 0
    while True:
        phrasing = "heldout" if split == "heldout" and i % 2 else "train"
        i += 1
        yield draw(TASK_FAMILIES[rng.choice(kinds)], rng, split, phrasing)


def task_set(split: str, per_kind: int, seed: int = 0, kinds: tuple[str, ...] = tuple(TASK_FAMILIES)) -> list[Task]:
    """A fixed list of distinct tasks: `per_kind` of every kind, in a stable order."""
    out: list[Task] = []
    for kind in kinds:
        seen: set[str] = set()
        for task in generate(split, seed, (kind,)):
            if task.prompt not in seen:
                seen.add(task.prompt)
                out.append(task)
            if len(seen) == per_kind:
                break
    return out


CHECKPOINT_TASKS = "tasks.jsonl"
"""A checkpoint's own held-out tasks ({"kind", "prompt", "answer"} per line), for a model trained on another
task set than the declared domain (the shipped tiny model: its five templated kinds)."""


def checkpoint_tasks(folder: str | Path, per_kind: int) -> list[Task] | None:
    """The first `per_kind` tasks of every kind in the checkpoint's tasks.jsonl; None when it has none."""
    path = Path(folder) / CHECKPOINT_TASKS
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    taken: dict[str, int] = {}
    out = []
    for row in rows:
        if taken.get(row["kind"], 0) < per_kind:
            taken[row["kind"]] = taken.get(row["kind"], 0) + 1
            out.append(Task(row["kind"], row["prompt"], row["answer"]))
    return out


def example_prompts(per_kind: int = 3) -> dict[str, list[str]]:
    """A few held-out prompts per family (values and wordings never trained), for one-click use in the UI."""
    out: dict[str, list[str]] = {}
    for kind in TASK_FAMILIES:
        prompts: list[str] = []
        for task in generate("heldout", 7, (kind,)):
            if task.phrasing == "heldout" and task.prompt not in prompts:
                prompts.append(task.prompt)
            if len(prompts) == per_kind:
                break
        out[kind] = prompts
    return out
