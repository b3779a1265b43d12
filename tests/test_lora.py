"""LoRA adapters: lora=False is exactly the base model, lora=True changes the output, toggling is stateless,
and save_lora / load_lora (directly or through load_model) round-trip the adapter exactly."""
from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from backend.model.checkpoint import LORA_FILE, load_lora, load_model, save_lora
from backend.model.config import CheckpointError, ModelConfig
from backend.model.transformer import KVContext, LoRALinear, PagedKV, Transformer

RANK, ALPHA = 4, 8.0
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
BASE_CFG = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, family="qwen3")
LORA_CFG = replace(BASE_CFG, lora_rank=RANK, lora_alpha=ALPHA, lora_targets=ALL_TARGETS)


pytestmark = pytest.mark.usefixtures("one_thread")


def _randomize_lora_b(model: Transformer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear) and m.lora_B is not None:
                m.lora_B.copy_(0.1 * torch.randn(m.lora_B.shape, generator=g))


@pytest.fixture(scope="module")
def base() -> Transformer:
    torch.manual_seed(0)
    return Transformer(BASE_CFG).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def adapted(base) -> Transformer:
    """The base weights plus rank-4 adapters on every projection, built from a config with lora_rank > 0."""
    torch.manual_seed(1)
    model = Transformer(LORA_CFG)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and missing and all("lora_" in k for k in missing)
    _randomize_lora_b(model, seed=2)
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, BASE_CFG.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    return ids, torch.arange(9).expand(2, -1)


def _differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a - b).abs().max().item() > 1e-3


# ----------------------------------------------------------------------------------- toggling


def test_adapters_present(base, adapted):
    assert not base.has_lora and adapted.has_lora
    q = adapted.layers[0].self_attn.q_proj
    assert q.lora_A.shape == (RANK, 32) and q.lora_B.shape == (32, RANK) and q.lora_scale == ALPHA / RANK
    assert q.lora_B.abs().sum() > 0


@pytest.mark.parametrize("attn", ["causal", "block"])
def test_lora_off_is_exactly_base(base, adapted, batch, attn):
    ids, pos = batch
    assert torch.equal(adapted(ids, pos, attn=attn, lora=False), base(ids, pos, attn=attn))


def test_lora_on_differs(base, adapted, batch):
    ids, pos = batch
    assert _differ(adapted(ids, pos, lora=True), base(ids, pos))


def test_fresh_adapter_is_identity(base, batch):
    """A freshly added adapter has lora_B = 0: lora=True is exactly the base model until trained."""
    ids, pos = batch
    model = copy.deepcopy(base)
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.add_adapter(RANK, ALPHA)
    assert model.has_lora
    assert torch.equal(model(ids, pos, lora=True), base(ids, pos))


def test_add_adapter_on_modules(base, batch):
    """Adapters added after construction (add_adapter) behave like config-built ones."""
    ids, pos = batch
    model = copy.deepcopy(base)
    model.layers[1].self_attn.v_proj.add_adapter(RANK, ALPHA)
    model.layers[0].mlp.down_proj.add_adapter(RANK, ALPHA)
    _randomize_lora_b(model, seed=4)
    assert torch.equal(model(ids, pos, lora=False), base(ids, pos))
    assert _differ(model(ids, pos, lora=True), base(ids, pos))


def test_toggle_on_off_on_is_stateless(base, adapted, batch):
    ids, pos = batch
    on1 = adapted(ids, pos, lora=True)
    off = adapted(ids, pos, lora=False)
    on2 = adapted(ids, pos, lora=True)
    off2 = adapted(ids, pos, lora=False)
    assert torch.equal(on1, on2)
    assert torch.equal(off, off2)
    assert torch.equal(off, base(ids, pos))


def test_lora_through_paged_kv(base, adapted, batch):
    """With a KV cache: lora=False writes exactly the base K/V; lora=True writes (and reads) different K/V."""
    ids, pos = batch
    slots = torch.randperm(32, generator=torch.Generator().manual_seed(5))[:18].view(2, 9)

    def run(model: Transformer, lora: bool) -> tuple[torch.Tensor, PagedKV]:
        cache = PagedKV.empty(BASE_CFG, 32, torch.float32, "cpu")
        model(ids[:, :5], pos[:, :5], kv=KVContext(cache, slots[:, :0], write_slots=slots[:, :5]), lora=lora)
        out = model(ids[:, 5:], pos[:, 5:], kv=KVContext(cache, slots[:, :5], write_slots=slots[:, 5:]), lora=lora)
        return out, cache

    base_out, base_cache = run(base, False)
    off_out, off_cache = run(adapted, False)
    on_out, on_cache = run(adapted, True)
    assert torch.equal(off_out, base_out)
    assert torch.equal(off_cache.k, base_cache.k) and torch.equal(off_cache.v, base_cache.v)
    assert _differ(on_out, base_out) and _differ(on_cache.k, base_cache.k)
    # And the cached path agrees with a full forward in both modes.
    torch.testing.assert_close(on_out, adapted(ids, pos, lora=True)[:, 5:], rtol=0, atol=1e-5)
    torch.testing.assert_close(off_out, adapted(ids, pos, lora=False)[:, 5:], rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------------- save / load


def test_save_load_lora_round_trip(base, adapted, batch, tmp_path):
    ids, pos = batch
    path = tmp_path / LORA_FILE
    save_lora(adapted, path, RANK, ALPHA)
    model = copy.deepcopy(base)
    load_lora(model, path)
    assert model.has_lora
    q, q0 = model.layers[1].self_attn.q_proj, adapted.layers[1].self_attn.q_proj
    assert torch.equal(q.lora_A, q0.lora_A) and torch.equal(q.lora_B, q0.lora_B) and q.lora_scale == q0.lora_scale
    assert torch.equal(model(ids, pos, lora=True), adapted(ids, pos, lora=True))
    assert torch.equal(model(ids, pos, lora=False), base(ids, pos))


def test_load_lora_partial_targets(base, batch, tmp_path):
    """Only the modules in the file get adapters; the others stay plain."""
    ids, pos = batch
    src = copy.deepcopy(base)
    src.layers[0].self_attn.q_proj.add_adapter(RANK, ALPHA)
    _randomize_lora_b(src, seed=6)
    save_lora(src, tmp_path / LORA_FILE, RANK, ALPHA)
    model = copy.deepcopy(base)
    load_lora(model, tmp_path / LORA_FILE)
    adapters = [n for n, m in model.named_modules() if isinstance(m, LoRALinear) and m.lora_A is not None]
    assert adapters == ["layers.0.self_attn.q_proj"]
    assert torch.equal(model(ids, pos, lora=True), src(ids, pos, lora=True))


def test_load_lora_onto_converted_model(adapted, batch, tmp_path):
    """load_lora onto a model already cast to another dtype: the adapter follows the model's dtype."""
    ids, pos = batch
    save_lora(adapted, tmp_path / LORA_FILE, RANK, ALPHA)
    model = Transformer(BASE_CFG)
    model.load_state_dict({k: v for k, v in adapted.state_dict().items() if "lora_" not in k})
    model = model.to(torch.float64).eval().requires_grad_(False)
    load_lora(model, tmp_path / LORA_FILE)
    assert model.layers[0].self_attn.q_proj.lora_A.dtype == torch.float64
    torch.testing.assert_close(model(ids, pos, lora=True).float(), adapted(ids, pos, lora=True),
                               rtol=0, atol=1e-5)


def _write_checkpoint(model: Transformer, folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(BASE_CFG.to_hf_dict()))
    save_file({f"model.{k}": v.contiguous() for k, v in model.state_dict().items() if "lora_" not in k},
              str(folder / "model.safetensors"))


def test_load_model_picks_up_lora_file(base, adapted, batch, tmp_path):
    ids, pos = batch
    folder = tmp_path / "ckpt"
    _write_checkpoint(base, folder)
    assert not load_model(folder).has_lora
    save_lora(adapted, folder / LORA_FILE, RANK, ALPHA)
    loaded = load_model(folder)
    assert loaded.has_lora
    assert torch.equal(loaded(ids, pos, lora=True), adapted(ids, pos, lora=True))
    assert torch.equal(loaded(ids, pos, lora=False), base(ids, pos))


def test_lora_file_without_rank(adapted, base, tmp_path):
    tensors = {k: v.contiguous() for k, v in adapted.state_dict().items() if "lora_" in k}
    save_file(tensors, str(tmp_path / LORA_FILE))
    with pytest.raises(CheckpointError, match="rank"):
        load_lora(copy.deepcopy(base), tmp_path / LORA_FILE)


def test_lora_file_with_wrong_rank(adapted, base, tmp_path):
    save_lora(adapted, tmp_path / LORA_FILE, RANK * 2, ALPHA)
    with pytest.raises(CheckpointError, match=r"lora_A has shape \(4, \d+\), rank 8 implies \(8, \d+\)"):
        load_lora(copy.deepcopy(base), tmp_path / LORA_FILE)


def test_lora_file_for_unknown_module(base, tmp_path):
    save_file({"layers.9.self_attn.q_proj.lora_A": torch.zeros(RANK, 32),
               "layers.9.self_attn.q_proj.lora_B": torch.zeros(32, RANK)},
              str(tmp_path / LORA_FILE), metadata={"rank": str(RANK), "alpha": str(ALPHA)})
    with pytest.raises(CheckpointError, match=r"unknown module layers\.9\.self_attn\.q_proj"):
        load_lora(copy.deepcopy(base), tmp_path / LORA_FILE)


def test_lora_file_with_base_weights(base, tmp_path):
    """A LoRA file must not be able to overwrite base weights through its keys."""
    save_file({"layers.0.self_attn.q_proj.weight": torch.zeros(32, 32)},
              str(tmp_path / LORA_FILE), metadata={"rank": str(RANK), "alpha": str(ALPHA)})
    model = copy.deepcopy(base)
    with pytest.raises(CheckpointError, match=r"layers\.0\.self_attn\.q_proj\.weight"):
        load_lora(model, tmp_path / LORA_FILE)
    assert torch.equal(model.layers[0].self_attn.q_proj.weight, base.layers[0].self_attn.q_proj.weight)
