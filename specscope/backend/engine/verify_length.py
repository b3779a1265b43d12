"""Cost-aware verify length: each round verifies only the prefix of its drafts whose expected gain pays for its
rows on this machine, and drafts only as many new tokens as the text's confidence pays for (DSpark's
confidence-scheduled verify, priced by the engine's cost curve). Any verify length is lossless: the verify accepts
exactly what a longer one would have accepted of that prefix, so greedy output stays `ar`'s token for token."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import mul

from specscope.backend.engine.cost_curve import CostCurve
from specscope.backend.engine.params import Param

VERIFY_PARAM = Param("verify", str, "cost",
                     help="cost: verify the draft prefix and draft the tokens that pay for their rows on this "
                          "machine's cost curve; fixed: the paper's fixed length (the reference)",
                     choices=("cost", "fixed"))


def expected_tokens(chances: Sequence[float]) -> list[float]:
    """Expected tokens of a round that verifies the first n drafts, for n = 0 .. len(chances): the bonus plus each
    draft's chance of being accepted (its whole path's)."""
    return [1.0, *(1.0 + s for s in accumulate(chances))]


def chain_tokens(probs: Sequence[float]) -> list[float]:
    """`expected_tokens` of a chain: each draft is accepted only with every draft before it."""
    return expected_tokens(list(accumulate(probs, mul)))


def best_count(chances: Sequence[float], round_ms: Callable[[int], float]) -> int:
    """How many drafts to verify, given each one's chance of being accepted (its path's), best first: the count
    that gives the most expected tokens (the bonus plus the chances) per ms of its round (`round_ms(n)`)."""
    gains = expected_tokens(chances)
    return max(range(len(gains)), key=lambda n: gains[n] / round_ms(n))


def best_prefix(probs: Sequence[float], round_ms: Callable[[int], float]) -> int:
    """How many leading drafts of a chain to verify (`probs`: each one's, given the one before it was accepted)."""
    return best_count(list(accumulate(probs, mul)), round_ms)


def best_draft_count(confidence: float, most: int, round_ms: Callable[[int], float]) -> int:
    """How many tokens to draft for the next round (0 .. most), when each is accepted with about `confidence`
    given the one before it was: the count that gives the most expected tokens per ms."""
    return best_prefix([confidence] * most, round_ms)


@dataclass(frozen=True)
class DraftPlan:
    """How a mode drafts on this curve: `drafts` tokens a drafting round, and whether a round drafts and verifies
    at once (`alternate` False) or drafting rounds and verify-only rounds take turns, each a shorter forward."""
    drafts: int
    alternate: bool = False


def draft_plan(confidence: float, most: int, round_rows: Callable[[int, int], int], curve: CostCurve) -> DraftPlan:
    """The plan with the most expected tokens per ms when each draft is accepted with about `confidence` given the
    one before it was; `round_rows(verified, drafted)`: the rows of a round that verifies and drafts that many.
    Drafting 0 is a plain decode step."""
    def tokens(drafts: int) -> float:
        return chain_tokens([confidence] * drafts)[-1]
    plans = [(tokens(m) / curve.at(round_rows(m, m)), DraftPlan(m)) for m in range(most + 1)]
    plans += [((1 + tokens(m)) / (curve.at(round_rows(0, m)) + curve.at(round_rows(m, 0))), DraftPlan(m, True))
              for m in range(1, most + 1)]
    return max(plans, key=lambda rated: rated[0])[1]
