"""Every malformed checkpoint folder raises CheckpointError with a message that names the problem.

Each test asserts on the message, so a stray exception from deep inside (KeyError, SafetensorError,
UnicodeDecodeError, ...) cannot pass for the intended error.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specscope.backend.model.adapters import CONFIG_FILE, WEIGHTS_FILE
from specscope.backend.model.checkpoint import load_checkpoint, load_model, save_checkpoint
from specscope.backend.model.config import CheckpointError, ModelConfig
from specscope.backend.model.tokenizer import train_tokenizer
from specscope.backend.model.transformer import Transformer

CORPUS = ["What is 12 + 30? 42.", "hello world, hello tokens", "the quick brown fox jumps over the lazy dog"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory) -> Path:
    """A valid checkpoint written by our own save_checkpoint (tiny untied Qwen3 + trained BPE tokenizer)."""
    tok = train_tokenizer(CORPUS, vocab_size=300)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, family="qwen3",
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("good")
    save_checkpoint(Transformer(cfg), tok, folder, meta={"steps": 0})
    return folder


@pytest.fixture
def folder(good_folder, tmp_path) -> Path:
    """A fresh copy of the good checkpoint for one test to break."""
    dst = tmp_path / "ckpt"
    shutil.copytree(good_folder, dst)
    return dst


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as sf:
        return {k: sf.get_tensor(k) for k in sf.keys()}


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    d = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    path.write_text(json.dumps(d))


def _raises(folder: Path, *fragments: str, loader=load_model) -> str:
    with pytest.raises(CheckpointError) as info:
        loader(folder)
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


# ----------------------------------------------------------------------------------- the good case


def test_good_folder_loads(good_folder):
    loaded = load_checkpoint(good_folder)
    assert loaded.model.lm_head is not None
    assert loaded.mask_token_id == loaded.tokenizer.convert_tokens_to_ids("<|mask|>")
    assert loaded.eos_token_id == loaded.tokenizer.convert_tokens_to_ids("<|eos|>")
    ids = torch.tensor([loaded.tokenizer.encode("hello world")])
    logits = loaded.model(ids, torch.arange(ids.shape[1])[None])
    assert logits.shape == (1, ids.shape[1], loaded.model.cfg.vocab_size) and torch.isfinite(logits).all()


# ----------------------------------------------------------------------------------- folder / config


def test_nonexistent_folder(tmp_path):
    _raises(tmp_path / "nope", "does not exist", str(tmp_path / "nope"))


def test_path_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    _raises(tmp_path / "file", "does not exist")


def test_missing_config(folder):
    (folder / "config.json").unlink()
    _raises(folder, "missing config.json")


def test_invalid_json(folder):
    (folder / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"],')
    _raises(folder, "config.json", "not valid JSON")


def test_binary_garbage_config(folder):
    (folder / "config.json").write_bytes(b"\xff\xfe\x00garbage\x80\x81")
    _raises(folder, "config.json", "not valid JSON")


def test_config_not_an_object(folder):
    (folder / "config.json").write_text("[1, 2, 3]")
    _raises(folder, "config.json", "JSON object")


def test_unknown_architecture(folder):
    _edit_config(folder, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    _raises(folder, "unknown architecture", "GPT2LMHeadModel")


def test_missing_required_key(folder):
    _edit_config(folder, hidden_size=None)
    _raises(folder, "lacks required keys", "hidden_size")


@pytest.mark.parametrize("change,fragment", [
    ({"hidden_act": "gelu"}, "'hidden_act'"),
    ({"mlp_bias": True}, "'mlp_bias'"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_type 'dynamic'"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type 'longrope'"),
    ({"num_experts": 8, "num_experts_per_tok": 2}, "mixture-of-experts config (key 'num_experts'"),
    ({"num_local_experts": 8}, "'num_local_experts'"),
    ({"quantization_config": {"quant_method": "fp8"}}, "'quantization_config'"),
    ({"quantization": {"bits": 4, "group_size": 64}}, "'quantization'"),
    ({"partial_rotary_factor": 0.5}, "'partial_rotary_factor'"),
])
def test_unsupported_config_features(folder, change, fragment):
    _edit_config(folder, **change)
    _raises(folder, "unsupported", fragment)


@pytest.mark.parametrize("change,fragments", [
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}},
     ("llama3", "low_freq_factor", "high_freq_factor")),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, ("linear", "factor")),
    ({"architectures": ["Ministral3ForCausalLM"], "model_type": "ministral3",
      "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, ("llama_4_scaling_beta",)),
])
def test_rope_config_lacking_a_key(folder, change, fragments):
    _edit_config(folder, **change)
    _raises(folder, *fragments)


# ----------------------------------------------------------------------------------- weights


def test_missing_safetensors(folder):
    (folder / "model.safetensors").unlink()
    _raises(folder, "missing model.safetensors")


def test_corrupt_safetensors(folder):
    (folder / "model.safetensors").write_bytes(b"\x00\x01this is not a safetensors file" * 10)
    _raises(folder, "model.safetensors", "cannot read safetensors")


def test_truncated_safetensors(folder):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _raises(folder, "model.safetensors", "cannot read safetensors")


def test_mismatched_weight_shape(folder):
    tensors = _tensors(folder)
    key = "model.layers.1.self_attn.q_proj.weight"
    tensors[key] = torch.zeros(tensors[key].shape[0] + 8, tensors[key].shape[1], dtype=tensors[key].dtype)
    save_file(tensors, str(folder / "model.safetensors"))
    msg = _raises(folder, "layers.1.self_attn.q_proj.weight", "has shape")
    assert "(40, 32)" in msg and "(32, 32)" in msg


def test_config_disagrees_with_weights(folder):
    _edit_config(folder, intermediate_size=48)
    _raises(folder, "mlp", "has shape", "config implies")


def test_missing_weights(folder):
    tensors = _tensors(folder)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    _raises(folder, "weights missing", "layers.1.mlp.down_proj.weight")


def test_untied_config_without_lm_head(folder):
    tensors = _tensors(folder)
    del tensors["lm_head.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    _raises(folder, "weights missing", "lm_head.weight")


def test_unexpected_weights(folder):
    tensors = _tensors(folder)
    tensors["model.layers.5.mlp.up_proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(folder / "model.safetensors"))
    _raises(folder, "unexpected weights", "layers.5.mlp.up_proj.weight")


def _shard(folder: Path) -> None:
    """Split model.safetensors into two shards plus an index, the layout of large HF checkpoints."""
    tensors = _tensors(folder)
    (folder / "model.safetensors").unlink()
    keys = sorted(tensors)
    half = len(keys) // 2
    shards = {"model-00001-of-00002.safetensors": keys[:half], "model-00002-of-00002.safetensors": keys[half:]}
    weight_map = {}
    for name, ks in shards.items():
        save_file({k: tensors[k] for k in ks}, str(folder / name))
        weight_map.update(dict.fromkeys(ks, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_checkpoint_loads(folder, good_folder):
    _shard(folder)
    ids = torch.tensor([[1, 2, 3, 4]])
    pos = torch.arange(4)[None]
    assert torch.equal(load_model(folder)(ids, pos), load_model(good_folder)(ids, pos))


def test_missing_shard(folder):
    _shard(folder)
    (folder / "model-00002-of-00002.safetensors").unlink()
    _raises(folder, "shards listed in the index are missing", "model-00002-of-00002.safetensors")


@pytest.mark.parametrize("index_text", ['{"weight_map": ', '{"metadata": {}}', "[]"])
def test_bad_shard_index(folder, index_text):
    _shard(folder)
    (folder / "model.safetensors.index.json").write_text(index_text)
    _raises(folder, "model.safetensors.index.json")


# ----------------------------------------------------------------------------------- lora / tokenizer


def test_corrupt_adapter_file(folder):
    (folder / CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    (folder / WEIGHTS_FILE).write_bytes(b"not a safetensors file at all")
    _raises(folder, WEIGHTS_FILE, "cannot read")


def test_adapter_config_not_json(folder):
    (folder / CONFIG_FILE).write_text("{ r: 4")
    _raises(folder, CONFIG_FILE, "not valid JSON")


def test_two_adapter_subfolders(folder):
    for name in ("a", "b"):
        (folder / name).mkdir()
        (folder / name / CONFIG_FILE).write_text("{}")
    _raises(folder, "several adapters", "'a'", "'b'")


def test_missing_tokenizer(folder):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    load_model(folder)  # the weights alone are fine
    _raises(folder, "missing tokenizer", loader=load_checkpoint)


def test_corrupt_tokenizer(folder):
    (folder / "tokenizer.json").write_text("{ this is not json")
    _raises(folder, "cannot load the tokenizer", loader=load_checkpoint)
