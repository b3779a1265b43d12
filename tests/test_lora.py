"""LoRA adapters: lora=False is exactly the base model, lora=True changes the output, toggling is stateless,
a per-position switch is the base model exactly where it is off, and adapters round-trip through the PEFT
layout (save_adapter / load_adapter, directly or through load_model). The PEFT cross-check is in
test_peft_crosscheck.py."""
from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specscope.backend.model.adapters import CONFIG_FILE, WEIGHTS_FILE, load_adapter, save_adapter
from specscope.backend.model.checkpoint import load_model
from specscope.backend.model.config import CheckpointError, ModelConfig
from specscope.backend.model.transformer import KVContext, LoRALinear, PagedKV, Transformer

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


# ----------------------------------------------------------------------------------- per position


def test_per_position_lora(base, adapted, batch):
    """A bool [B, Q] switch: rows and positions where it is off reproduce lora=False bit for bit (causal
    attention: positions before the first switched-on one never see adapted K/V); all-on equals lora=True."""
    ids, pos = batch
    on = torch.zeros(ids.shape, dtype=torch.bool)
    on[0, 6:] = True  # row 0: adapter on from position 6; row 1: off everywhere
    got = adapted(ids, pos, lora=on)
    off = adapted(ids, pos, lora=False)
    assert torch.equal(got[0, :6], off[0, :6]) and torch.equal(got[1], off[1])
    assert _differ(got[0, 6:], off[0, 6:])
    assert torch.equal(adapted(ids, pos, lora=torch.ones(ids.shape, dtype=torch.bool)), adapted(ids, pos, lora=True))


def test_per_position_lora_matches_mixed_reference(adapted, batch):
    """Positions with the switch on get the adapted projections: compare against a layer-by-layer reference
    that mixes lora=True and lora=False outputs of each projection per position."""
    ids, pos = batch
    on = torch.zeros(ids.shape, dtype=torch.bool)
    on[:, ::3] = True
    q = adapted.layers[0].self_attn.q_proj
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(8))
    want = torch.where(on[..., None], q(x, True), q(x, False))
    assert torch.equal(q(x, on), want)


# ----------------------------------------------------------------------------------- save / load


def test_save_load_adapter_round_trip(base, adapted, batch, tmp_path):
    ids, pos = batch
    save_adapter(adapted, tmp_path)
    assert (tmp_path / CONFIG_FILE).exists() and (tmp_path / WEIGHTS_FILE).exists()
    model = copy.deepcopy(base)
    load_adapter(model, tmp_path)
    assert model.has_lora
    q, q0 = model.layers[1].self_attn.q_proj, adapted.layers[1].self_attn.q_proj
    assert torch.equal(q.lora_A, q0.lora_A) and torch.equal(q.lora_B, q0.lora_B) and q.lora_scale == q0.lora_scale
    assert torch.equal(model(ids, pos, lora=True), adapted(ids, pos, lora=True))
    assert torch.equal(model(ids, pos, lora=False), base(ids, pos))


def test_adapter_with_mixed_ranks_and_alphas(base, batch, tmp_path):
    """Per-module ranks and alphas go through rank_pattern / alpha_pattern and come back exactly."""
    ids, pos = batch
    src = copy.deepcopy(base)
    src.layers[0].self_attn.q_proj.add_adapter(RANK, ALPHA)
    src.layers[1].self_attn.q_proj.add_adapter(2, 3.0)
    src.layers[1].mlp.down_proj.add_adapter(RANK, 5.0)
    _randomize_lora_b(src, seed=6)
    save_adapter(src, tmp_path)
    model = copy.deepcopy(base)
    load_adapter(model, tmp_path)
    adapters = {n: m.lora_scale for n, m in model.named_modules() if isinstance(m, LoRALinear) and m.lora_A is not None}
    assert adapters == {"layers.0.self_attn.q_proj": ALPHA / RANK, "layers.1.self_attn.q_proj": 1.5,
                        "layers.1.mlp.down_proj": 5.0 / RANK}
    assert torch.equal(model(ids, pos, lora=True), src(ids, pos, lora=True))


def test_load_adapter_onto_converted_model(adapted, batch, tmp_path):
    """load_adapter onto a model already cast to another dtype: the adapter follows the model's dtype."""
    ids, pos = batch
    save_adapter(adapted, tmp_path)
    model = Transformer(BASE_CFG)
    model.load_state_dict({k: v for k, v in adapted.state_dict().items() if "lora_" not in k})
    model = model.to(torch.float64).eval().requires_grad_(False)
    load_adapter(model, tmp_path)
    assert model.layers[0].self_attn.q_proj.lora_A.dtype == torch.float64
    torch.testing.assert_close(model(ids, pos, lora=True).float(), adapted(ids, pos, lora=True),
                               rtol=0, atol=1e-5)


def _write_checkpoint(model: Transformer, folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(BASE_CFG.to_hf_dict()))
    save_file({f"model.{k}": v.contiguous() for k, v in model.state_dict().items() if "lora_" not in k},
              str(folder / "model.safetensors"))


@pytest.mark.parametrize("where", [".", "linear_spec_lora"])
def test_load_model_picks_up_adapter(base, adapted, batch, tmp_path, where):
    """An adapter in the checkpoint folder itself or in one subfolder (Nemotron's linear_spec_lora/) is attached."""
    ids, pos = batch
    folder = tmp_path / "ckpt"
    _write_checkpoint(base, folder)
    assert not load_model(folder).has_lora
    save_adapter(adapted, folder / where)
    loaded = load_model(folder)
    assert loaded.has_lora
    assert torch.equal(loaded(ids, pos, lora=True), adapted(ids, pos, lora=True))
    assert torch.equal(loaded(ids, pos, lora=False), base(ids, pos))


def _edit(folder: Path, **changes) -> None:
    cfg = json.loads((folder / CONFIG_FILE).read_text())
    cfg.update(changes)
    (folder / CONFIG_FILE).write_text(json.dumps(cfg))


@pytest.mark.parametrize("change,fragment", [
    ({"peft_type": "IA3"}, "peft_type"), ({"use_dora": True}, "use_dora"), ({"bias": "all"}, "'bias'"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
])
def test_unsupported_adapter_config(adapted, base, tmp_path, change, fragment):
    save_adapter(adapted, tmp_path)
    _edit(tmp_path, **change)
    with pytest.raises(CheckpointError, match=fragment):
        load_adapter(copy.deepcopy(base), tmp_path)


def test_adapter_with_wrong_shapes(adapted, base, tmp_path):
    save_adapter(adapted, tmp_path)
    big = replace(BASE_CFG, hidden_size=64)
    shapes = r"lora_[AB] has shape \((4, 32|32, 4)\), the model implies \((4, 64|64, 4)\)"
    with pytest.raises(CheckpointError, match=shapes):
        load_adapter(Transformer(big), tmp_path)


def test_adapter_for_unknown_module(base, tmp_path):
    save_adapter_like = {"base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight": torch.zeros(RANK, 32),
                         "base_model.model.model.layers.9.self_attn.q_proj.lora_B.weight": torch.zeros(32, RANK)}
    save_file(save_adapter_like, str(tmp_path / WEIGHTS_FILE))
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA}))
    with pytest.raises(CheckpointError, match=r"targets model\.layers\.9\.self_attn\.q_proj"):
        load_adapter(copy.deepcopy(base), tmp_path)


def test_adapter_with_base_weights(base, tmp_path):
    """An adapter file must not be able to overwrite base weights through its keys."""
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.weight": torch.zeros(32, 32)},
              str(tmp_path / WEIGHTS_FILE))
    (tmp_path / CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA}))
    model = copy.deepcopy(base)
    with pytest.raises(CheckpointError, match=r"not a LoRA weight.*layers\.0\.self_attn\.q_proj\.weight"):
        load_adapter(model, tmp_path)
    assert torch.equal(model.layers[0].self_attn.q_proj.weight, base.layers[0].self_attn.q_proj.weight)
    assert not model.has_lora
