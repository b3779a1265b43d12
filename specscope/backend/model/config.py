"""Model configuration: one dataclass for the Qwen3 / Qwen2 / Llama / Mistral / Ministral3 decoder family."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specscope.backend.model.families import BY_ARCH, family_of
from specscope.backend.model.rope import ROPE_TYPES, RopeSpec


class CheckpointError(ValueError):
    """A checkpoint folder or config that cannot be loaded; the message names the problem."""


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    family: str = "qwen3"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = True
    mask_token_id: int | None = None
    eos_token_id: int | None = None
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    rope: RopeSpec = field(default_factory=RopeSpec)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json we write: HF keys of the backbone plus our `specscope` extras."""
        arch = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
                "mistral": "MistralForCausalLM", "ministral3": "Ministral3ForCausalLM"}[self.family]
        d = asdict(self)
        extras = {k: d.pop(k) for k in ("family", "qk_norm", "lora_rank", "lora_alpha", "lora_targets")}
        qkv_bias, o_bias, rope = d.pop("qkv_bias"), d.pop("o_bias"), d.pop("rope")
        d["attention_bias"] = qkv_bias and o_bias
        if self.rope != RopeSpec():
            d["rope_parameters"] = {k: v for k, v in rope.items() if v is not None} | {"rope_theta": self.rope_theta}
        d.update(architectures=[arch], model_type=self.family, hidden_act="silu", torch_dtype="float16",
                 specscope=extras)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from a HF config.json dict; raise CheckpointError naming the key that is wrong."""
        fam = family_of(d)
        if fam is None:
            raise CheckpointError(f"unknown architecture {d.get('architectures') or d.get('model_type')!r} "
                                  f"(config key 'architectures'); supported: {sorted(BY_ARCH)}")
        _refuse_unsupported(d)
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise CheckpointError(f"config.json lacks required keys {missing}")
        family = fam.backbone
        extras = d.get("specscope", {})
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        rope_dict = d.get("rope_parameters") or d.get("rope_scaling") or {}
        max_pos = d.get("max_position_embeddings", 2048)
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads, family=family,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope_dict.get("rope_theta", d.get("rope_theta", 10000.0)),
            max_position_embeddings=min(max_pos, _sliding_window(d, family) or max_pos),
            tie_word_embeddings=d.get("tie_word_embeddings", False),  # HF's default for all these families
            qkv_bias=family == "qwen2" or d.get("attention_bias", False),
            o_bias=family != "qwen2" and d.get("attention_bias", False),
            qk_norm=extras.get("qk_norm", family == "qwen3"),
            mask_token_id=d.get("mask_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            lora_rank=extras.get("lora_rank", 0), lora_alpha=extras.get("lora_alpha", 16.0),
            lora_targets=extras.get("lora_targets", ["q_proj", "v_proj"]),
            rope=_rope_spec(rope_dict, max_pos, family),
        )


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
DLM_PARADIGMS = ("bidirectional", "autoregressive", "block_diff", "sbd_block_diff")  # Nemotron; inference alike


def _refuse_unsupported(d: dict[str, Any]) -> None:
    """One CheckpointError naming the first config key our dense decoder cannot honour."""
    for key in MOE_KEYS:
        if d.get(key):
            raise CheckpointError(f"unsupported mixture-of-experts config (key {key!r} = {d[key]!r})")
    if d.get("mlp_bias"):
        raise CheckpointError("unsupported mlp_bias=true (key 'mlp_bias')")
    if d.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"unsupported hidden_act {d['hidden_act']!r} (key 'hidden_act'; only silu/SwiGLU)")
    if d.get("dlm_paradigm", DLM_PARADIGMS[0]) not in DLM_PARADIGMS:
        raise CheckpointError(f"unknown dlm_paradigm {d['dlm_paradigm']!r} (key 'dlm_paradigm'); "
                              f"expected one of {DLM_PARADIGMS}")
    for key in ("quantization_config", "quantization"):  # HF quantizers; MLX's packed weights
        if d.get(key):
            raise CheckpointError(f"unsupported quantized checkpoint (key {key!r})")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError("unsupported partial rotary embeddings (key 'partial_rotary_factor')")


def _sliding_window(d: dict[str, Any], family: str) -> int | None:
    """The attention window the checkpoint uses; we serve only contexts inside it (where it equals full)."""
    sliding = "sliding_attention" in (d.get("layer_types") or [])
    if family in ("mistral", "ministral3") or d.get("use_sliding_window") or sliding:
        return d.get("sliding_window")
    return None


def _rope_spec(rope: dict[str, Any], max_pos: int, family: str) -> RopeSpec:
    """The RoPE variant of a rope_parameters / rope_scaling dict; CheckpointError names a bad key."""
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(f"unsupported rope_parameters.rope_type {rope_type!r}; supported: {list(ROPE_TYPES)}")
    beta = rope.get("llama_4_scaling_beta")
    if family == "ministral3" and beta is None:
        raise CheckpointError("Ministral3 config lacks rope_parameters.llama_4_scaling_beta")
    if rope_type == "default" and beta is None:
        return RopeSpec()
    orig = rope.get("original_max_position_embeddings", max_pos)
    factor = rope.get("factor")
    if factor is None and rope_type == "yarn":
        factor = max_pos / orig
    needed = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                               "original_max_position_embeddings")}.get(rope_type, ())
    missing = [k for k in needed if rope.get(k) is None]
    if missing:
        raise CheckpointError(f"rope_type {rope_type!r} lacks rope_parameters keys {missing}")
    return RopeSpec(
        rope_type=rope_type, factor=float(factor or 1.0), original_max_position_embeddings=orig,
        attention_factor=rope.get("attention_factor"), beta_fast=rope.get("beta_fast") or 32.0,
        beta_slow=rope.get("beta_slow") or 1.0, mscale=rope.get("mscale"), mscale_all_dim=rope.get("mscale_all_dim"),
        truncate=rope.get("truncate", True), low_freq_factor=rope.get("low_freq_factor", 1.0),
        high_freq_factor=rope.get("high_freq_factor", 4.0), llama_4_scaling_beta=beta)
