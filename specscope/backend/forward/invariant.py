"""The batch-invariant torch forward (`--forward torch`): several plans' row groups as one forward, on any device,
each row's numbers bitwise what they are when its plan runs alone.

The rows of every plan are packed flat, one after another, and padded to whole tiles (kernels.invariant.row_tile).
What mixes a row with others runs in batch-invariant ops (`specscope/kernels/invariant.py`): every linear in fixed
tiles of rows (the Triton kernel on CUDA), the norms and SiLU in fixed slices of rows; the embedding, RoPE (from a
table built in fixed chunks of positions), residual adds and the adapter's on/off choice are per element and exact.
Attention runs per plan, with the plan's own prefix, mask and K/V writes: the call it makes alone. So a row never
depends on how many rows share its forward, what they are or where it sits among them, and requests of any modes
may share forwards on this backend as on the fused CPU step. Its numbers are not the eager backend's (a tiled
matmul sums in another order than a one-row GEMV): runs record the forward backend they ran on
(`Runtime.backend_name`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from specscope.backend.forward.plan import ForwardPlan, ForwardResult
from specscope.backend.model.transformer import DecoderLayer, LoRALinear, Transformer, apply_rope, attend, build_mask
from specscope.kernels.invariant import by_rows, linear, row_tile, silu

ROPE_CHUNK = 64
"""Positions whose RoPE numbers one call computes: a position's cos/sin come from the same call however far the table
reaches (an elementwise cos over more positions may round one of them on another path)."""


class PositionTable:
    """cos, sin [P, head_dim] and the query scale [P] (None: unscaled) of positions 0..P-1, by the model's own Rotary,
    ROPE_CHUNK positions a call; grown by doubling when a forward reaches past P."""

    def __init__(self, model: Transformer, device: torch.device):
        self.rotary, self.device = model.rotary, device
        self.cos = self.sin = torch.empty(0, model.cfg.head_dim, device=device)
        self.q_scale: Tensor | None = None

    def cover(self, last: int) -> None:
        size = self.cos.shape[0]
        if last < size:
            return
        grown = max(ROPE_CHUNK, 1 << last.bit_length())
        chunks = [self.rotary(torch.arange(s, s + ROPE_CHUNK, device=self.device)[None])
                  for s in range(size, grown, ROPE_CHUNK)]
        self.cos = torch.cat([self.cos, *(c.reshape(ROPE_CHUNK, -1) for c, _, _ in chunks)])
        self.sin = torch.cat([self.sin, *(s.reshape(ROPE_CHUNK, -1) for _, s, _ in chunks)])
        if chunks[0][2] is not None:
            self.q_scale = torch.cat([*([] if self.q_scale is None else [self.q_scale]),
                                      *(q.reshape(ROPE_CHUNK) for _, _, q in chunks if q is not None)])


@dataclass
class Group:
    """One plan's rows in the packed forward: flat rows first..first + requests * queries, and its attention mask
    (None: unmasked)."""
    plan: ForwardPlan
    first: int
    mask: Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.plan.ids.shape[0], self.plan.ids.shape[1]

    @property
    def rows(self) -> slice:
        r, q = self.shape
        return slice(self.first, self.first + r * q)


class InvariantForward:
    """The forward backend of `--forward torch`: `run(plan)`, and `run_ragged(plans)` for several plans in one
    forward (never None: it takes every plan but a fold). Reads the model's own weights, in the layout the model
    keeps (the same numbers in either layout, as every tile's matmul has one shape)."""

    name = "torch"

    def __init__(self, model: Transformer, tile: int | None = None):
        weight = model.embed_tokens.weight
        self.model, self.tile = model, tile or row_tile(weight.device)
        self.head = weight if model.lm_head is None else model.lm_head.weight
        self.rope = PositionTable(model, weight.device)
        self.has_adapter = model.has_lora
        """Whether any projection has an adapter (as when built: build anew after attaching one)."""

    def run(self, plan: ForwardPlan) -> ForwardResult:
        return self.run_ragged([plan])[0]

    def run_ragged(self, plans: Sequence[ForwardPlan]) -> list[ForwardResult]:
        """One forward of every plan's rows (each plan's own prefix, positions, attention or mask, K/V writes and
        adapter rows); each result is what the plan gives alone, bit for bit."""
        if any(p.fold is not None for p in plans):
            raise ValueError("the torch forward does not fold; pick a folded backend")
        groups, first = [], 0
        for p in plans:
            r, q = p.ids.shape
            groups.append(Group(p, first, p.mask if p.mask is not None else build_mask(q, p.attn, p.kv, r,
                                                                                       p.ids.device)))
            first += r * q
        padded = -(-first // self.tile) * self.tile
        ids = F.pad(torch.cat([p.ids.reshape(-1) for p in plans]), (0, padded - first))
        positions = F.pad(torch.cat([p.positions.reshape(-1) for p in plans]), (0, padded - first))
        self.rope.cover(int(positions.max()))
        cos, sin = self.rope.cos[positions][:, None], self.rope.sin[positions][:, None]
        q_scale = None if self.rope.q_scale is None else self.rope.q_scale[positions][:, None, None]
        on = self.adapter_rows(plans, padded)
        h = F.embedding(ids, self.model.embed_tokens.weight)
        for index, layer in enumerate(self.model.layers):
            h = self.layer(index, cast(DecoderLayer, layer), h, cos, sin, q_scale, on, groups)
        normed = by_rows(self.model.norm, h, self.tile)
        logits = linear(normed, self.head, self.tile)
        return [ForwardResult(logits[g.rows].view(*g.shape, -1),
                              hidden=normed[g.rows].view(*g.shape, -1) if g.plan.hidden else None) for g in groups]

    def adapter_rows(self, plans: Sequence[ForwardPlan], padded: int) -> Tensor | None:
        """Per packed row, whether the adapter is on (None: on at no row, or the model has none)."""
        flags = [torch.full((p.ids.numel(),), p.adapter, dtype=torch.bool, device=p.ids.device)
                 if isinstance(p.adapter, bool) else p.adapter.reshape(-1).to(torch.bool) for p in plans]
        on = torch.cat(flags)
        if not self.has_adapter or not bool(on.any()):
            return None
        return F.pad(on, (0, padded - on.numel()))

    def linear(self, module: LoRALinear, x: Tensor, on: Tensor | None) -> Tensor:
        """The projection of rows x, with the adapter's delta added at the rows where it is on."""
        y = linear(x, module.weight, self.tile)
        if module.bias is not None:
            y = y + module.bias
        if on is None or module.lora_A is None or module.lora_B is None:
            return y
        delta = linear(linear(x, module.lora_A, self.tile), module.lora_B, self.tile) * module.lora_scale
        return torch.where(on[:, None], y + delta, y)

    def layer(self, index: int, layer: DecoderLayer, h: Tensor, cos: Tensor, sin: Tensor, q_scale: Tensor | None,
              on: Tensor | None, groups: list[Group]) -> Tensor:
        attn, mlp, cfg = layer.self_attn, layer.mlp, self.model.cfg
        rows, hd = h.shape[0], cfg.head_dim
        x = by_rows(layer.input_layernorm, h, self.tile)
        q = self.linear(attn.q_proj, x, on).view(rows, -1, hd)
        k = self.linear(attn.k_proj, x, on).view(rows, -1, hd)
        v = self.linear(attn.v_proj, x, on).view(rows, -1, hd)
        if cfg.qk_norm:
            q, k = by_rows(attn.q_norm, q, self.tile), by_rows(attn.k_norm, k, self.tile)
        q = apply_rope(q, cos, sin)
        if q_scale is not None:
            q = q * q_scale.to(q.dtype)
        k = apply_rope(k, cos, sin)
        out = h.new_zeros(rows, q.shape[1] * hd)
        for g in groups:
            out[g.rows] = self.attention(index, g, q[g.rows], k[g.rows], v[g.rows]).flatten(0, 1)
        h = h + self.linear(attn.o_proj, out, on)
        x = by_rows(layer.post_attention_layernorm, h, self.tile)
        act = silu(self.linear(mlp.gate_proj, x, on), self.tile) * self.linear(mlp.up_proj, x, on)
        return h + self.linear(mlp.down_proj, act, on)

    @staticmethod
    def attention(index: int, g: Group, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """One plan's attention in layer `index`, as the model computes it for the plan alone: its rows' K/V
        written, then its queries over [prefix ‖ own rows] under its mask -> [R, Q, H * hd]. Fresh copies of the
        rows, so the call's inputs sit where they would alone (aligned allocations)."""
        r, n = g.shape
        q, k, v = (t.reshape(r, n, *t.shape[1:]).clone() for t in (q, k, v))
        kv = g.plan.kv
        if kv is not None:
            pk, pv = kv.gather(index)
            kv.write(index, k, v)
            k, v = torch.cat([pk, k], dim=1), torch.cat([pv, v], dim=1)
        return attend(q, k, v, g.mask)
