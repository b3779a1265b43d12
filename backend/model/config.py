"""Model configuration: one dataclass for the Qwen3 / Qwen2 / Llama / Mistral decoder family."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "SDARForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "Fast_dLLM_QwenForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Ministral3ForCausalLM": "mistral",
}


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

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def to_hf_dict(self) -> dict[str, Any]:
        """The config.json we write: HF Qwen3 keys plus our `specscope` extras."""
        arch = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}[self.family]
        d = asdict(self)
        extras = {k: d.pop(k) for k in ("family", "qk_norm", "lora_rank", "lora_alpha", "lora_targets")}
        qkv_bias, o_bias = d.pop("qkv_bias"), d.pop("o_bias")
        d["attention_bias"] = qkv_bias and o_bias
        d.update(architectures=[arch], model_type=self.family, hidden_act="silu", torch_dtype="float16",
                 specscope=extras)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from a HF config.json dict; raise CheckpointError naming what is wrong."""
        archs = d.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if family is None:
            family = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama", "mistral": "mistral",
                      "sdar": "qwen3"}.get(d.get("model_type", ""))
        if family is None:
            raise CheckpointError(
                f"unknown architecture {archs or d.get('model_type')!r}; supported: "
                f"{sorted(SUPPORTED_ARCHITECTURES)}")
        if d.get("mlp_bias"):
            raise CheckpointError("unsupported mlp_bias=true")
        if d.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"unsupported hidden_act {d['hidden_act']!r} (only silu/SwiGLU)")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise CheckpointError(f"unsupported rope scaling {rope_type!r} (only default RoPE)")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise CheckpointError(f"config.json lacks required keys {missing}")
        extras = d.get("specscope", {})
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads, family=family,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", d.get("rope_theta", 10000.0)),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=d.get("tie_word_embeddings", False),  # HF's default for all four families
            qkv_bias=family == "qwen2" or d.get("attention_bias", False),
            o_bias=family != "qwen2" and d.get("attention_bias", False),
            qk_norm=extras.get("qk_norm", family == "qwen3"),
            mask_token_id=d.get("mask_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            lora_rank=extras.get("lora_rank", 0), lora_alpha=extras.get("lora_alpha", 16.0),
            lora_targets=extras.get("lora_targets", ["q_proj", "v_proj"]),
        )
