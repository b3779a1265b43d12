"""Model families: each real layout loads onto our decoder with its own declarations.

The Nemotron-Labs-Diffusion layout is a transformers-written Ministral3 (YaRN + llama-4 query scaling) whose
weights are re-keyed to `encoder.*` / `diffusion_head` and whose config carries dlm_paradigm / block_size /
mask_token_id: it must give the Ministral3 path's logits exactly, in causal mode (checked against
transformers too) and in its diffusion (block) mode, and declare block logits unshifted.
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from support.hf_tiny import TINY, YARN, ids, randomize_lora, save_hf  # noqa: E402
from transformers import Ministral3Config, Qwen2Config, Qwen3Config  # noqa: E402

from specscope.backend.model.adapters import CONFIG_FILE, WEIGHTS_FILE  # noqa: E402
from specscope.backend.model.checkpoint import load_checkpoint  # noqa: E402
from specscope.backend.model.config import CheckpointError  # noqa: E402
from specscope.backend.model.transformer import ATTN_MODES, KVContext, PagedKV  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SEQ = 14


def _positions(batch: int, start: int, stop: int) -> torch.Tensor:
    return torch.arange(start, stop).expand(batch, -1)


def _rewrite(src: Path, dst: Path, rename, **config) -> None:
    """A copy of folder src with its weights renamed by rename(key) and config.json updated by `config`."""
    shutil.copytree(src, dst)
    with safe_open(str(src / "model.safetensors"), framework="pt") as sf:
        tensors = {rename(k): sf.get_tensor(k) for k in sf.keys()}
    save_file(tensors, str(dst / "model.safetensors"))
    d = json.loads((src / "config.json").read_text()) | config
    (dst / "config.json").write_text(json.dumps(d))


def _nemotron_key(key: str) -> str:
    return "diffusion_head.weight" if key == "lm_head.weight" else "encoder." + key.removeprefix("model.")


NEMOTRON = dict(architectures=["NemotronLabsDiffusionModel"], model_type="nemotron_labs_diffusion",
                dlm_paradigm="bidirectional", block_size=8, mask_token_id=100)


@pytest.fixture(scope="module")
def ministral(tmp_path_factory):
    """(HF Ministral3 model, its folder, the same weights in the Nemotron-Labs-Diffusion layout)."""
    root = tmp_path_factory.mktemp("ministral")
    hf = save_hf(Ministral3Config(**TINY, head_dim=16, rope_parameters=dict(YARN)), root / "ministral3")
    _rewrite(root / "ministral3", root / "nemotron", _nemotron_key, **NEMOTRON)
    return hf, root / "ministral3", root / "nemotron"


def test_nemotron_declarations(ministral):
    _, plain_dir, nemo_dir = ministral
    nemo, plain = load_checkpoint(nemo_dir), load_checkpoint(plain_dir)
    assert nemo.family == "nemotron_labs_diffusion" and plain.family == "ministral3"
    assert nemo.logits_shifted == {m: m != "block" for m in ATTN_MODES}
    assert plain.logits_shifted == dict.fromkeys(ATTN_MODES, True)
    assert (nemo.mask_token_id, nemo.block_size, nemo.adapter_scope) == (100, 8, None)
    assert nemo.model.cfg.rope == plain.model.cfg.rope and nemo.model.cfg.rope.llama_4_scaling_beta == 0.1
    assert nemo.weights_hash != plain.weights_hash and len(nemo.weights_hash) == 12


def test_nemotron_causal_logits_equal_ministral3_and_transformers(ministral):
    hf, plain_dir, nemo_dir = ministral
    nemo, plain = load_checkpoint(nemo_dir).model, load_checkpoint(plain_dir).model
    x = ids()
    pos = _positions(2, 0, SEQ)
    got = nemo(x, pos)
    assert torch.equal(got, plain(x, pos))
    with torch.no_grad():
        want = hf(input_ids=x).logits
    assert (got - want).abs().max().item() < 1e-4


def test_nemotron_diffusion_forward(ministral):
    """Diffusion mode (Nemotron diffusion_lm=True): a block [seed, M, ...] after a causally cached prefix,
    bidirectional inside the block, read-only cache: equal to the Ministral3 path and to transformers under
    the same mask; the block's logits differ from causal ones, which is why the mode's convention matters."""
    hf, plain_dir, nemo_dir = ministral
    nemo, plain = load_checkpoint(nemo_dir).model, load_checkpoint(plain_dir).model
    p, b = 6, 8
    x = ids(batch=1, seq=p + b, seed=5)
    x[0, p + 1:] = 100  # the block: seed token then MASKs
    outs = []
    for model in (nemo, plain):
        cache = PagedKV.empty(model.cfg, 32, torch.float32, "cpu")
        slots = torch.arange(p + b)[None]
        model(x[:, :p], _positions(1, 0, p), kv=KVContext(cache, slots[:, :0], write_slots=slots[:, :p]))
        outs.append(model(x[:, p:], _positions(1, p, p + b), attn="block", kv=KVContext(cache, slots[:, :p])))
    assert torch.equal(outs[0], outs[1])
    allowed = torch.ones(p + b, p + b, dtype=torch.bool).tril()
    allowed[p:, p:] = True
    mask = torch.zeros(1, 1, p + b, p + b).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        want = hf(input_ids=x, attention_mask=mask).logits[:, p:]
        causal = hf(input_ids=x).logits[:, p:]
    assert (outs[0] - want).abs().max().item() < 1e-4
    assert (outs[0] - causal).abs().max().item() > 1e-3


def test_nemotron_linear_spec_lora(ministral, tmp_path):
    """Nemotron's draft adapter as peft saves it on NemotronLabsDiffusionModel (an o_proj LoRA, keys under
    base_model.model.encoder.*, in linear_spec_lora/): found in the folder, scope "draft", and with it on our
    logits are peft's on the Ministral3 twin; off, the base model's."""
    peft = pytest.importorskip("peft")
    hf, _, nemo_dir = ministral
    pm = peft.get_peft_model(copy.deepcopy(hf), peft.LoraConfig(r=8, lora_alpha=32, target_modules=["o_proj"]))
    randomize_lora(pm, 0.3, 9)
    pm.save_pretrained(tmp_path / "hf_lora")
    folder = tmp_path / "nemotron"
    shutil.copytree(nemo_dir, folder)
    (folder / "linear_spec_lora").mkdir()
    shutil.copy(tmp_path / "hf_lora" / CONFIG_FILE, folder / "linear_spec_lora" / CONFIG_FILE)
    with safe_open(str(tmp_path / "hf_lora" / WEIGHTS_FILE), framework="pt") as sf:
        save_file({k.replace("base_model.model.model.", "base_model.model.encoder."): sf.get_tensor(k)
                   for k in sf.keys()}, str(folder / "linear_spec_lora" / WEIGHTS_FILE))
    loaded = load_checkpoint(folder)
    assert loaded.adapter_scope == "draft" and loaded.name == "nemotron+linear_spec_lora"
    x, pos = ids(seed=21), _positions(2, 0, SEQ)
    with torch.no_grad():
        want = pm(input_ids=x).logits
    assert (loaded.model(x, pos, lora=True) - want).abs().max().item() < 1e-4
    assert torch.equal(loaded.model(x, pos), load_checkpoint(nemo_dir).model(x, pos))


def test_nemotron_unknown_paradigm(ministral, tmp_path):
    _, _, nemo_dir = ministral
    _rewrite(nemo_dir, tmp_path / "bad", lambda k: k, dlm_paradigm="sideways")
    with pytest.raises(CheckpointError, match="dlm_paradigm"):
        load_checkpoint(tmp_path / "bad")


# ----------------------------------------------------------------------------------- Qwen-based families


@pytest.mark.parametrize("config_cls,arch,extra,family,block,mask", [
    (Qwen3Config, ["SDARForCausalLM"], dict(model_type="sdar", block_size=7, mask_token_id=151), "sdar", 7, 151),
    (Qwen3Config, ["SDARForCausalLM"], dict(model_type="sdar"), "sdar", 4, 2),
    (Qwen2Config, ["Fast_dLLM_QwenForCausalLM"], dict(model_type="Fast_dLLM_Qwen", bd_size=16), "fast_dllm_v2", 16,
     2),
    (Qwen2Config, ["Fast_dLLM_QwenForCausalLM"], dict(model_type="Fast_dLLM_Qwen"), "fast_dllm_v2", 32, 2),
])
def test_qwen_families(tmp_path, config_cls, arch, extra, family, block, mask):
    """SDAR / I-DLM and Fast-dLLM v2 keep their backbone's weights: same logits as the plain family; the
    block size comes from their own config key (block_size / bd_size) or the family default; the mask id from
    config.json, else the tokenizer (the shipped tokenizer's <|mask|> = 2; the families' real defaults
    151669 / 151665 lie outside this tiny vocab and are skipped)."""
    save_hf(config_cls(**TINY, tie_word_embeddings=True), tmp_path / "plain")
    _rewrite(tmp_path / "plain", tmp_path / family, lambda k: k, architectures=arch, **extra)
    loaded, plain = load_checkpoint(tmp_path / family), load_checkpoint(tmp_path / "plain")
    assert (loaded.family, loaded.block_size, loaded.mask_token_id) == (family, block, mask)
    assert loaded.logits_shifted == dict.fromkeys(ATTN_MODES, True)
    x = ids()
    assert torch.equal(loaded.model(x, _positions(2, 0, SEQ)), plain.model(x, _positions(2, 0, SEQ)))


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_folded_verify_uses_the_models_rope_variant(ministral, backend):
    """SpecFold's folded forward applies the model's own RoPE (YaRN, llama-4 query scale): with the strict
    gate at δ = 0 its logits equal the dense block forward of every branch."""
    from support.fold_oracle import fold_backend

    from specscope.backend.forward.plan import Fold, ForwardPlan

    model = load_checkpoint(ministral[2]).model
    p, b, parents = 6, 8, [-1, 0, 0, 1]
    prefix = ids(batch=1, seq=p, seed=7)
    blocks = ids(batch=len(parents), seq=b, seed=8)
    blocks[:, 3:] = 100
    blocks[1, 4], blocks[2, 5], blocks[3, 4] = 7, 9, 7
    cache = PagedKV.empty(model.cfg, 32, torch.float32, "cpu")
    slots = torch.arange(p)[None]
    model(prefix, _positions(1, 0, p), kv=KVContext(cache, slots[:, :0], write_slots=slots))
    pos = _positions(len(parents), p, p + b)
    read = KVContext(cache, slots.expand(len(parents), p), shared=True)   # the row groups of one request
    dense = model(blocks, pos, attn="block", kv=read)
    plan = ForwardPlan(blocks, pos, "block", read, fold=Fold(tuple(parents), 0.0, "strict"))
    assert (fold_backend(model, backend).run(plan).logits - dense).abs().max().item() < 1e-4
