"""ISD (I-DLM Block-N): lossless vs ar, per-case KV trim counts, the p/q verification rule."""
import pytest
import torch

from specscope.backend.engine.modes.isd import pq_table
from specscope.backend.engine.request import Request
from specscope.backend.engine.scores import Scores, verify_specs
from specscope.backend.tracing import RecordingTracer, kv_events


@pytest.mark.parametrize("n", [2, 4, 5])
def test_trim_counts_follow_the_case_table(engine, heldout_prompts, n):
    """V frees N-1 mask slots; R at spec i frees (N-1-i) rejected + (N-1) mask; C frees 2N-2 mask."""
    seen = set()
    for prompt in heldout_prompts[::3]:
        tracer = RecordingTracer()
        engine.generate(prompt, "isd", {"max_new_tokens": 40, "n": n, "verify": "fixed"}, tracer=tracer)
        kv = [op for e in tracer.events for op in kv_events(e)]
        for r in (e for e in tracer.events if e["type"] == "round" and e["case"]):
            frees = [e for e in kv if e["op"] == "free" and e["round"] == r["round"]]
            count = {reason: sum(len(e["slots"]) for e in frees if e["reason"] == reason)
                     for reason in ("mask", "rejected")}
            allocs = sum(len(e["slots"]) for e in kv if e["op"] == "alloc" and e["round"] == r["round"])
            commits = sum(len(e["slots"]) for e in kv if e["op"] == "commit" and e["round"] == r["round"])
            assert allocs == 2 * n - 1
            if r["case"] == "V":
                assert count == {"mask": n - 1, "rejected": 0} and commits == n
            elif r["case"] == "C":
                assert count == {"mask": 2 * n - 2, "rejected": 0} and commits == 1
            else:
                i = r["extra"]["rejected_at"]
                assert count == {"mask": n - 1, "rejected": n - 1 - i} and commits == 1 + i
            assert r["extra"]["trim"] == count["mask"] + count["rejected"]
            assert allocs - commits == r["extra"]["trim"]
            if r["case"] != "C":     # the p/q table of every verified spec (built only for a listening tracer)
                tested = [x for x in r["pq"] if x["tested"]]
                assert len(r["pq"]) == n - 1 and len(tested) == min(n - 1, r["extra"].get("rejected_at", n) + 1)
                assert all(0 <= x["p"] <= 1 and 0 <= x["q"] <= 1 for x in tested)
            seen.add(r["case"])
    assert {"C", "R"} <= seen


def _req(temperature: float, seed: int = 0) -> Request:
    return Request("r", [1], None, {"temperature": temperature, "seed": seed}, None)


def _verify(specs, logits, draft_logits, req, alpha):
    """verify_specs on the rows of one request whose MASK id is 0."""
    return verify_specs(Scores(logits, req, 0), Scores(draft_logits, req, 0), specs, alpha)


def test_pq_rule_accepts_when_p_matches_q_and_corrects_from_the_residual():
    vocab = 6
    specs = [2, 3]
    logits = torch.full((2, vocab), -1e4)
    logits[0, 2] = 0.0                       # p puts all mass on token 2 at spec 0
    logits[1, 4] = 0.0                       # ... and on token 4 at spec 1
    q = torch.zeros(2, vocab)
    q[0, 2] = 1.0                            # q = p at spec 0: always accept
    q[1, 3], q[1, 4] = 0.5, 0.5              # spec 1 = 3 has p = 0: always reject
    draft_logits = q.log().clamp_min(-1e4)
    req = _req(1.0)
    v, uniforms = _verify(specs, logits, draft_logits, req, alpha=1.0)
    pq = pq_table(specs, v, 1.0, 1.0, uniforms)
    assert v.accepted == 1 and [x["accepted"] for x in pq] == [True, False]
    assert v.correction == 4                 # the only token where p - q > 0
    assert pq[0]["u"] == uniforms[0] and pq[0]["accept_prob"] == 1.0
    nothing, uniforms = _verify(specs, logits, draft_logits, req, alpha=0.0)
    assert nothing.accepted == 0               # where(alpha*q > 0, p/q, 0): a zero scaled proposal rejects
    pq = pq_table(specs, nothing, 1.0, 0.0, uniforms)
    assert pq[0]["accept_prob"] == 0.0 and pq[1]["tested"] is False


def test_greedy_verify_is_argmax_equality():
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0], [0.0, 5.0, 1.0, 1.0]])
    v, _ = _verify([2, 3], logits, torch.zeros(2, 4), _req(0.0), alpha=1.0)
    assert v.accepted == 1 and v.correction == 1


def test_correction_falls_back_to_p_when_residual_is_empty():
    """p == q everywhere and the spec is rejected (u = 1 >= p/q): the correction is drawn from p."""
    from specscope.kernels.isd_verify import isd_verify_torch, isd_verify_triton
    logits = torch.tensor([[-1e4, 0.0, 0.0, 0.0]])      # token 0 is the MASK (banned)
    gumbel = torch.tensor([[9.0, 0.1, 2.0, 0.3]])
    for op in (isd_verify_torch, isd_verify_triton):
        v = op(logits, logits.clone(), torch.tensor([3]), 1.0, 1.0, 0, torch.ones(1) * 0.999, gumbel)
        assert (v.accepted, v.correction) == (1, None)    # p/q = 1: accepted whatever u is
        v = op(logits, logits.clone(), torch.tensor([3]), 1.0, 2.0, 0, torch.ones(1) * 0.9, gumbel)
        assert (v.accepted, v.correction) == (0, 2)       # alpha 2 rejects; argmax of log p + g over allowed


def test_sampled_isd_is_seeded_and_frees_kv(engine, heldout_prompts):
    p = {"max_new_tokens": 24, "temperature": 0.9, "seed": 5, "n": 4}
    a = engine.generate(heldout_prompts[2], "isd", p)
    b = engine.generate(heldout_prompts[2], "isd", p)
    assert a.output_ids == b.output_ids and a.metrics["kv_leaked"] == 0
