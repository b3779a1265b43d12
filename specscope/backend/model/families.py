"""Model families: how each checkpoint layout maps onto our one decoder.

A family is data, not code: which config architectures / model types it covers, its backbone, where its
weights live (prefix, output head), its default special ids and block size, which attention modes give
unshifted logits, and where a PEFT adapter shipped for it applies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ADAPTER_SCOPES = (None, "draft", "mask")


@dataclass(frozen=True)
class Family:
    name: str
    backbone: str                       # ModelConfig.family: qwen3 / qwen2 / llama / mistral / ministral3
    architectures: tuple[str, ...]
    model_types: tuple[str, ...] = ()
    prefix: str = "model."              # weight-name prefix of the decoder stack
    head: str = "lm_head"               # the output projection's module name
    mask_token_id: int | None = None    # default when neither config.json nor the tokenizer names one
    eos_token_id: int | None = None     # default stop token (overrides config.json's, e.g. <|im_end|>)
    block_key: str | None = None        # config.json key holding the model's block size
    default_block_size: int | None = None
    unshifted: tuple[str, ...] = ()     # attention modes whose logits at i predict token i (not i+1)
    adapter_scope: str | None = None    # where an adapter for this family applies: draft passes or MASK positions

    def block_size(self, d: dict[str, Any]) -> int | None:
        return d.get(self.block_key, self.default_block_size) if self.block_key else self.default_block_size

    def our_key(self, key: str) -> str:
        """A checkpoint (or PEFT) weight name as our module path."""
        if key.startswith(f"{self.head}."):
            return "lm_head." + key[len(self.head) + 1:]
        return key.removeprefix(self.prefix)


FAMILIES: tuple[Family, ...] = (
    # Qwen3 + the I-DLM R-ISD LoRA: SGLang maps Qwen3ForCausalLM to <|MASK|> = 151669 (inside the padded vocab).
    Family("qwen3", "qwen3", ("Qwen3ForCausalLM",), ("qwen3",), mask_token_id=151669, adapter_scope="mask"),
    Family("sdar", "qwen3", ("SDARForCausalLM",), ("sdar",), mask_token_id=151669, block_key="block_size",
           default_block_size=4, adapter_scope="mask"),
    Family("qwen2", "qwen2", ("Qwen2ForCausalLM",), ("qwen2",)),
    Family("fast_dllm_v2", "qwen2", ("Fast_dLLM_QwenForCausalLM",), ("fast_dllm_v2", "Fast_dLLM_Qwen"),
           mask_token_id=151665, eos_token_id=151645, block_key="bd_size", default_block_size=32),
    Family("llama", "llama", ("LlamaForCausalLM",), ("llama",)),
    Family("mistral", "mistral", ("MistralForCausalLM",), ("mistral",)),
    Family("ministral3", "ministral3", ("Ministral3ForCausalLM",), ("ministral3",)),
    Family("nemotron_labs_diffusion", "ministral3", ("NemotronLabsDiffusionModel",),
           ("nemotron_labs_diffusion",), prefix="encoder.", head="diffusion_head", mask_token_id=100,
           block_key="block_size", default_block_size=32, unshifted=("block",), adapter_scope="draft"),
)
BY_ARCH = {a: f for f in FAMILIES for a in f.architectures}
BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}
BY_NAME = {f.name: f for f in FAMILIES}


def family_of(d: dict[str, Any]) -> Family | None:
    """The family a config.json dict belongs to (architectures first, then model_type), or None."""
    for arch in d.get("architectures") or []:
        if arch in BY_ARCH:
            return BY_ARCH[arch]
    return BY_TYPE.get(d.get("model_type", ""))
