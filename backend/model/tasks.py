"""Generated chat tasks with checkable answers: addition, sorting, copying, reversing, counting.

Splits are disjoint by construction: a prompt belongs to the split named by a stable hash of its text,
so the same prompt can never appear in two splits, whatever seed generated it.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

SPLITS = ("train", "heldout", "calibration")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Task:
    kind: str
    prompt: str
    answer: str


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 10 ** rng.randint(1, 3) - 1), rng.randint(0, 10 ** rng.randint(1, 3) - 1)
    return f"What is {a} + {b}?", str(a + b)


def _sort(rng: random.Random) -> tuple[str, str]:
    xs = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
    return "Sort: " + " ".join(map(str, xs)), " ".join(map(str, sorted(xs)))


def _letters(rng: random.Random) -> list[str]:
    return [rng.choice(LETTERS) for _ in range(rng.randint(3, 8))]


def _copy(rng: random.Random) -> tuple[str, str]:
    s = " ".join(_letters(rng))
    return f"Copy: {s}", s


def _reverse(rng: random.Random) -> tuple[str, str]:
    xs = _letters(rng)
    return "Reverse: " + " ".join(xs), " ".join(reversed(xs))


def _count(rng: random.Random) -> tuple[str, str]:
    alphabet = LETTERS[: rng.randint(2, 4)]
    xs = [rng.choice(alphabet) for _ in range(rng.randint(3, 10))]
    target = rng.choice(xs)
    return f"Count {target} in: " + " ".join(xs), str(xs.count(target))


GENERATORS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "add": _add, "sort": _sort, "copy": _copy, "reverse": _reverse, "count": _count}


def split_of(prompt: str) -> str:
    """The split a prompt belongs to: 80 % train, 10 % held-out, 10 % calibration, by hash."""
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "little") % 10
    return "heldout" if h == 0 else "calibration" if h == 1 else "train"


def generate(split: str, seed: int, kinds: tuple[str, ...] = tuple(GENERATORS)) -> Iterator[Task]:
    """An endless, seeded stream of tasks of one split, cycling through the task kinds."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    rng = random.Random(f"{split}:{seed}")
    while True:
        kind = rng.choice(kinds)
        prompt, answer = GENERATORS[kind](rng)
        if split_of(prompt) == split:
            yield Task(kind, prompt, answer)


def task_set(split: str, per_kind: int, seed: int = 0) -> list[Task]:
    """A fixed list of distinct tasks: `per_kind` of every kind, in a stable order."""
    out: list[Task] = []
    for kind in GENERATORS:
        seen: set[str] = set()
        for task in generate(split, seed, (kind,)):
            if task.prompt not in seen:
                seen.add(task.prompt)
                out.append(task)
            if len(seen) == per_kind:
                break
    return out
