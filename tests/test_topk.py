"""params.trace_topk: each round's cells carry the top-k of every forward that predicted their position, with
entropy and margin; the tokens are the same as without it, the figures equal an independent full forward, and with
trace_topk = 0 no round carries anything."""
from __future__ import annotations

import math

import pytest
import torch

from specscope.backend.engine.modes import mode_names
from specscope.backend.tracing import RecordingTracer

PROMPT = "Reverse: q w e r t y u i"
K = 3


def rounds_of(engine, mode: str, **params) -> tuple[list[int], list[dict]]:
    tracer = RecordingTracer()
    out = engine.generate(PROMPT, mode, {"max_new_tokens": 12, **params}, tracer=tracer)
    return out.output_ids, [e for e in tracer.events if e["type"] == "round"]


@pytest.mark.parametrize("mode", mode_names())
def test_topk_is_recorded_per_cell_and_changes_nothing(engine, mode) -> None:
    plain_ids, plain = rounds_of(engine, mode)
    ids, rounds = rounds_of(engine, mode, trace_topk=K)
    assert ids == plain_ids and [r["tokens"] for r in rounds] == [r["tokens"] for r in plain]
    assert all("topk" not in r for r in plain)                     # off: nothing recorded
    recorded = 0
    for r in rounds:
        assert len(r["topk"]) == len(r["tokens"])                  # one entry list (or None) per cell
        for cell in r["topk"]:
            for entry in cell or []:
                probs = [p for _, p in entry["top"]]
                assert len(entry["top"]) == K and probs == sorted(probs, reverse=True) and 0 < probs[0] <= 1
                assert entry["kind"] in ("prefill", "draft", "denoise", "verify", "decode", "refresh")
                assert math.isclose(entry["margin"], probs[0] - probs[1], abs_tol=1e-6)
                assert 0 <= entry["entropy"] <= math.log(engine.rt.model.cfg.vocab_size) + 1e-6
                assert engine.rt.mask_id not in [t for t, _ in entry["top"]]
                recorded += 1
    assert recorded, "no cell got its alternatives"
    assert engine.rt.pool.used == 0


def test_ar_topk_equals_an_independent_full_forward(engine, loaded) -> None:
    """Greedy ar: each emitted token is its decode entry's top-1, and the recorded probabilities are the softmax of
    one full causal forward over prompt + output (no KV cache, MASK excluded)."""
    ids, rounds = rounds_of(engine, "ar", trace_topk=K)
    prompt = engine.encode_prompt(PROMPT, raw=False)
    tokens = torch.tensor([prompt + ids])
    with torch.inference_mode():
        logits = loaded.model(tokens, torch.arange(tokens.shape[1])[None], attn="causal")[0].float()
        logits[:, engine.rt.mask_id] = float("-inf")
        probs = torch.softmax(logits, -1)
    checked = 0
    for r in rounds:
        for i, cell in enumerate(r["topk"]):
            pos = r["block_start"] + i
            if not cell or r["states"][i] not in ("accepted", "bonus", "committed") or pos >= tokens.shape[1]:
                continue
            top = cell[-1]["top"]
            assert top[0][0] == tokens[0, pos].item()            # greedy: the emitted token is the top-1
            want = probs[pos - 1].topk(K)
            assert [t for t, _ in top] == want.indices.tolist()
            torch.testing.assert_close(torch.tensor([p for _, p in top]), want.values, atol=1e-4, rtol=1e-3)
            checked += 1
    assert checked >= len(ids) - 1
