"""Rotary position embeddings: default, linear, llama3 and YaRN frequencies, plus llama-4 query scaling.

Formulas follow transformers' `modeling_rope_utils` (YaRN: NTK-by-parts ramp between interpolated and
extrapolated frequencies, cos/sin scaled by the attention factor) and Ministral3's `get_llama_4_attn_scale`
(queries scaled by 1 + beta * log(1 + floor(position / original_max_position_embeddings))).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    """The RoPE variant of a checkpoint, read from its `rope_parameters` / `rope_scaling`."""
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    llama_4_scaling_beta: float | None = None


def original_max(spec: RopeSpec) -> int:
    """original_max_position_embeddings of a scaled RoPE (config.py refuses a scaled one without it)."""
    if spec.original_max_position_embeddings is None:
        raise ValueError(f"rope type {spec.rope_type!r} needs original_max_position_embeddings")
    return spec.original_max_position_embeddings


def _yarn(base: Tensor, spec: RopeSpec, dim: int, theta: float) -> tuple[Tensor, float]:
    """YaRN inverse frequencies and cos/sin attention factor (transformers' _compute_yarn_parameters)."""
    factor, orig = spec.factor, original_max(spec)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = spec.attention_factor
    if attn is None:
        attn = (mscale(factor, spec.mscale) / mscale(factor, spec.mscale_all_dim)
                if spec.mscale and spec.mscale_all_dim else mscale(factor))

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(spec.beta_fast), correction_dim(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    return base / factor * (1 - extrapolation) + base * extrapolation, float(attn)


def _llama3(base: Tensor, spec: RopeSpec) -> Tensor:
    """Llama 3.x frequency-dependent interpolation (transformers' _compute_llama3_parameters)."""
    orig = original_max(spec)
    low_wavelen, high_wavelen = orig / spec.low_freq_factor, orig / spec.high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / spec.factor, base)
    smooth = (orig / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor)
    smoothed = (1 - smooth) * scaled / spec.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def inv_freq(spec: RopeSpec, head_dim: int, theta: float) -> tuple[Tensor, float]:
    """Inverse frequencies [head_dim / 2] and the factor cos/sin are multiplied by."""
    base = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)
    if spec.rope_type == "linear":
        return base / spec.factor, 1.0
    if spec.rope_type == "llama3":
        return _llama3(base, spec), 1.0
    if spec.rope_type == "yarn":
        return _yarn(base, spec, head_dim, theta)
    return base, 1.0


class Rotary:
    """cos/sin tables and the per-position query scale of one model's RoPE variant (always fp32: not a
    module buffer, so model.to(bfloat16) leaves the frequencies exact)."""

    def __init__(self, spec: RopeSpec, head_dim: int, theta: float):
        self.inv_freq, self.attention_factor = inv_freq(spec, head_dim, theta)
        self.spec = spec

    def __call__(self, positions: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """cos, sin [B, Q, 1, hd] (fp32) and the query scale [B, Q, 1, 1] (None when unscaled)."""
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device)
        emb = torch.cat([freqs, freqs], dim=-1)[:, :, None, :]
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin, self.query_scale(positions)

    def query_scale(self, positions: Tensor) -> Tensor | None:
        """Llama-4 long-context query scaling, 1 + beta * log(1 + floor(pos / original_max))."""
        beta = self.spec.llama_4_scaling_beta
        if not beta:
            return None
        orig = original_max(self.spec)
        return (1 + beta * torch.log1p(torch.floor(positions.float() / orig)))[..., None, None]
