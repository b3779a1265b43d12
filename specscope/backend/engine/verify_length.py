"""Cost-aware verify length: each round verifies only the prefix of its drafts whose expected gain pays for its
rows on this machine, and drafts only as many new tokens as the text's confidence pays for (DSpark's
confidence-scheduled verify, priced by the engine's cost curve). Any verify length is lossless: the verify accepts
exactly what a longer one would have accepted of that prefix, so greedy output stays `ar`'s token for token."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate
from operator import mul

from specscope.backend.engine.params import Param

VERIFY_PARAM = Param("verify", str, "cost",
                     help="cost: verify the draft prefix and draft the tokens that pay for their rows on this "
                          "machine's cost curve; fixed: the paper's fixed length (the reference)",
                     choices=("cost", "fixed"))


def chain_tokens(probs: Sequence[float]) -> list[float]:
    """Expected tokens of a round that verifies the first L drafts of a chain, for L = 0 .. len(probs): the bonus
    plus each draft weighted by the chance that it and every draft before it are accepted."""
    return [1.0, *(1.0 + s for s in accumulate(accumulate(probs, mul)))]


def best_prefix(probs: Sequence[float], round_ms: Callable[[int], float]) -> int:
    """How many leading drafts to verify: the L that gives the most expected tokens per ms of its round."""
    gains = chain_tokens(probs)
    return max(range(len(gains)), key=lambda n: gains[n] / round_ms(n))


def best_draft_count(confidence: float, most: int, round_ms: Callable[[int], float]) -> int:
    """How many tokens to draft for the next round (0 .. most), when each is accepted with about `confidence`
    given the one before it was: the count that gives the most expected tokens per ms."""
    return best_prefix([confidence] * most, round_ms)
