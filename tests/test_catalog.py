"""The models directory: loadable folders are listed with family, size and adapter; broken ones with the
loader's own error; nothing but headers is read."""
from __future__ import annotations

import json
import shutil

import pytest

from specscope.backend.model.adapters import save_adapter
from specscope.backend.model.catalog import scan
from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT, load_model
from specscope.backend.model.config import CheckpointError


def test_scan_models_dir(tmp_path):
    shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "tiny")
    shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "tiny-lora")
    model = load_model(DEFAULT_CHECKPOINT)
    base_params = sum(p.numel() for p in model.parameters())
    model.layers[0].self_attn.o_proj.add_adapter(4, 8.0)
    save_adapter(model, tmp_path / "tiny-lora" / "linear_spec_lora")
    shutil.copytree(DEFAULT_CHECKPOINT, tmp_path / "moe")
    cfg = json.loads((tmp_path / "moe" / "config.json").read_text()) | {"num_experts": 8}
    (tmp_path / "moe" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "notes").mkdir()  # no config.json: not a model folder
    entries = {e.name: e for e in scan(tmp_path)}
    assert sorted(entries) == ["moe", "tiny", "tiny-lora"]
    tiny = entries["tiny"]
    assert tiny.loadable and tiny.family == "qwen3" and tiny.dtype == "F16" and tiny.shards == 1
    assert tiny.parameters == base_params
    assert tiny.adapter is None and entries["tiny-lora"].adapter == "linear_spec_lora"
    assert not entries["moe"].loadable and "num_experts" in entries["moe"].error


def test_scan_missing_dir(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        scan(tmp_path / "nope")
