"""The one lossless verdict: when a claim may be checked at all, and where two outputs first differ."""
from specscope.backend.engine.lossless import Claim, Outcome, claim_of, first_difference, verdict
from specscope.backend.engine.modes import REGISTRY, mode_names

GREEDY = {"max_new_tokens": 4}
AR = Claim("ar")


def test_identical_outputs_hold_and_a_difference_is_placed() -> None:
    ref = Outcome("ar", [1, 2, 3, 4], GREEDY)
    assert verdict(Outcome("isd", [1, 2, 3, 4], GREEDY), ref, AR).holds
    wrong = verdict(Outcome("isd", [1, 2, 9, 4], GREEDY), ref, AR)
    assert wrong.checked and not wrong.holds and wrong.first_difference == 2
    assert wrong.agreement() == "first 2 of 4 tokens as ar"
    assert first_difference([1, 2], [1, 2, 3]) == 2 and first_difference([], []) is None


def test_every_reason_to_withhold_a_verdict_is_named() -> None:
    ref = Outcome("ar", [1, 2], GREEDY, weights="sha:a", matmul="float32", prompt_ids=[5], forward="fused")
    cases = {
        "T=0.8": Outcome("isd", [1, 2], {**GREEDY, "temperature": 0.8}, weights="sha:a", prompt_ids=[5]),
        "different model": Outcome("isd", [1, 2], GREEDY, weights="sha:b"),
        "float32 matmuls, not bf16": Outcome("isd", [1, 2], GREEDY, matmul="bf16"),
        "the fused forward, not torch": Outcome("isd", [1, 2], GREEDY, forward="torch"),
        "another prompt": Outcome("isd", [1, 2], GREEDY, prompt_ids=[6]),
        "another max_new_tokens": Outcome("isd", [1, 2], {"max_new_tokens": 8}),
        "the run cancelled": Outcome("isd", [1, 2], GREEDY, status="cancelled"),
    }
    for reason, run in cases.items():
        found = verdict(run, ref, AR)
        assert reason in found.blockers and not found.holds, (reason, found.blockers)
    assert verdict(Outcome("isd", [1, 2], GREEDY), ref, None).blockers == ("isd claims no equality",)
    sampled = Outcome("ar", [1, 2], {**GREEDY, "temperature": 1.0})
    assert "ar sampled" in verdict(Outcome("isd", [1, 2], GREEDY), sampled, AR).blockers


def test_a_claim_with_parameters_covers_only_runs_at_them() -> None:
    claim = Claim("spiffy", {"delta": 0.0, "ffn_gate": "strict"})
    ref = Outcome("spiffy", [1], GREEDY)
    assert verdict(Outcome("specfold", [1], {**GREEDY, "delta": 0.0, "ffn_gate": "strict"}), ref, claim).holds
    off = verdict(Outcome("specfold", [1], {**GREEDY, "delta": 0.1, "ffn_gate": "strict"}), ref, claim)
    assert off.blockers == ("delta=0.1",) and off.identical


def test_claims_come_from_the_registry() -> None:
    for name in mode_names():   # loads every mode: REGISTRY alone may not be filled yet
        cls, claim = REGISTRY[name], claim_of(name)
        assert (claim is None) == (cls.lossless_vs is None)
        if claim is not None:
            assert claim.reference in REGISTRY and dict(claim.params) == cls.lossless_params
