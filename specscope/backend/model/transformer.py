"""Our decoder (Qwen3/Qwen2/Llama/Mistral/Ministral3 family): paged-KV attention, attention modes, LoRA
toggle (per forward or per query position), layer hooks.

The decoder itself has no logit convention: a loaded model declares per attention mode whether position i's
logits predict token i+1 (shifted) or token i (LoadedModel.logits_shifted).
Module names mirror the HF layout (`layers.{i}.self_attn.q_proj`, ...) so checkpoints map one to one.
"""
from __future__ import annotations

import functools
import math
import mmap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specscope.backend.model.config import ModelConfig
from specscope.backend.model.rope import RopeSpec, Rotary

AttnMode = Literal["causal", "block", "strict_causal"]
ATTN_MODES: tuple[str, ...] = ("causal", "block", "strict_causal")
LoRA = bool | Tensor
"""A forward's adapter switch: on/off for the whole forward, or a bool [B, Q] (on at those query positions)."""
Hook = Callable[[int, str, Tensor], None]
"""Called as hook(layer_index, point, tensor) at points hidden_in, q, k, v, attn_out, ffn_out, hidden_out."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """HF's formula (fp32 statistics); on CPU cheaper than F.rms_norm, which runs more kernels."""
        h = x if x.dtype == torch.float32 else x.float()   # the conversions are calls too: skipped when no-ops
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (h if h.dtype == x.dtype else h.to(x.dtype))


class LoRALinear(nn.Module):
    """A linear layer with an optional rank-r adapter that is applied only when a forward asks for it."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int = 0, alpha: float = 16.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, std=0.02)
        self.lora_A: nn.Parameter | None = None
        self.lora_B: nn.Parameter | None = None
        self.lora_scale = 0.0
        if rank:
            self.add_adapter(rank, alpha)

    def add_adapter(self, rank: int, alpha: float, rslora: bool = False) -> None:
        """A fresh rank-r adapter (B = 0: the identity until trained), scaled alpha/r (rsLoRA: alpha/sqrt(r))."""
        w = self.weight  # the adapter lives where the layer lives (dtype, device), even after model.to(...)
        self.lora_A = nn.Parameter(torch.randn(rank, w.shape[1], device=w.device).to(w.dtype) / rank**0.5)
        self.lora_B = nn.Parameter(torch.zeros(w.shape[0], rank, dtype=w.dtype, device=w.device))
        self.lora_scale = alpha / (rank**0.5 if rslora else rank)

    def forward(self, x: Tensor, lora: LoRA = False) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.lora_A is None or self.lora_B is None or (isinstance(lora, bool) and not lora):
            return y
        delta = F.linear(F.linear(x, self.lora_A), self.lora_B) * self.lora_scale
        if isinstance(lora, Tensor):  # per position: base output bit for bit where the adapter is off
            return torch.where(lora[..., None], y + delta, y)
        return y + delta


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Default-RoPE cos/sin tables [B, Q, 1, head_dim] for positions [B, Q] (HF rotate-half layout). A model's
    own variant (YaRN, llama3, llama-4 query scale) is `model.rotary(positions)`."""
    cos, sin, _ = Rotary(RopeSpec(), head_dim, theta)(positions)
    return cos, sin


@functools.cache
def rotate_half_sign(head_dim: int, device: torch.device) -> Tensor:
    """[-1]*half + [+1]*half: rotate_half(x) * sin == roll(x, half) * sin * sign, the same products exactly. Made
    outside inference mode, so a process that trains after an inference forward can still use it in autograd."""
    half = head_dim // 2
    with torch.inference_mode(False):
        return torch.cat([-torch.ones(half), torch.ones(head_dim - half)]).to(device)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's rotate-half RoPE in fp32, as a roll and a sign (5 ops instead of 10: a decode step is op-bound)."""
    h = x if x.dtype == torch.float32 else x.float()
    sign = rotate_half_sign(x.shape[-1], x.device)
    out = h * cos + h.roll(x.shape[-1] // 2, -1) * sin * sign
    return out if out.dtype == x.dtype else out.to(x.dtype)


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> Tensor:
    """torch.zeros, but on the CPU in a private anonymous mapping: the kernel's zero pages, each one mapped when it
    is first written. A pool sized from free memory then costs nothing until its slots are used, where
    torch.zeros wrote every byte first (12 GB and ~20 s of a `specscope run` for the default model's pool)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if torch.device(device).type != "cpu" or nbytes == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    return torch.frombuffer(pages, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)


@dataclass
class PagedKV:
    """Slot-addressed K/V memory, one row per slot per layer: k, v [layers, slots, kv_heads, head_dim]."""
    k: Tensor
    v: Tensor

    @classmethod
    def empty(cls, cfg: ModelConfig, num_slots: int, dtype: torch.dtype, device: str | torch.device) -> PagedKV:
        shape = (cfg.num_hidden_layers, num_slots, cfg.num_key_value_heads, cfg.head_dim)
        return cls(zeros(shape, dtype, device), zeros(shape, dtype, device))

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]


@dataclass
class KVContext:
    """Where one forward reads its prefix K/V from and, unless read-only, writes the chunk's K/V to."""
    cache: PagedKV
    prefix_slots: Tensor                # [B, P] slot ids of each row's committed prefix (padded)
    prefix_valid: Tensor | None = None  # [B, P] bool; None = every prefix entry is real
    write_slots: Tensor | None = None   # [B, Q]; None = read-only forward
    shared: bool = False
    """Every row reads row 0's prefix: the row groups (branches) of one request, prefix_slots an expanded view."""

    def gather(self, layer: int) -> tuple[Tensor, Tensor]:
        """The prefix K/V [B, P, Hkv, hd] of every row (one index_select per cache, cheaper than indexing; a
        shared prefix is read once)."""
        k, v = self.cache.k[layer], self.cache.v[layer]
        shape = (*self.prefix_slots.shape, *k.shape[1:])
        if self.shared:
            slots = self.prefix_slots[0]
            return k.index_select(0, slots)[None].expand(shape), v.index_select(0, slots)[None].expand(shape)
        flat = self.prefix_slots.reshape(-1)
        return k.index_select(0, flat).view(shape), v.index_select(0, flat).view(shape)

    def write(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Store K/V in the cache's dtype (under autocast a layer's K/V come out bf16 or float32, by its last op)."""
        if self.write_slots is not None:
            slots = self.write_slots.reshape(-1)
            cache_k, cache_v = self.cache.k[layer], self.cache.v[layer]
            cache_k.index_copy_(0, slots, k.reshape(-1, *k.shape[2:]).to(cache_k.dtype))
            cache_v.index_copy_(0, slots, v.reshape(-1, *v.shape[2:]).to(cache_v.dtype))


def chunk_mask(q_len: int, attn: str, device: torch.device) -> Tensor:
    """[Q, Q] bool mask of a query chunk against itself: token-causal or fully bidirectional."""
    if attn not in ATTN_MODES:
        raise ValueError(f"unknown attention mode {attn!r}; expected one of {ATTN_MODES}")
    if attn == "block":
        return torch.ones(q_len, q_len, dtype=torch.bool, device=device)
    return torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()


def build_mask(q_len: int, attn: str, kv: KVContext | None, batch: int, device: torch.device) -> Tensor | None:
    """Attention mask [B, 1, Q, P+Q] over [prefix ‖ chunk] for one attention mode; None when every row sees
    every key (a 1-row or bidirectional chunk over an unpadded prefix), so attention runs unmasked."""
    if (q_len == 1 or attn == "block") and (kv is None or kv.prefix_valid is None) and attn in ATTN_MODES:
        return None
    own = chunk_mask(q_len, attn, device)[None, None].expand(batch, 1, q_len, q_len)
    if kv is None or kv.prefix_slots.shape[1] == 0:
        return own
    p = kv.prefix_slots.shape[1]
    valid = (kv.prefix_valid if kv.prefix_valid is not None
             else torch.ones(batch, p, dtype=torch.bool, device=device))
    return torch.cat([valid[:, None, None, :].expand(batch, 1, q_len, p), own], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        r = cfg.lora_rank
        lora = {name: r if name in cfg.lora_targets else 0 for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
        self.q_proj = LoRALinear(cfg.hidden_size, cfg.q_size, cfg.qkv_bias, lora["q_proj"], cfg.lora_alpha)
        self.k_proj = LoRALinear(cfg.hidden_size, cfg.kv_size, cfg.qkv_bias, lora["k_proj"], cfg.lora_alpha)
        self.v_proj = LoRALinear(cfg.hidden_size, cfg.kv_size, cfg.qkv_bias, lora["v_proj"], cfg.lora_alpha)
        self.o_proj = LoRALinear(cfg.q_size, cfg.hidden_size, cfg.o_bias, lora["o_proj"], cfg.lora_alpha)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor, lora: LoRA,
            q_scale: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Normed input [B, Q, D] -> q [B, Q, H, hd], k and v [B, Q, Hkv, hd], RoPE applied; q_scale [B, Q, 1, 1]
        is the position-dependent query scale of llama-4-style long-context models (None: unscaled)."""
        q, k, v = self.project(x, lora)
        return (*self.position(q, k, cos, sin, q_scale), v)

    def project(self, x: Tensor, lora: LoRA) -> tuple[Tensor, Tensor, Tensor]:
        """Normed input [B, Q, D] -> q [B, Q, H, hd], k and v [B, Q, Hkv, hd] as projected (fresh tensors)."""
        b, n, _ = x.shape
        hd = self.cfg.head_dim
        return (self.q_proj(x, lora).view(b, n, -1, hd), self.k_proj(x, lora).view(b, n, -1, hd),
                self.v_proj(x, lora).view(b, n, -1, hd))

    def position(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
                 q_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """q/k-norm (when the model has it), RoPE, then the query scale, on projected q and k."""
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q, cos, sin)
        if q_scale is not None:
            q = q * q_scale.to(q.dtype)
        return q, apply_rope(k, cos, sin)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax attention of q [B, Q, H, hd] over k, v [B, K, Hkv, hd] (GQA) -> [B, Q, H*hd]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).flatten(2)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        r = cfg.lora_rank
        lora = {name: r if name in cfg.lora_targets else 0 for name in ("gate_proj", "up_proj", "down_proj")}
        self.gate_proj = LoRALinear(cfg.hidden_size, cfg.intermediate_size, False, lora["gate_proj"], cfg.lora_alpha)
        self.up_proj = LoRALinear(cfg.hidden_size, cfg.intermediate_size, False, lora["up_proj"], cfg.lora_alpha)
        self.down_proj = LoRALinear(cfg.intermediate_size, cfg.hidden_size, False, lora["down_proj"], cfg.lora_alpha)

    def forward(self, x: Tensor, lora: LoRA = False) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x, lora)) * self.up_proj(x, lora), lora)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def ffn(self, h: Tensor, lora: LoRA = False) -> Tensor:
        """FFN branch output (without the residual) for hidden states h."""
        return self.mlp(self.post_attention_layernorm(h), lora)

    def forward(self, index: int, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None,
                kv: KVContext | None, lora: LoRA, hook: Hook | None, q_scale: Tensor | None = None) -> Tensor:
        q, k, v = self.self_attn.qkv(self.input_layernorm(h), cos, sin, lora, q_scale)
        if kv is not None:
            pk, pv = kv.gather(index)
            kv.write(index, k, v)
            k, v = torch.cat([pk, k], dim=1), torch.cat([pv, v], dim=1)
        attn_out = self.self_attn.o_proj(attend(q, k, v, mask), lora)
        h = h + attn_out
        ffn_out = self.ffn(h, lora)
        if hook is not None:
            for point, t in (("q", q), ("k", k), ("v", v), ("attn_out", attn_out), ("ffn_out", ffn_out)):
                hook(index, point, t)
        return h + ffn_out


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.rope, cfg.head_dim, cfg.rope_theta)

    @property
    def has_lora(self) -> bool:
        return any(isinstance(m, LoRALinear) and m.lora_A is not None for m in self.modules())

    def store_weights_input_major(self) -> None:
        """Keep every widening projection's weight [out, in] (in < out: gate/up, the LM head, tied or not) as a
        view of [in, out] storage: the same values and shapes, but a CPU matmul of a few rows (decode, small
        verifies) streams it faster; narrowing and square ones are faster as they are, and so is every float16
        weight (its 1-row kernel wants row-major: 4x slower otherwise), see docs/performance.md. For inference
        only: save a copy made contiguous."""
        for module in self.modules():
            if (isinstance(module, (LoRALinear, nn.Linear, nn.Embedding)) and module.weight.is_contiguous()
                    and module.weight.dtype != torch.float16 and module.weight.shape[1] < module.weight.shape[0]):
                weight = module.weight
                module.weight = nn.Parameter(weight.detach().t().contiguous().t(), weight.requires_grad)

    def logits(self, h: Tensor) -> Tensor:
        """Final norm + LM head on hidden states [..., D]."""
        h = self.norm(h)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(h, w)

    def forward(self, ids: Tensor, positions: Tensor, attn: str = "causal", kv: KVContext | None = None,
                mask: Tensor | None = None, lora: LoRA = False, hook: Hook | None = None) -> Tensor:
        """Logits [B, Q, V] for a query chunk ids [B, Q] at positions [B, Q].

        The chunk attends to kv's prefix (if any) and to itself by `attn`; `mask` overrides the mask
        (a bool [Q, K] or [B, 1, Q, K] over [prefix ‖ chunk], used by training and multi-branch verify).
        `lora` switches the adapter on for the whole forward (bool) or at chosen query positions (bool [B, Q]).
        """
        b, n = ids.shape
        cos, sin, q_scale = self.rotary(positions)
        if mask is None:
            mask = build_mask(n, attn, kv, b, ids.device)
        h = self.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            if hook is not None:
                hook(i, "hidden_in", h)
            h = layer(i, h, cos, sin, mask, kv, lora, hook, q_scale)
            if hook is not None:
                hook(i, "hidden_out", h)
        return self.logits(h)


@contextmanager
def normed_hidden(model: Transformer) -> Iterator[list[Tensor]]:
    """The final norm's outputs of the forwards run inside (the hidden states the LM head reads), last one last."""
    seen: list[Tensor] = []
    hook = model.norm.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        yield seen
    finally:
        hook.remove()
