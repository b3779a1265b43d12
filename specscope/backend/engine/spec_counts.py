"""A run's speculative-decoding counts under vLLM's per-request names, from its drafts. Pure, no torch.

A draft is one verify that checked at least one drafted token: a round of a token-drafting mode, or a verify
forward of drafted block states in a branching one (each mode says which, `RoundResult.draft`).
- `num_drafts`: the drafts;
- `num_draft_tokens`: the drafted tokens (states) they checked;
- `num_accepted_tokens`: those accepted, the bonus / correction token never counted; a draft cut by
  max_new_tokens or after an EOS is not accepted;
- `num_accepted_tokens_per_pos[i]`: how many drafts had their draft at position i accepted (as long as the deepest
  draft: it never increases and sums to num_accepted_tokens).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

SPEC_KEYS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
"""The run_end metrics that hold the counts (vLLM's names)."""


@dataclass
class DraftStep:
    """One draft: the drafted tokens a verify checked, the positions they span (a chain's length, a tree's depth),
    and how many leading positions were accepted."""
    tokens: int
    depth: int
    accepted: int = 0

    def kept(self, emitted: int) -> DraftStep:
        """The draft as the run keeps it when only `emitted` tokens of its round were emitted."""
        return replace(self, accepted=min(self.accepted, emitted))


def spec_counts(steps: Sequence[DraftStep]) -> dict[str, Any]:
    """The SPEC_KEYS counts of a run's drafts (all 0, the per-position list empty, for a run that drafted nothing)."""
    per_pos = [0] * max((s.depth for s in steps), default=0)
    for s in steps:
        for i in range(s.accepted):
            per_pos[i] += 1
    return {"num_drafts": len(steps), "num_draft_tokens": sum(s.tokens for s in steps),
            "num_accepted_tokens": sum(s.accepted for s in steps), "num_accepted_tokens_per_pos": per_pos}


def stored_counts(metrics: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The counts a run's metrics hold, None for a run whose metrics predate them (or that has none)."""
    if not metrics or any(key not in metrics for key in SPEC_KEYS):
        return None
    return {key: metrics[key] for key in SPEC_KEYS}
