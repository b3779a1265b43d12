"""The shared model options parse into load_checkpoint's arguments and an auto-sized KV pool."""
from __future__ import annotations

import argparse

import pytest
import torch

from specscope.backend.cli.options import add_model_args, load_from_args
from specscope.backend.engine import kv_budget
from specscope.backend.engine.kv_budget import auto_slots, slot_bytes

pytestmark = pytest.mark.real_model   # each test loads SmolLM2-135M


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_model_args(p)
    return p.parse_args(list(argv))


def test_defaults_load_the_default_model_with_an_auto_sized_pool(monkeypatch):
    monkeypatch.setattr(kv_budget, "free_bytes", lambda device: 6 << 30)   # other workers' memory comes and goes
    loaded, slots = load_from_args(_parse("--device", "cpu"))
    assert loaded.name.startswith("smollm2-135m") and loaded.adapter_scope == "mask"
    assert next(loaded.model.parameters()).dtype == torch.float32
    cfg = loaded.model.cfg
    assert slots == auto_slots(cfg, torch.float32, "cpu", at_most=64 * cfg.max_position_embeddings) >= 1024
    assert slots <= 64 * cfg.max_position_embeddings      # never more than 64 full contexts at once


def test_explicit_dtype_and_slots():
    loaded, slots = load_from_args(_parse("--device", "cpu", "--dtype", "bfloat16", "--slots", "77"))
    assert next(loaded.model.parameters()).dtype == torch.bfloat16 and slots == 77


def test_auto_slots_follow_free_memory(monkeypatch):
    loaded, _ = load_from_args(_parse("--device", "cpu", "--slots", "1"))
    cfg = loaded.model.cfg
    per = slot_bytes(cfg, torch.bfloat16)
    assert per == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    monkeypatch.setattr("specscope.backend.engine.kv_budget.free_bytes", lambda device: 1000 * per)
    assert auto_slots(cfg, torch.bfloat16, "cpu", fraction=0.5) == 500
    assert auto_slots(cfg, torch.bfloat16, "cpu", fraction=0.5, at_most=100) == 100
