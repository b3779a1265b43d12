"""The one verdict on a lossless claim. A mode that declares `lossless_vs` claims that, greedy and at its
`lossless_params`, its tokens equal its reference mode's. Given a run and a run of that reference, `verdict` says
whether the claim may be checked at all (both done, the same weights in the same matmul precision on the same
forward backend, the same prompt
and length limit, both greedy, the run at the claim's parameters) and where their tokens first differ. The bench,
`specscope compare`, the GPU check, the UI and the tests all ask it."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Claim:
    """Greedy and at `params`, a mode's output equals `reference`'s token for token."""
    reference: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """What a verdict reads of one run. `weights` is the weights hash where recorded, else the model's name; None
    fields are unknown and never block a verdict."""
    mode: str
    output_ids: Sequence[int]
    params: Mapping[str, Any] = field(default_factory=dict)
    status: str = "done"
    weights: str | None = None
    matmul: str | None = None
    prompt_ids: Sequence[int] | None = None
    forward: str | None = None
    """The forward backend that ran it (run_start's `forward`: fused or torch), whose roundings differ."""


@dataclass(frozen=True)
class Verdict:
    reference: str
    first_difference: int | None
    """Index of the first token where the outputs differ (the shorter length where one is the other's prefix);
    None when identical."""
    reference_length: int
    blockers: tuple[str, ...]
    """Why the claim cannot be checked on this pair (e.g. 'T=0.8', 'different model'); empty when it can."""

    @property
    def identical(self) -> bool:
        return self.first_difference is None

    @property
    def checked(self) -> bool:
        return not self.blockers

    @property
    def holds(self) -> bool:
        """The claim was checkable and the tokens are identical."""
        return self.checked and self.identical

    def agreement(self) -> str:
        """'first 11 of 32 tokens as ar' (or 'all 32 tokens as ar')."""
        if self.identical:
            return f"all {self.reference_length} tokens as {self.reference}"
        return f"first {self.first_difference} of {self.reference_length} tokens as {self.reference}"


def claim_of(mode: str) -> Claim | None:
    """The registered mode's own claim, or None where it makes none."""
    from specscope.backend.engine.modes import get_mode
    declared = get_mode(mode)
    return Claim(declared.lossless_vs, dict(declared.lossless_params)) if declared.lossless_vs else None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return None if same == len(a) == len(b) else same


def temperature(params: Mapping[str, Any]) -> float:
    return float(params.get("temperature") or 0)


def model_difference(run: Outcome, reference: Outcome) -> str | None:
    """Why two runs could not compute the same numbers (other weights, another matmul precision or another
    forward backend), or None."""
    if run.weights and reference.weights and run.weights != reference.weights:
        return "different model"
    if run.matmul and reference.matmul and run.matmul != reference.matmul:
        return f"{reference.matmul} matmuls, not {run.matmul}"
    if run.forward and reference.forward and run.forward != reference.forward:
        return f"the {reference.forward} forward, not {run.forward}"
    return None


def unmet(run: Outcome, claim: Claim) -> list[str]:
    """The run's settings outside the claim (e.g. 'T=0.8', 'delta=0.1'); empty when the claim covers the run."""
    off = [f"T={temperature(run.params):g}"] if temperature(run.params) > 0 else []
    return off + [f"{k}={run.params.get(k)}" for k, v in claim.params.items() if run.params.get(k) != v]


def blockers(run: Outcome, reference: Outcome, claim: Claim | None) -> list[str]:
    """Every reason the pair cannot check the claim, the decisive ones first."""
    if claim is None:
        return [f"{run.mode} claims no equality"]
    reasons = [f"the run {run.status}"] if run.status != "done" else []
    if reference.status != "done":
        reasons.append(f"{reference.mode} {reference.status}")
    if reference.mode != claim.reference:
        reasons.append(f"{reference.mode} is not {claim.reference}")
    if why := model_difference(run, reference):
        reasons.append(why)
    if run.prompt_ids is not None and reference.prompt_ids is not None and \
            list(run.prompt_ids) != list(reference.prompt_ids):
        reasons.append("another prompt")
    if run.params.get("max_new_tokens") != reference.params.get("max_new_tokens"):
        reasons.append("another max_new_tokens")
    if temperature(reference.params) > 0:
        reasons.append(f"{reference.mode} sampled")
    return reasons + unmet(run, claim)


def verdict(run: Outcome, reference: Outcome, claim: Claim | None) -> Verdict:
    """The claim's verdict on this pair (see the module's docstring)."""
    return Verdict(reference.mode, first_difference(run.output_ids, reference.output_ids), len(reference.output_ids),
                   tuple(blockers(run, reference, claim)))
