"""Code families: JSON from key=value pairs, and a short Python function in one canonical style."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

from specscope.backend.train.domain.family import Instance, TaskFamily
from specscope.backend.train.domain.lists import WORDS

KEYS = tuple("""name age city id count x y z color size price total score level year month day user email
status type kind value width height length weight title label code port host mode rank speed""".split())
NAMES = tuple("""total biggest smallest f g h solve helper compute my_func process calc func answer transform
apply run get_value result fn work check handle convert make do_it evaluate measure tally pick""".split())


def _value(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        return str(rng.randint(0, 10 ** rng.randint(1, 4) - 1))
    if r < 0.5:
        return str(-rng.randint(1, 999))
    return rng.choice(WORDS)


def as_json(pairs: list[tuple[str, str]]) -> str:
    """Pairs as a JSON object: integers unquoted, everything else a string, in the given order."""
    return json.dumps({k: int(v) if v.lstrip("-").isdigit() else v for k, v in pairs})


def json_object(rng: random.Random) -> Instance:
    keys = rng.sample(KEYS, rng.randint(2, 5))
    pairs = [(k, _value(rng)) for k in keys]
    eq, sep = rng.choice(("=", "=", " = ")), rng.choice((", ", ", ", " ", "; ", ","))
    text = sep.join(f"{k}{eq}{v}" for k, v in pairs)
    return Instance("json:" + " ".join(f"{k}={v}" for k, v in pairs), "json", {"pairs": text}, as_json(pairs))


@dataclass(frozen=True)
class Op:
    name: str
    args: str
    body: str
    descriptions: tuple[str, ...]   # noun phrases: "returns <description>"


OPS = (
    Op("sum_list", "xs", "return sum(xs)",
       ("the sum of a list", "the sum of a list of numbers", "the total of a list of numbers")),
    Op("max_of", "xs", "return max(xs)",
       ("the largest number in a list", "the maximum of a list", "the biggest element of a list")),
    Op("min_of", "xs", "return min(xs)",
       ("the smallest number in a list", "the minimum of a list", "the smallest element of a list")),
    Op("length", "xs", "return len(xs)",
       ("the length of a list", "the number of items in a list", "how many elements a list has")),
    Op("count_of", "xs, x", "return xs.count(x)",
       ("how many times x appears in a list", "the number of occurrences of x in a list", "the count of x in a list")),
    Op("reverse_list", "xs", "return xs[::-1]",
       ("a list reversed", "the reverse of a list", "a list in reverse order")),
    Op("evens", "xs", "return [x for x in xs if x % 2 == 0]",
       ("the even numbers of a list", "only the even numbers from a list", "a list filtered to its even numbers")),
    Op("odds", "xs", "return [x for x in xs if x % 2 == 1]",
       ("the odd numbers of a list", "only the odd numbers from a list", "a list filtered to its odd numbers")),
    Op("squares", "xs", "return [x * x for x in xs]",
       ("the squares of a list of numbers", "each number of a list squared", "a list of the squares of numbers")),
    Op("doubled", "xs", "return [2 * x for x in xs]",
       ("each number of a list doubled", "a list with every number doubled", "twice each number of a list")),
    Op("average", "xs", "return sum(xs) / len(xs)",
       ("the average of a list of numbers", "the mean of a list", "the average value of a list")),
    Op("product", "xs", "result = 1\n    for x in xs:\n        result *= x\n    return result",
       ("the product of a list of numbers", "all numbers of a list multiplied together", "the product of a list")),
    Op("first", "xs", "return xs[0]", ("the first element of a list", "the first item of a list")),
    Op("last", "xs", "return xs[-1]", ("the last element of a list", "the last item of a list")),
    Op("is_empty", "xs", "return len(xs) == 0", ("whether a list is empty", "True if a list is empty")),
    Op("sorted_list", "xs", "return sorted(xs)", ("a sorted copy of a list", "a list sorted in ascending order")),
    Op("to_upper", "s", "return s.upper()",
       ("a string in upper case", "a string converted to uppercase", "the uppercase version of a string")),
    Op("to_lower", "s", "return s.lower()",
       ("a string in lower case", "a string converted to lowercase", "the lowercase version of a string")),
    Op("strip_spaces", "s", "return s.strip()",
       ("a string without leading and trailing whitespace", "a string with the surrounding spaces removed")),
    Op("reverse_string", "s", "return s[::-1]", ("a string reversed", "the reverse of a string", "a string backwards")),
    Op("word_count", "s", "return len(s.split())", ("the number of words in a string", "how many words a string has")),
)


def pyfunc(rng: random.Random) -> Instance:
    op = rng.choice(OPS)
    given = rng.choice(NAMES) if rng.random() < 0.4 else ""
    answer = f"def {given or op.name}({op.args}):\n    {op.body}"
    return Instance(f"pyfunc:{op.name}:{given}", "named" if given else "plain",
                    {"what": rng.choice(op.descriptions), "name": given}, answer)


JSON = TaskFamily("json", "a JSON object from 2-5 key=value pairs, numbers unquoted", json_object, {
    "json": (
        "[Turn|Convert|Format|Write|Encode|Put] {pairs} [into|as|to] [JSON|a JSON object|json]",
        "[JSON|json|Json] [for|of|from] {pairs}",
        "json {pairs}",
        "[Make|Build|Create|Give me] a JSON object [from|with|for] {pairs}",
        "[Format|Convert|Serialize] as JSON: {pairs}",
        "What is {pairs} as JSON?",
        "Here are some key=value pairs: {pairs}. [Turn|Convert] them into JSON",
        "key=value to JSON: {pairs}",
    ),
})
_FUNC = (
    "[Write|Define|Create|Implement|Give me|Code] a [Python |]function that returns {what}",
    "[Write|Define|Create|Implement] a [Python |]function [to compute|to get|for|computing|returning] {what}",
    "[Python|python] function [for|returning|that returns] {what}",
    "[Python|python]: {what}",
    "How do I write a [Python |]function that returns {what}?",
    "I need a [Python |]function that returns {what}",
)
_NAMED = (
    "[Write|Define|Create|Implement] a [Python |]function [named|called] {name} that returns {what}",
    "[Write|Define|Create|Implement] [a Python function|a function|the function] {name} "
    "[that returns|returning|to compute] {what}",
    "def {name}: [return |]{what}",
    "{name}(): a [Python |]function [that returns|returning] {what}",
    "[Python|python] function {name} [for|returning|that returns] {what}",
) + tuple(p + " [named|called] {name}" for p in _FUNC[:3])
PYFUNC = TaskFamily("pyfunc",
                    "a short Python function (list sum/max/min/length/count/filters..., string case/strip...)",
                    pyfunc, {"plain": _FUNC, "named": _NAMED})
