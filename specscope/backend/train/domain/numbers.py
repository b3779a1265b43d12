"""Number families: count, multiplication table, addition with column working, numbers in English words."""
from __future__ import annotations

import random

from specscope.backend.train.domain.family import Instance, TaskFamily

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
COLUMNS = ("ones", "tens", "hundreds", "thousands", "ten thousands")


def count(rng: random.Random) -> Instance:
    n = rng.randint(2, 40)
    lo = rng.randint(0, 20) if rng.random() < 0.4 else rng.randint(0, 1000 - n)
    a, b = lo, lo + n - 1
    down = rng.random() < 0.2
    if down:
        a, b = b, a
    seq = range(a, b - 1, -1) if down else range(a, b + 1)
    return Instance(f"count:{a}:{b}", "down" if down else "up", {"a": str(a), "b": str(b)},
                    " ".join(map(str, seq)))


def table(rng: random.Random) -> Instance:
    n, k = rng.randint(2, 19), rng.randint(2, 12)
    variant = "default" if k == 10 and rng.random() < 0.5 else "upto"
    lines = [f"{n} x {i} = {n * i}" for i in range(1, k + 1)]
    return Instance(f"table:{n}:{k}", variant, {"n": str(n), "k": str(k)}, "\n".join(lines))


def working(a: int, b: int) -> str:
    """Column-by-column addition, ones first, then the result."""
    da, db = str(a)[::-1], str(b)[::-1]
    lines, carry = [], 0
    for i in range(max(len(da), len(db))):
        x, y = int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0
        s = x + y + carry
        terms = f"{x} + {y}" + (f" + {carry}" if carry else "")
        carry = s // 10
        lines.append(f"{COLUMNS[i]}: {terms} = {s}, write {s % 10}" + (" carry 1" if carry else ""))
    if carry:
        lines.append(f"{COLUMNS[max(len(da), len(db))]}: carry 1, write 1")
    lines.append(f"So {a} + {b} = {a + b}")
    return "\n".join(lines)


def add(rng: random.Random) -> Instance:
    a, b = (rng.randint(0, 10 ** rng.randint(1, 4) - 1) for _ in range(2))
    return Instance(f"add:{a}:{b}", "add", {"a": str(a), "b": str(b)}, working(a, b))


def words(n: int) -> str:
    """0..9999 in English words, American style without "and": 1205 -> one thousand two hundred five."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("-" + ONES[n % 10] if n % 10 else "")
    if n < 1000:
        return ONES[n // 100] + " hundred" + (" " + words(n % 100) if n % 100 else "")
    return words(n // 1000) + " thousand" + (" " + words(n % 1000) if n % 1000 else "")


def spell(rng: random.Random) -> Instance:
    n = rng.randint(0, 10 ** rng.randint(1, 4) - 1)
    return Instance(f"spell:{n}", "spell", {"n": str(n)}, words(n))


_COUNT_ANY = (
    "[Count|List the numbers|List all the numbers|Write the numbers|Write out the numbers|Print the numbers"
    "|Give me the numbers|Output the numbers|Show the numbers|Enumerate the integers|List the integers] "
    "from {a} to {b}",
    "[Count|count] {a}..{b}",
    "[Count|Numbers|List] {a}-{b}",
    "[Count|List the numbers|Write the numbers] {a} through {b}",
    "What are the [numbers|integers|whole numbers] from {a} to {b}?",
    "[List|Write|Print] every [number|integer] [between {a} and {b}|from {a} to {b}][ inclusive|]",
    "Starting [at|from] {a}, [count|list the numbers] to {b}",
    "[Count|Go] from {a} to {b}[ one by one| in steps of one|]",
    "[Please write|Write down|Spell out the sequence] {a}, ..., {b}",
    "Sequence from {a} to {b}",
)
COUNT = TaskFamily("count", "count from a to b (up or down, a, b < 1000, up to 40 numbers)", count, {
    "up": _COUNT_ANY + (
        "Count up from {a} to {b}",
        "[List|Write|Print] the numbers from {a} up to {b}",
        "Count [up to|to] {b} [starting at|beginning with|from] {a}",
    ),
    "down": _COUNT_ANY + (
        "Count down from {a} to {b}",
        "Count backwards from {a} to {b}",
        "[List|Write|Print] the numbers from {a} down to {b}",
        "Count down to {b} [starting at|from] {a}",
    ),
})
_TABLE_K = (
    "[Give me|Write|Show|Print|List|Write out] the [multiplication|times] table [of|for] {n} up to {k}",
    "[Give me|Write|Show|Print] the {n} times table [up to|to|until] {k}",
    "{n} times table [up to|to|until] {k}",
    "Multiply {n} by [each number from |every number from |]1 to {k}",
    "[Multiplication|Times] table: {n}, 1 to {k}",
    "What is the [multiplication|times] table of {n} up to {k}?",
    "table of {n} [up to|to] {k}",
    "[Show|List] {n} x 1 [to|through] {n} x {k}",
    "[Write|Give me] the first {k} multiples of {n} as a table",
)
TABLE = TaskFamily("table", "the multiplication table of n (2-19) up to k (at most 12), one line per product", table, {
    "upto": _TABLE_K,
    "default": _TABLE_K + (
        "[Give me|Write|Show|Print|List] the [multiplication|times] table [of|for] {n}",
        "{n} times table",
        "What is the {n} times table?",
        "[Multiplication|Times] table [of|for] {n}",
    ),
})
ADD = TaskFamily("add", "addition of up to 4 + 4 digits, with the column-by-column working, then the result", add, {
    "add": (
        "What is {a} + {b}?",
        "What's {a} [+|plus] {b}?",
        "How much is {a} [+|plus] {b}?",
        "{a} + {b}",
        "{a} + {b} = ?",
        "{a} plus {b}",
        "Add {a} [and|to] {b}",
        "Add up {a} and {b}",
        "[Compute|Calculate|Work out|Find|Solve|Evaluate] {a} + {b}",
        "[Compute|Calculate|Work out|Find|Give me|What is] the sum of {a} and {b}",
        "What do you get when you add {a} and {b}?",
        "[sum|Sum] {a} {b}",
        "[Add|Calculate] {a} + {b} [column by column|showing your working|step by step|with the working|]",
    ),
})
SPELL = TaskFamily("spell", "a number from 0 to 9999 in English words (no \"and\")", spell, {
    "spell": (
        "[Write|Spell|Spell out|Express|Say|Give] {n} in [words|English words|English]",
        "[Spell|Spell out] {n}",
        "[Spell|Write out|Write] the number {n}[ in words|]",
        "How do you [write|spell|say] {n} in [words|English]?",
        "{n} in words",
        "[Convert|Turn|Change] {n} [to|into] [words|English words]",
        "What is {n} in words?",
        "number to words: {n}",
        "Words for {n}",
    ),
})
