"""Every registered mode as a test parameter, with chosen ones marked slow."""
from __future__ import annotations

from collections.abc import Collection

import pytest

from specscope.backend.engine.modes import mode_names

LONG_RAW_PROMPT = "Write a haiku about rivers."
"""Sent raw, the shipped tiny model runs on to any max_new_tokens: a run that is still going when a test stops it."""

HELDOUT_GEN = {"max_new_tokens": 16}
"""The held-out runs' generation parameters: the lossless checks (test_modes) and the mode files' checks on the
same runs (heldout_runs keeps them for the session) must ask for the same ones."""


def every_mode(slow: Collection[str] = ()) -> list:
    """mode_names() as parameters; those in `slow` carry pytest.mark.slow (a new mode is picked up, unmarked)."""
    unknown = set(slow) - set(mode_names())
    assert not unknown, f"no such modes: {sorted(unknown)}"
    return [pytest.param(m, marks=pytest.mark.slow) if m in slow else m for m in mode_names()]
