"""List families: sort (numbers or words, ascending or descending), reverse and copy a list."""
from __future__ import annotations

import random

from specscope.backend.train.domain.family import Instance, TaskFamily, items_text

WORDS = tuple("""apple banana cherry grape lemon mango melon orange peach pear plum berry kiwi lime fig date
cat dog cow horse sheep goat mouse tiger lion bear wolf fox deer duck owl eagle fish shark whale frog snake
red blue green yellow black white brown pink purple gray gold silver
table chair door window house road river lake hill tree leaf rock sand cloud rain snow wind fire stone
book pen paper box cup plate spoon knife bottle lamp clock phone key ring coin bag hat shoe coat
sun moon star sky sea ship boat car bus train plane bike
bread milk cheese rice soup salt sugar tea coffee cake egg honey
king queen city town park bank shop school music dance game story song word name time day night
""".split())
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _items(rng: random.Random, kind: str, lo: int = 3, hi: int = 12) -> list[str]:
    n = rng.randint(lo, hi)
    if kind == "letters":
        return [rng.choice(LETTERS) for _ in range(n)]
    if kind == "words":
        return [rng.choice(WORDS) for _ in range(n)]
    top = rng.choice((9, 99, 99, 999))
    return [str(rng.randint(0, top)) for _ in range(n)]


def sort(rng: random.Random) -> Instance:
    kind = rng.choice(("numbers", "numbers", "words"))
    xs = _items(rng, kind)
    desc = rng.random() < 0.35
    key = int if kind == "numbers" else str
    out = sorted(xs, key=key, reverse=desc)
    variant = ("desc_" if desc else "asc_") + kind
    return Instance(f"sort:{variant}:{' '.join(xs)}", variant, {"items": items_text(xs, rng)}, " ".join(out))


def reverse(rng: random.Random) -> Instance:
    kind = rng.choice(("letters", "words", "numbers"))
    xs = _items(rng, kind)
    return Instance(f"reverse:{' '.join(xs)}", kind, {"items": items_text(xs, rng)}, " ".join(reversed(xs)))


def copy(rng: random.Random) -> Instance:
    xs = _items(rng, rng.choice(("letters", "words", "numbers")), 3, 10)
    return Instance(f"copy:{' '.join(xs)}", "copy", {"items": items_text(xs, rng)}, " ".join(xs))


def _sort_patterns(order: str, noun: str) -> tuple[str, ...]:
    if order == "asc":
        how = ("ascending order|increasing order|order|alphabetical order" if noun == "words"
               else "ascending order|increasing order|order|numerical order")
        span = "from A to Z" if noun == "words" else "from smallest to largest|from lowest to highest"
        extra: tuple[str, ...] = ("Sort {items}", "Sort: {items}", "sort {items}", "Order {items}",
                 f"Sort these {noun}: {{items}}", f"Sort the {noun} {{items}}")
    else:
        how = ("descending order|decreasing order|reverse alphabetical order" if noun == "words"
               else "descending order|decreasing order")
        span = "from Z to A" if noun == "words" else "from largest to smallest|from highest to lowest"
        extra = ("Sort {items} descending", "Sort descending: {items}",
                 f"Sort these {noun} in reverse: {{items}}")
    return extra + (
        f"[Put|Arrange|Sort|Order] {{items}} in [{how}]",
        f"[Sort|Arrange|Order|Put] {{items}} [{span}]",
        f"[Sort|Arrange|Order] [these|the|this list of] {noun} [{span}]: {{items}}",
        f"[Sort|Order] in [{how}]: {{items}}",
        f"Can you [sort|order] [these|the] {noun} [{span}]? {{items}}",
        f"[{how.split('|')[0].capitalize()}] [sort|order] of {{items}}",
        f"Here are some {noun}: {{items}}. [Sort|Order] them [{span}]",
    )


SORT = TaskFamily("sort", "sort 3-12 numbers or words, ascending, or descending when asked", sort, {
    f"{o}_{k}": _sort_patterns(o, k) for o in ("asc", "desc") for k in ("numbers", "words")})


def _reverse_patterns(noun: str) -> tuple[str, ...]:
    return (
        "Reverse {items}",
        "Reverse: {items}",
        "reverse {items}",
        "Reverse the [list|sequence|order of] {items}",
        f"Reverse the order of [these|the|this list of] {noun}: {{items}}",
        f"[Write|Print|List|Give me] [these|the] {noun} [backwards|in reverse order|in reverse]: {{items}}",
        "[Write|Print|List|Give me] {items} [backwards|in reverse order|in reverse]",
        "{items} [reversed|backwards|in reverse]",
        "[Flip|Invert] the order of {items}",
        f"Here are some {noun}: {{items}}. [Reverse them|Write them backwards|Put them in reverse order]",
        "What is {items} [reversed|backwards]?",
    )


REVERSE = TaskFamily("reverse", "reverse a list of letters, words or numbers", reverse, {
    k: _reverse_patterns(k) for k in ("letters", "words", "numbers")})
COPY = TaskFamily("copy", "repeat a list of letters, words or numbers", copy, {
    "copy": (
        "Copy: {items}",
        "[Copy|Repeat|Echo] {items}",
        "Repeat after me: {items}",
        "[Say|Write] {items} [back|again]",
        "Repeat [this|these|the list] [exactly|back|]: {items}",
    ),
})
