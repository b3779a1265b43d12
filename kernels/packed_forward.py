"""SpecFold's folded verify on the CPU in plain PyTorch float32: cost follows the recomputed rows.

Per layer: the gate (kernels.gate.recompute_flags) → the recomputed (branch, position) rows gathered once
into a packed list → RMSNorm + one matmul per projection (the model's own modules) on that list only →
attention: the prefix state (output, log-sum-exp) of the packed rows over the shared prefix, then every row
takes its source's query and prefix state and merges in its own branch's N block keys, exactly as the
kernels' folded correction does (in log-sum-exp form, float32, nothing subtracted) → o_proj and the
residual on every row → the FFN on the packed rows (ffn_gate=paper: the same rows; strict: a second gate),
every row adding its source's FFN output. Sources resolve through an ancestor table built once per forward
(no per-branch loop); one read-back of the counters per forward. Same gate and contract as the float64
reference (kernels/reference.py), which is its test oracle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from backend.model.transformer import DecoderLayer, KVContext
from kernels.gate import parent_rows, recompute_flags
from kernels.reference import FoldedForward, shared_prefix, shared_slots


def take(t: Tensor, index: Tensor) -> Tensor:
    """t[index] along dim 0 for any index shape, through index_select (a third of advanced indexing's time on
    these sizes)."""
    return t.index_select(0, index.flatten()).view(*index.shape, *t.shape[1:])


def ancestor_table(parents: list[int], device: torch.device) -> Tensor:
    """[R, A] long: row i, its parent, grandparent, …, the main row 0, padded with 0 to the deepest chain."""
    chains = []
    for i in range(len(parents)):
        chain = [i]
        while chain[-1] != 0:
            chain.append(parents[chain[-1]])
        chains.append(chain)
    depth = max(len(c) for c in chains)
    return torch.tensor([c + [0] * (depth - len(c)) for c in chains], dtype=torch.long, device=device)


@dataclass
class Packing:
    """One gate's recomputed rows: their flat indices [M] and, per (branch, position), its source's index
    into that packed list [R, N]."""
    rows: Tensor
    source: Tensor

    @classmethod
    def of(cls, recompute: Tensor, ancestors: Tensor) -> Packing:
        """From recompute flags [R, N] (row 0 all set) and the ancestor table."""
        r, n = recompute.shape
        flat = recompute.flatten()
        first = take(recompute, ancestors).to(torch.uint8).argmax(1)   # [R, N]: the first recomputing ancestor
        src = ancestors.gather(1, first) * n + torch.arange(n, device=recompute.device)
        return cls(flat.nonzero()[:, 0], take(flat.cumsum(0) - 1, src))


def attention_lse(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Unmasked softmax attention of q [B, Hkv, L, hd] over k, v [B, Hkv, S, hd] (a query group stacked along
    L shares its KV head) -> output [B, Hkv, L, hd] and log-sum-exp [B, Hkv, L], float32. ATen's fused CPU
    flash-attention kernel (the public SDPA does not return the log-sum-exp that merging states needs);
    `attention_lse_plain` on other devices."""
    q, k, v = q.float(), k.float(), v.float()
    if q.device.type != "cpu":
        return attention_lse_plain(q, k, v)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
    return out, lse


def attention_lse_plain(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """`attention_lse` in plain ops (scores materialised)."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def folded_attention(q: Tensor, k: Tensor, v: Tensor, source: Tensor, prefix_k: Tensor,
                     prefix_v: Tensor) -> Tensor:
    """Attention [R, N, H*hd] (float32) of every (branch, position) over [shared prefix ‖ its branch's block],
    from the packed q [M, H, hd], k, v [M, Hkv, hd]. The prefix state (output, log-sum-exp) is computed for
    the packed rows only; every row takes its source's query and prefix state and merges in the state over
    the N block keys of its own branch (the sources' rows recomputed them, so this is exact)."""
    m, heads, hd = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    r, n = source.shape
    # the block: row (r, n) queries with its source's q; a query group g stacked along L as g·N + n
    q_block = take(q, source).view(r, n, kv_heads, group, hd).permute(0, 2, 3, 1, 4).reshape(r, kv_heads, group * n, hd)
    o_b, lse_b = attention_lse(q_block, take(k, source).transpose(1, 2), take(v, source).transpose(1, 2))
    o_b = o_b.view(r, kv_heads, group, n, hd).permute(0, 3, 1, 2, 4)          # [R, N, Hkv, G, hd]
    lse_b = lse_b.view(r, kv_heads, group, n).permute(0, 3, 1, 2)
    if prefix_k.shape[0] == 0:
        return o_b.reshape(r, n, heads * hd)
    q_pre = q.view(m, kv_heads, group, hd).permute(1, 2, 0, 3).reshape(1, kv_heads, group * m, hd)
    o_p, lse_p = attention_lse(q_pre, prefix_k.transpose(0, 1)[None], prefix_v.transpose(0, 1)[None])
    o_p = take(o_p.view(kv_heads, group, m, hd).permute(2, 0, 1, 3), source)     # the source's prefix state
    lse_p = take(lse_p.view(kv_heads, group, m).permute(2, 0, 1), source)
    # weights exp(lse_p − lse) and exp(lse_b − lse), lse = logaddexp(lse_p, lse_b): σ(lse_p − lse_b) and its rest
    out = torch.empty(r, n, kv_heads, group, hd, dtype=o_b.dtype, device=o_b.device)   # heads in q's order
    torch.lerp(o_b, o_p, torch.sigmoid(lse_p - lse_b)[..., None], out=out)
    return out.view(r, n, heads * hd)


@dataclass
class PackedFoldedForward(FoldedForward):
    """FoldedForward (same contract, gate and counters) in float32 PyTorch, work on the recomputed rows."""

    def __call__(self, ids: Tensor, positions: Tensor, attn: str = "block", kv: KVContext | None = None,
                 mask: Tensor | None = None, lora: bool = False) -> Tensor:
        self.check_call(attn, mask)
        model = self.model
        r, n = ids.shape
        parents = parent_rows(self.parents, ids.device)
        ancestors = ancestor_table(self.parents, ids.device)
        cos, sin, q_scale = model.rotary(positions[:1])      # rows share positions (the model's RoPE variant)
        h = model.embed_tokens(ids)
        slots = shared_slots(kv) if kv is not None else None
        counts = []
        for index, layer in enumerate(cast(list[DecoderLayer], model.layers)):
            rec = recompute_flags(h, parents, self.delta)
            pack = Packing.of(rec, ancestors)
            pos = pack.rows % n
            x = layer.input_layernorm(take(h.flatten(0, 1), pack.rows))
            q, k, v = layer.self_attn.qkv(x[None], cos[:, pos], sin[:, pos], lora,
                                          None if q_scale is None else q_scale[:, pos])
            prefix_k, prefix_v = shared_prefix(kv, slots, index, k)
            o = folded_attention(q[0], k[0], v[0], pack.source, prefix_k, prefix_v)
            h += layer.self_attn.o_proj(o.to(h.dtype), lora)      # h is this forward's own (from the embedding)
            ffn_rec = rec
            if self.ffn_gate == "strict":
                ffn_rec = recompute_flags(h, parents, self.delta)
                pack = Packing.of(ffn_rec, ancestors)
            h += take(layer.ffn(take(h.flatten(0, 1), pack.rows), lora), pack.source)
            counts.append(torch.stack([rec.sum(1), ffn_rec.sum(1)]))
        self.recomputed, self.ffn_recomputed = torch.stack(counts).transpose(0, 1).tolist()   # one read-back
        return model.logits(h)
