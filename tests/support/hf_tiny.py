"""Tiny random HF models written by transformers itself, for the cross-check tests."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from specscope.backend.model.checkpoint import DEFAULT_CHECKPOINT

VOCAB = 256
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
YARN = dict(rope_type="yarn", rope_theta=1_000_000.0, factor=16.0, original_max_position_embeddings=4,
            beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """HF inits biases to 0, norms to 1 and LoRA B to 0: make every parameter random so nothing is untested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.15 * noise)


def randomize_lora(model: torch.nn.Module, scale: float, seed: int) -> None:
    """A peft model's LoRA A and B random (peft starts B at 0, an adapter that changes nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(scale * torch.randn(p.shape, generator=g))


def save_hf(config, folder: Path, seed: int = 1):
    """A random HF causal LM of `config`, saved to folder with the shipped tokenizer's files beside it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(DEFAULT_CHECKPOINT / name, folder / name)
    return model.eval()


def ids(batch: int = 2, seq: int = 14, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
