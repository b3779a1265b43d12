"""Compositional phrasings: `[a|b]` alternations expand to every wording; a hash holds some wordings out.

A pattern such as "[Count|List the numbers] from {a} [to|through] {b}" expands to four wordings. Each
wording (with its value slots still open) belongs to the train or held-out phrasing split by a stable hash of
its text, so held-out wordings are never trained, whatever the values. Decorations (a polite lead-in,
casing, end punctuation) are drawn per prompt and never decide a split.
"""
from __future__ import annotations

import hashlib
import itertools
import random
import re

PHRASING_SPLITS = ("train", "heldout")
HELDOUT_PHRASING_PERCENT = 20
_ALT = re.compile(r"\[([^\[\]]*)\]")
LEADS = ("", "", "", "Please ", "Can you ", "Could you ", "Could you please ", "I need you to ", "Now ",
         "Hey, ", "Kindly ", "Help me ")
ENDS = ("", "", ".", "!")
IMPERATIVES = set("""count list write print give output show enumerate go spell add compute calculate work find solve
evaluate sort put arrange order reverse flip invert copy repeat echo say turn convert format encode make build create
serialize define implement code multiply express change""".split())


def expand(pattern: str) -> list[str]:
    """Every wording of a pattern, its `[a|b|]` alternations taken in all combinations, spaces normalised."""
    parts = _ALT.split(pattern)
    literal, choices = parts[0::2], [p.split("|") for p in parts[1::2]]
    out = []
    for combo in itertools.product(*choices):
        text = literal[0] + "".join(c + lit for c, lit in zip(combo, literal[1:], strict=True))
        out.append(" ".join(text.split()).replace(" ,", ",").replace(" ?", "?").replace(" :", ":"))
    return out


def phrasing_split(wording: str) -> str:
    """The phrasing split of one wording: `heldout` for HELDOUT_PHRASING_PERCENT % of wordings, by hash."""
    h = int.from_bytes(hashlib.sha256(f"phrasing:{wording}".encode()).digest()[:4], "little") % 100
    return "heldout" if h < HELDOUT_PHRASING_PERCENT else "train"


def wordings(patterns: tuple[str, ...], split: str) -> list[str]:
    """The distinct wordings of `patterns` that fall in a phrasing split, in a stable order."""
    seen = dict.fromkeys(w for p in patterns for w in expand(p))
    return [w for w in seen if phrasing_split(w) == split]


def decorate(text: str, rng: random.Random) -> str:
    """Surface variation of a filled wording: a polite lead-in, casing and end punctuation."""
    question = text.endswith("?")
    imperative = text.split(" ", 1)[0].lower() in IMPERATIVES
    lead = rng.choice(LEADS) if imperative and not question else ""
    if lead:
        text = lead + text[0].lower() + text[1:]
        if lead.startswith(("Can", "Could")):
            return text + rng.choice(("?", "?", ""))
    elif rng.random() < 0.3:
        text = text[0].lower() + text[1:]
    if question:
        return text if rng.random() < 0.8 else text[:-1]
    return text + rng.choice(ENDS)
