"""A LoRA adapter made by the `peft` package on a tiny transformers Qwen3 (rsLoRA, rank_pattern, alpha_pattern,
every projection targeted), loaded by our loader: adapter on => peft's logits, off => the base model's; and
applied at MASK positions only (I-DLM R-ISD), greedy isd reproduces ar.
"""
from __future__ import annotations

import pytest
import torch

from specscope.backend.tracing import RecordingTracer

peft = pytest.importorskip("peft")
from support.hf_tiny import TINY, ids, randomize_lora, save_hf  # noqa: E402
from transformers import Qwen3Config  # noqa: E402

from specscope.backend.model.checkpoint import load_checkpoint  # noqa: E402
from specscope.backend.model.transformer import KVContext, PagedKV  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEQ = 14


def _positions(batch: int, start: int, stop: int) -> torch.Tensor:
    return torch.arange(start, stop).expand(batch, -1)


@pytest.fixture(scope="module", params=[False, True], ids=["lora", "rslora"])
def pair(request, tmp_path_factory):
    """(peft model, our LoadedModel with the adapter, our LoadedModel without it); vocab 2048 = the shipped
    tokenizer's, so the engine can run prompts through it."""
    root = tmp_path_factory.mktemp("peft")
    hf = save_hf(Qwen3Config(**(TINY | {"vocab_size": 2048}), head_dim=16, tie_word_embeddings=True), root)
    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, use_rslora=request.param,
                          rank_pattern={"o_proj": 4}, alpha_pattern={"down_proj": 4.0})
    pm = peft.get_peft_model(hf, cfg)
    randomize_lora(pm, 0.2, 7)
    pm.save_pretrained(root / "idlm_lora")
    return pm.eval(), load_checkpoint(root, adapter=root / "idlm_lora"), load_checkpoint(root, adapter=False)


def test_adapter_declarations(pair):
    _, ours, base = pair
    assert ours.model.has_lora and not base.model.has_lora
    assert ours.adapter_scope == "mask" and base.adapter_scope is None  # Qwen3 family: I-DLM's R-ISD adapter
    assert ours.name.endswith("+idlm_lora") and ours.weights_hash != base.weights_hash
    assert load_checkpoint(ours.folder).weights_hash == ours.weights_hash  # found in the folder by itself
    o = ours.model.layers[0].self_attn.o_proj
    assert o.lora_A.shape[0] == 4 and ours.model.layers[0].self_attn.q_proj.lora_A.shape[0] == 8


def test_adapter_on_matches_peft(pair):
    pm, ours, _ = pair
    x = ids(seed=11) % 2048
    with torch.no_grad():
        want = pm(input_ids=x).logits
    got = ours.model(x, _positions(2, 0, SEQ), lora=True)
    assert (got - want).abs().max().item() < 1e-4
    with torch.no_grad(), pm.disable_adapter():
        base_hf = pm(input_ids=x).logits
    assert (want - base_hf).abs().max().item() > 1e-2  # the adapter really changes the logits


def test_adapter_on_through_kv_slots(pair):
    """Incremental decoding with the adapter on, through shuffled KV slots, still matches peft."""
    pm, ours, _ = pair
    x = ids(batch=1, seed=13)
    with torch.no_grad():
        want = pm(input_ids=x).logits
    cache = PagedKV.empty(ours.model.cfg, 32, torch.float32, "cpu")
    slots = torch.randperm(32, generator=torch.Generator().manual_seed(2))[:SEQ][None]
    for start, stop in [(0, 6), (6, 7), (7, 10), (10, 14)]:
        kv = KVContext(cache, slots[:, :start], write_slots=slots[:, start:stop])
        got = ours.model(x[:, start:stop], _positions(1, start, stop), kv=kv, lora=True)
        assert (got - want[:, start:stop]).abs().max().item() < 1e-4


def test_adapter_off_is_the_base_model(pair):
    pm, ours, base = pair
    x = ids(seed=17)
    pos = _positions(2, 0, SEQ)
    got = ours.model(x, pos, lora=False)
    assert torch.equal(got, base.model(x, pos))
    with torch.no_grad(), pm.disable_adapter():
        want = pm(input_ids=x).logits
    assert (got - want).abs().max().item() < 1e-4


def test_mask_scoped_adapter_keeps_isd_lossless(pair):
    """The engine applies a "mask"-scope adapter at MASK query positions only: greedy isd then equals the base
    model's ar, prompt by prompt; with the adapter forced on everywhere (verify positions adapted too) it
    does not."""
    from specscope.backend.engine.engine import Engine

    _, ours, base = pair
    prompts = ["What is 12 + 30?", "Sort: 5 3 9 1", "hello world", "Count the letters in banana."]
    ar_engine = Engine(base, num_slots=1024, check_invariants=True)
    scoped = Engine(ours, num_slots=1024, check_invariants=True)
    everywhere = Engine(ours, num_slots=1024)
    everywhere.rt.adapter = lambda ids, draft: True
    differs = 0
    for prompt in prompts:
        params = {"max_new_tokens": 24}
        ar = ar_engine.generate(prompt, "ar", params).output_ids
        tracer = RecordingTracer()
        fixed = {"n": 3, "verify": "fixed"}   # every round drafts at MASK positions
        assert scoped.generate(prompt, "isd", params | fixed, tracer=tracer).output_ids == ar, prompt
        phases = [p for e in tracer.events if e["type"] == "round" for p in e["phases"]]
        assert any(p["lora"] for p in phases) and not all(p["lora"] for p in phases)
        differs += everywhere.generate(prompt, "isd", params | fixed).output_ids != ar
    assert differs > 0


def test_trainable_mask_row_matches_peft(tmp_path):
    """An adapter that also trains the MASK token's embedding row (peft's trainable_token_indices, as the
    self-speculation adapter ships): our loader applies the row as peft does, with the adapter on at MASK
    positions; the same row written by our save_adapter loads back to the same logits."""
    from specscope.backend.model.adapters import save_adapter
    mask = 7
    hf = save_hf(Qwen3Config(**(TINY | {"vocab_size": 2048}), head_dim=16, tie_word_embeddings=True), tmp_path)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, trainable_token_indices={"embed_tokens": [mask]})
    pm = peft.get_peft_model(hf, cfg)
    randomize_lora(pm, 0.2, 5)
    delta = next(p for n, p in pm.named_parameters() if "trainable_tokens_delta" in n)
    with torch.no_grad():
        delta.copy_(torch.randn_like(delta))
    pm.save_pretrained(tmp_path / "selfspec")
    ours = load_checkpoint(tmp_path, adapter=tmp_path / "selfspec")
    x = ids(seed=19) % 2048
    x[:, 5:9] = mask
    with torch.no_grad():
        want = pm.eval()(input_ids=x).logits
    got = ours.model(x, _positions(2, 0, SEQ), lora=True)
    keep = torch.arange(2048) != mask     # the tied head's MASK logit: never picked by any mode
    assert (got[..., keep] - want[..., keep]).abs().max().item() < 1e-4
    save_adapter(ours.model, tmp_path / "ours", tokens={"embed_tokens": {mask: ours.model.embed_tokens.weight[mask]}})
    again = load_checkpoint(tmp_path, adapter=tmp_path / "ours")
    assert torch.equal(again.model(x, _positions(2, 0, SEQ), lora=True), got)
    assert not torch.equal(load_checkpoint(tmp_path, adapter=False).model.embed_tokens.weight[mask],
                           ours.model.embed_tokens.weight[mask])
