"""The accounting and rules the references use: refresh counted per block, nothing accepted after EOS, T = 1
block confidence, I-DLM's αq > 0 rule and argmax drafts."""
import pytest
import torch

from specscope.backend.engine.blocks import BlockMode, guesses
from specscope.backend.engine.modes import REGISTRY, mode_names
from specscope.backend.engine.modes.isd import ISD, ISDState
from specscope.backend.engine.request import Request
from specscope.backend.engine.scores import Scores
from specscope.backend.tracing import RecordingTracer
from specscope.kernels.isd_verify import isd_verify_torch

BLOCK_MODES = [m for m in mode_names() if issubclass(REGISTRY[m], BlockMode)]
"""Every mode of the block loop (backend/engine/blocks.py), as the registry has them."""


def traced(engine, prompt, mode, params):
    tracer = RecordingTracer()
    res = engine.generate(prompt, mode, params, tracer=tracer)
    return res, [e for e in tracer.events if e["type"] == "round"]


@pytest.mark.parametrize("mode", BLOCK_MODES)
def test_every_block_started_is_refreshed_and_counted(engine, heldout_prompts, mode):
    """Nemotron's generate refreshes every block it starts, the last one too (EOS or max_new_tokens)."""
    for prompt, limit in zip(heldout_prompts[::7], (8, 32, 40, 64, 13), strict=False):
        res, rounds = traced(engine, prompt, mode, {"max_new_tokens": limit})
        blocks = {r["block_start"] for r in rounds[1:]}
        refreshes = [p for r in rounds for p in r["phases"] if p["kind"] == "refresh"]
        assert len(refreshes) == len(blocks), (prompt, limit)
        assert rounds[-1]["phases"][-1]["kind"] == "refresh"
        assert res.metrics["nfe"] == sum(r["nfe"] for r in rounds)


@pytest.mark.parametrize("mode", mode_names())
def test_nothing_after_eos_is_accepted_or_shown(engine, heldout_prompts, mode):
    """A round counts no position after an EOS it shows, its view stops at the first accepted EOS, and (outside
    the block modes, whose counts are made when a position is unmasked, before a later EOS may precede it)
    the accepted tokens of a run are exactly its committed ones."""
    eos = engine.rt.eos_id
    for prompt in heldout_prompts[::9]:
        res, rounds = traced(engine, prompt, mode, {"max_new_tokens": 40})
        later = rounds[1:]
        for r in rounds:
            shown = [i for i, (t, s) in enumerate(zip(r["tokens"], r["states"], strict=True))
                     if t == eos and s in ("accepted", "committed", "bonus")]
            end = shown[0] if shown else len(r["tokens"])
            counted = sum(s in ("accepted", "bonus") for s in r["states"][:end + 1])
            assert r["accepted_len"] <= counted, (mode, r["round"])
            if eos in r["committed"]:
                assert shown and shown[0] == len(r["tokens"]) - 1, (mode, r["round"])
        if mode not in BLOCK_MODES:
            assert sum(r["accepted_len"] for r in later) == sum(len(r["committed"]) for r in later), prompt
        if res.metrics["accept_len_mean"] is not None and mode not in BLOCK_MODES:
            assert res.metrics["accept_len_mean"] * len(later) <= len(res.output_ids) + 1


def test_block_confidence_is_the_t1_probability_at_any_temperature(engine):
    req = Request("t", [1, 2, 3], None, {"temperature": 2.0, "seed": 3, "max_new_tokens": 4}, None)
    logits = torch.randn(6, engine.rt.model.cfg.vocab_size) * 4
    ids, conf = guesses(Scores(logits, req, engine.rt.mask))
    plain = logits[:-1].clone()
    plain[:, engine.rt.mask] = float("-inf")
    want = torch.softmax(plain, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(conf[1:]), want)


def test_isd_rejects_a_spec_whose_scaled_proposal_is_zero():
    """where(αq > 0, p/q, 0): α = 0 rejects every spec at T > 0, whatever p is."""
    v = 11
    g = torch.Generator().manual_seed(0)
    clean, draft = torch.randn(3, v, generator=g), torch.randn(3, v, generator=g)
    clean[:, v - 1] = float("-inf")   # v - 1 is the MASK id: a spec is never MASK (p = 0 would reject it anyway)
    specs = clean.argmax(-1)
    noise = torch.zeros(3), torch.zeros(3, v)
    assert isd_verify_torch(clean, draft, specs, 0.8, 0.0, v - 1, *noise).accepted == 0
    assert isd_verify_torch(clean, draft, specs, 0.8, 1.0, v - 1, torch.zeros(3), torch.zeros(3, v)).accepted == 3


def test_isd_argmax_drafts_take_the_argmax_of_q_at_any_temperature(engine):
    req = Request("t", [1, 2], None, {"temperature": 1.5, "seed": 0, "max_new_tokens": 4, "draft": "argmax",
                                      "sampler": True}, None)
    st = ISDState()
    logits = torch.randn(3, engine.rt.model.cfg.vocab_size)
    logits[:, engine.rt.mask] = 100.0                      # MASK is never drafted
    masks = Scores(logits, req, engine.rt.mask)
    ISD()._draft(req, engine.rt, st, masks, clean=2)    # the tiny model ships no sampler head: rows alone
    without_mask = logits.clone()
    without_mask[:, engine.rt.mask] = float("-inf")
    assert st.specs == without_mask.argmax(-1).tolist()
    assert st.draft is masks


def test_unshifted_logits_are_realigned_by_the_runtime(loaded):
    """A model whose `block` logits predict their own position (Nemotron's diffusion head) reaches the modes
    in the shifted convention: row j holds the prediction for position j + 1."""
    from dataclasses import replace

    from specscope.backend.engine.engine import Engine

    shifted = Engine(loaded, num_slots=256)
    unshifted = Engine(replace(loaded, logits_shifted={**loaded.logits_shifted, "block": False}), num_slots=256)
    req = Request("t", [1, 2, 3], None, {"max_new_tokens": 4}, None)
    ids = torch.tensor([[5, loaded.mask_token_id, loaded.mask_token_id, 9]])
    raw = shifted.rt.forward([req], ids, [0], "block", kind="draft")
    got = unshifted.rt.forward([req], ids, [0], "block", kind="draft")
    torch.testing.assert_close(got[:, :-1], raw[:, 1:])
    torch.testing.assert_close(unshifted.rt.forward([req], ids, [0], "causal", kind="verify"),
                               shifted.rt.forward([req], ids, [0], "causal", kind="verify"))
