"""The acceptance alarm of a finished run: "garbled drafts" when far fewer drafts were accepted than the model card's
held-out figure predicts for them, "loop" when the output ends by repeating itself. Pure, no torch.

The card's figures (train/heldout.py) are tokens per round of one draft layout: `block{B}` a [seed, M x (B-1)] block
(B - 1 drafts), `causal{K}` K causal MASK specs (K drafts), each leading matches + the bonus. A figure t at L drafts
gives the per-position rate a with a + a^2 + ... + a^L = t - 1, and a run's drafts of depths d_i are then expected to
have sum_i (a + ... + a^d_i) accepted.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specscope.backend.engine.spec_counts import DraftStep

GARBLED_SHARE = 0.25
"""A run is flagged when its accepted drafts are under this share of what the card's figure predicts..."""
GARBLED_MIN_DRAFTS = 8
"""...once it has made at least this many drafts."""
LOOP_SHARE = 0.5
"""A run is flagged when a repeating cycle covers at least this share of its output's tokens..."""
LOOP_MIN_CYCLES = 3
"""...the cycle repeats at least this many times..."""
LOOP_MAX_PERIOD = 32
"""...and is at most this many tokens long..."""
LOOP_MIN_TOKENS = 16
"""...in an output of at least this many tokens."""
LOOP_SOURCE = "specscope's own rule of thumb for degenerate output (no model card figure)"
FIGURE = re.compile(r"(block|causal)(\d+)_tokens_per_round")


@dataclass(frozen=True)
class HeldOut:
    """A held-out figure of the card: tokens per round at `drafts` drafts, and where the card says it."""
    tokens_per_round: float
    drafts: int
    source: str

    @property
    def rate(self) -> float:
        """The per-position acceptance rate under which L drafts have t - 1 accepted on average (bisection)."""
        target = self.tokens_per_round - 1
        low, high = 0.0, 1.0
        for _ in range(50):
            mid = (low + high) / 2
            low, high = (mid, high) if leading(mid, self.drafts) < target else (low, mid)
        return low

    def expected(self, steps: Sequence[DraftStep]) -> float:
        """Accepted drafts the figure predicts for these drafts."""
        rate = self.rate
        return sum(leading(rate, s.depth) for s in steps)


def leading(rate: float, depth: int) -> float:
    """Expected leading accepted drafts of `depth` drafts, each accepted with `rate` once those before it were."""
    return sum(rate ** i for i in range(1, depth + 1))


def read_card(path: Path | None) -> dict[str, Any] | None:
    """A model_card.json, None when there is none."""
    return None if path is None else json.loads(path.read_text())


def shipped_figures(card: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(section, entry name, figures) of every held-out entry the card names as the shipped weights'."""
    for section, body in card.items():
        heldout = body.get("heldout") if isinstance(body, Mapping) else None
        for name, figures in (heldout or {}).items():
            if "shipped" in name and isinstance(figures, Mapping):
                yield section, name, figures


def card_figure(card: Mapping[str, Any] | None, layout: str | None) -> HeldOut | None:
    """The lowest of the card's shipped held-out figures for the `layout` (`block` or `causal`) a mode drafts in,
    or None when the card (or the mode) has none."""
    found = []
    for section, name, figures in shipped_figures(card or {}):
        for key, value in figures.items():
            match = FIGURE.fullmatch(key)
            if match and match[1] == layout and isinstance(value, int | float):
                size = int(match[2])
                found.append(HeldOut(float(value), size - 1 if layout == "block" else size,
                                     f"model_card.json {section}.heldout[{name!r}]: {key} {value}"))
    return min(found, key=lambda f: f.tokens_per_round, default=None)


def garbled(steps: Sequence[DraftStep], figure: HeldOut | None) -> dict[str, Any]:
    """The garbled-drafts check: flagged, accepted, expected, the threshold and its source in words."""
    accepted = sum(s.accepted for s in steps)
    rule = (f"accepted drafts under {GARBLED_SHARE:.0%} of what the held-out figure predicts for the run's drafts, "
            f"once it made {GARBLED_MIN_DRAFTS} or more")
    if figure is None:
        return {"flagged": False, "accepted": accepted, "expected": None, "threshold": rule,
                "source": "none: the model card has no held-out figure for this mode's drafts"}
    expected = figure.expected(steps)
    flagged = len(steps) >= GARBLED_MIN_DRAFTS and accepted < GARBLED_SHARE * expected
    return {"flagged": flagged, "accepted": accepted, "expected": round(expected, 2), "threshold": rule,
            "source": f"{figure.source} ({figure.drafts} drafts: {figure.rate:.3f} accepted per position)"}


def cycle(ids: Sequence[int]) -> tuple[int, int]:
    """(period, span) of the output's longest repeating tail: the span is the tokens from the cycle's first
    occurrence to the end (the shortest period among the longest spans; (0, 0) for no output)."""
    best = (0, 0)
    for period in range(1, min(LOOP_MAX_PERIOD, len(ids) // 2) + 1):
        run = 0
        while run < len(ids) - period and ids[-1 - run] == ids[-1 - run - period]:
            run += 1
        if run + period > best[1] and run >= period:
            best = (period, run + period)
    return best


def loop(ids: Sequence[int]) -> dict[str, Any]:
    """The loop check: flagged, the cycle's period and span, the threshold and its source in words."""
    period, span = cycle(ids)
    flagged = (len(ids) >= LOOP_MIN_TOKENS and span >= LOOP_SHARE * len(ids)
               and span >= LOOP_MIN_CYCLES * period > 0)
    rule = (f"a cycle of at most {LOOP_MAX_PERIOD} tokens repeated {LOOP_MIN_CYCLES}+ times at the end, covering "
            f"{LOOP_SHARE:.0%} or more of an output of {LOOP_MIN_TOKENS}+ tokens")
    return {"flagged": flagged, "period": period or None, "span": span, "tokens": len(ids), "threshold": rule,
            "source": LOOP_SOURCE}


def alarm(steps: Sequence[DraftStep], output_ids: Sequence[int], figure: HeldOut | None) -> dict[str, Any]:
    """Both checks, and `flag`: "garbled drafts", else "loop", else None, with `why` in words."""
    drafts, repeats = garbled(steps, figure), loop(output_ids)
    if drafts["flagged"]:
        flag = "garbled drafts"
        why = (f"{drafts['accepted']} drafted tokens accepted where the model card's held-out figure predicts "
               f"{drafts['expected']}")
    elif repeats["flagged"]:
        flag = "loop"
        why = (f"the last {repeats['span']} of {repeats['tokens']} tokens repeat a {repeats['period']}-token "
               "cycle")
    else:
        flag, why = None, None
    return {"flag": flag, "why": why, "garbled_drafts": drafts, "loop": repeats}
