"""Cost-aware verify length: a round verifies the draft prefix, and drafts the tokens, that pay for their rows on
the engine's cost curve. Where rows are free it drafts as the fixed length does; where each row costs a decode
step it falls back to decode steps; at every length the tokens are `ar`'s."""
import random

import pytest

from specscope.backend.engine.cost_curve import FLAT, CostCurve
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import REGISTRY, mode_names
from specscope.backend.engine.verify_length import best_draft_count, best_prefix, chain_tokens
from specscope.backend.tracing import RecordingTracer

LINEAR = CostCurve({1: 1.0, 16: 16.0})                      # every row costs a decode step: drafting never pays
AVX2 = CostCurve({1: 1.0, 2: 1.25, 4: 1.9, 8: 4.05, 16: 6.73})   # float32 on an AVX2 EPYC, as measured
COST_AWARE = [m for m in mode_names() if any(p.name == "verify" for p in REGISTRY[m].params)]
GEN = {"max_new_tokens": 24}


def test_expected_tokens_of_a_chain() -> None:
    assert chain_tokens([]) == [1.0]
    assert chain_tokens([0.5, 0.5]) == pytest.approx([1.0, 1.5, 1.75])
    assert chain_tokens([1.0, 0.0, 1.0]) == pytest.approx([1.0, 2.0, 2.0, 2.0])


def test_the_prefix_stops_where_its_rows_stop_paying() -> None:
    sure, unsure = [0.95, 0.9, 0.9, 0.2, 0.9], [0.1, 0.9, 0.9]
    assert best_prefix(sure, FLAT.at) == 5                        # free rows: every draft
    assert best_prefix(sure, lambda n: AVX2.at(1 + n)) == 3        # the unlikely fourth draft costs a row
    assert best_prefix(unsure, lambda n: AVX2.at(1 + n)) == 0      # a doubtful first draft: a decode step
    assert best_prefix(sure, lambda n: LINEAR.at(1 + n)) == 0      # rows at a decode step's price never pay
    assert best_draft_count(0.9, 4, lambda m: FLAT.at(1 + 2 * m)) == 4
    assert best_draft_count(0.3, 4, lambda m: AVX2.at(1 + 2 * m)) == 0


@pytest.fixture(scope="module")
def engines(loaded):
    return {name: Engine(loaded, num_slots=2048, check_invariants=True, cost_curve=curve)
            for name, curve in (("flat", FLAT), ("linear", LINEAR), ("avx2", AVX2))}


def rows_per_token(engine: Engine, prompts: list[str], mode: str, params: dict) -> tuple[list[list[int]], float]:
    """Each prompt's tokens, and the query rows the rounds' forwards computed per token."""
    rows = engine.rt.round_rows
    outputs = [engine.generate(p, mode, {**GEN, **params}).output_ids for p in prompts]
    return outputs, (engine.rt.round_rows - rows) / sum(len(o) for o in outputs)


@pytest.mark.parametrize("mode", COST_AWARE)
def test_cost_aware_rounds_follow_the_curve_and_keep_the_tokens(engines, heldout_prompts, mode) -> None:
    prompts = heldout_prompts[::6]
    ar = [engines["flat"].generate(p, "ar", GEN).output_ids for p in prompts]
    fixed, fixed_rows = rows_per_token(engines["flat"], prompts, mode, {"verify": "fixed"})
    free, free_rows = rows_per_token(engines["flat"], prompts, mode, {"verify": "cost"})
    dear, dear_rows = rows_per_token(engines["linear"], prompts, mode, {"verify": "cost"})
    avx2, avx2_rows = rows_per_token(engines["avx2"], prompts, mode, {"verify": "cost"})
    assert fixed == free == dear == avx2 == ar
    assert dear_rows <= 1.0       # rows at a decode step's price: decode steps (the prefill gives the first token)
    assert fixed_rows > 2 and free_rows > 1.5            # free rows: it drafts
    assert dear_rows < avx2_rows < fixed_rows, (dear_rows, avx2_rows, free_rows, fixed_rows)


@pytest.mark.parametrize("mode", COST_AWARE)
def test_a_round_records_its_verify_length_and_the_run_its_curve(engines, heldout_prompts, mode) -> None:
    tracer = RecordingTracer()
    engines["avx2"].generate(heldout_prompts[0], mode, GEN, tracer=tracer)
    start = tracer.events[0]
    assert start["params"]["verify"] == "cost" and start["cost_curve"] == AVX2.to_json()
    rounds = [e for e in tracer.events if e["type"] == "round" and e.get("extra")]
    assert rounds and all(e["extra"]["verify"] == "cost" for e in rounds)


def test_a_cost_curve_read_from_its_json_gives_the_same_json() -> None:
    """An engine given another's curve (run_start, /api/health) prices rows as that engine did: the JSON's ratios
    are those its own ms give, whatever the measured ms were."""
    draw = random.Random(7)
    for _ in range(500):
        curve = CostCurve({k: draw.uniform(0.5, 80.0) for k in (1, 2, 3, 4, 6, 8, 16)})
        assert CostCurve.from_json(curve.to_json()).to_json() == curve.to_json()
