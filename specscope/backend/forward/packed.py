"""SpecFold's folded verify on the CPU in PyTorch float32: cost follows the recomputed rows.

Per layer: the gate (kernels.gate.recompute_flags) and the packing of the recomputed (branch, position) rows
→ those rows gathered once and RMSNormed → one matmul per projection (the model's own modules) on that list
only, then q/k-norm and RoPE (each of these three steps one C call on a float32 CPU, kernels/cpu_fold.c, else
the model's tensor ops) → attention: the prefix state (output,
log-sum-exp) of the packed rows over the shared prefix, then every row takes its source's query and prefix
state and merges in its own branch's N block keys, exactly as the kernels' folded correction does (in
log-sum-exp form, float32, nothing subtracted; the two states weighted by σ(lse_p − lse_b) and its complement,
one lerp) → o_proj and the residual on every row → the FFN on the packed rows (ffn_gate=paper: the same rows;
strict: a second gate), every row adding its source's FFN output. Sources resolve through an ancestor table
built once per forward (no per-branch loop); one read-back of the counters per forward. Same gate and
contract (backend/forward/fold_contract.py) as the tests' float64 oracle (tests/support/fold_oracle.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from specscope.backend.forward.fold_contract import FoldedForward, adapter_rows, shared_prefix, shared_slots
from specscope.backend.forward.plan import FoldCounts, ForwardPlan, ForwardResult
from specscope.backend.model.transformer import Attention, DecoderLayer, LoRA, RMSNorm
from specscope.kernels import cpu_fold
from specscope.kernels.gate import parent_rows, recompute_flags


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
    """One gate's recomputed rows: their flat indices [M], per (branch, position) its source's index into that
    packed list [R, N], and the recomputed positions per branch [R]."""
    rows: Tensor
    source: Tensor
    counts: Tensor

    @classmethod
    def of(cls, recompute: Tensor, ancestors: Tensor) -> Packing:
        """From recompute flags [R, N] (row 0 all set) and the ancestor table."""
        r, n = recompute.shape
        flat = recompute.flatten()
        first = take(recompute, ancestors).to(torch.uint8).argmax(1)   # [R, N]: the first recomputing ancestor
        src = ancestors.gather(1, first) * n + torch.arange(n, device=recompute.device)
        return cls(flat.nonzero()[:, 0], take(flat.cumsum(0) - 1, src), recompute.sum(1))

    @classmethod
    def gate(cls, h: Tensor, parents: Tensor, ancestors: Tensor, delta: float) -> Packing:
        """The gate (kernels.gate.recompute_flags) on layer inputs h [R, N, D] and its packing: one C call on a
        float32 CPU (kernels/cpu_fold.c), else tensor ops. parents [R], any int dtype."""
        packed = cpu_fold.fold_gate(h, parents, ancestors, delta)
        return cls.of(recompute_flags(h, parents, delta), ancestors) if packed is None else cls(*packed)


@dataclass
class BlockRope:
    """The block's RoPE tables cos, sin [N, hd] and query scale [N] (None: unscaled), from the model's Rotary."""
    cos: Tensor
    sin: Tensor
    q_scale: Tensor | None

    @classmethod
    def of(cls, cos: Tensor, sin: Tensor, q_scale: Tensor | None) -> BlockRope:
        """From the Rotary's cos, sin [1, N, 1, hd] and scale [1, N, 1, 1] of one row of positions."""
        n, hd = cos.shape[1], cos.shape[-1]
        return cls(cos.reshape(n, hd), sin.reshape(n, hd), None if q_scale is None else q_scale.reshape(n))


def norm_packed(norm: RMSNorm, h: Tensor, rows: Tensor) -> Tensor:
    """norm(h[rows]) for h [R*N, D]: one C call where it applies."""
    out = cpu_fold.norm_rows(h, rows, norm.weight, norm.eps)
    return norm(take(h, rows)) if out is None else out


def packed_qkv(attn: Attention, x: Tensor, rope: BlockRope, pos: Tensor,
               lora: LoRA) -> tuple[Tensor, Tensor, Tensor]:
    """Attention.qkv on packed rows x [M, D] at block positions pos [M] (lora: bool, or the rows' map [1, M]) -> q
    [M, H, hd], k, v [M, Hkv, hd]: the model's projections, then its q/k-norm, RoPE and query scale (one C call
    each for q and k where it applies)."""
    q, k, v = (t[0] for t in attn.project(x[None], lora))
    q_norm, k_norm = ((attn.q_norm.weight, attn.q_norm.eps), (attn.k_norm.weight, attn.k_norm.eps)) \
        if attn.cfg.qk_norm else (None, None)
    if cpu_fold.position_qk(q, k, q_norm, k_norm, rope.cos, rope.sin, pos, rope.q_scale):
        return q, k, v
    scale = None if rope.q_scale is None else rope.q_scale[pos][:, None, None]
    q, k = attn.position(q, k, rope.cos[pos][:, None], rope.sin[pos][:, None], scale)
    return q, k, v


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
    # row (r, n) queries with its source's q, a query group g stacked along L as g·N + n: each operand gathered
    # straight into the layout the attention wants, by flat (row, head) indices [R, Hkv, G, N] / [R, Hkv, N]
    head = torch.arange(heads, device=q.device).view(1, kv_heads, group, 1)
    kv_head = torch.arange(kv_heads, device=q.device).view(1, kv_heads, 1)
    q_rows = source[:, None, None, :] * heads + head
    kv_rows = source[:, None, :] * kv_heads + kv_head
    o_b, lse_b = attention_lse(take(q.reshape(m * heads, hd), q_rows).view(r, kv_heads, group * n, hd),
                               take(k.reshape(m * kv_heads, hd), kv_rows), take(v.reshape(m * kv_heads, hd), kv_rows))
    o_b = o_b.view(r, kv_heads, group, n, hd)
    out = torch.empty(r, n, kv_heads, group, hd, dtype=o_b.dtype, device=o_b.device)   # heads in q's order
    if prefix_k.shape[0] == 0:
        out.permute(0, 2, 3, 1, 4).copy_(o_b)
        return out.view(r, n, heads * hd)
    q_pre = q.view(m, kv_heads, group, hd).permute(1, 2, 0, 3).reshape(1, kv_heads, group * m, hd)
    o_p, lse_p = attention_lse(q_pre, prefix_k.transpose(0, 1)[None], prefix_v.transpose(0, 1)[None])
    pre_rows = head * m + source[:, None, None, :]                      # the source's prefix state, [R, Hkv, G, N]
    o_p, lse_p = take(o_p.reshape(heads * m, hd), pre_rows), take(lse_p.reshape(heads * m), pre_rows)
    # weights exp(lse_p − lse) and exp(lse_b − lse), lse = logaddexp(lse_p, lse_b): σ(lse_p − lse_b) and its rest
    torch.lerp(o_b, o_p, torch.sigmoid(lse_p - lse_b.view(r, kv_heads, group, n))[..., None],
               out=out.permute(0, 2, 3, 1, 4))
    return out.view(r, n, heads * hd)


@dataclass
class PackedFoldedForward(FoldedForward):
    """FoldedForward (same plans, gate and counts) in float32 PyTorch, work on the recomputed rows."""

    def run(self, plan: ForwardPlan) -> ForwardResult:
        fold, model, kv, lora = self.check(plan), self.model, plan.kv, plan.adapter
        ids = plan.ids
        r, n = ids.shape
        parents = parent_rows(list(fold.parents), ids.device)
        ancestors = ancestor_table(list(fold.parents), ids.device)
        rope = BlockRope.of(*model.rotary(plan.positions[:1]))   # rows share positions (the model's RoPE variant)
        h = model.embed_tokens(ids)
        slots = shared_slots(kv) if kv is not None else None
        counts = []
        for index, layer in enumerate(cast(list[DecoderLayer], model.layers)):
            pack = ffn_pack = Packing.gate(h, parents, ancestors, fold.delta)
            pos = pack.rows % n
            x = norm_packed(layer.input_layernorm, h.flatten(0, 1), pack.rows)
            q, k, v = packed_qkv(layer.self_attn, x, rope, pos, adapter_rows(lora, pack.rows[None]))
            prefix_k, prefix_v = shared_prefix(kv, slots, index, k)
            o = folded_attention(q, k, v, pack.source, prefix_k, prefix_v)
            h += layer.self_attn.o_proj(o.to(h.dtype), lora)      # h is this forward's own (from the embedding)
            if fold.ffn_gate == "strict":
                ffn_pack = Packing.gate(h, parents, ancestors, fold.delta)
            ffn_rows = take(h.flatten(0, 1), ffn_pack.rows)
            h += take(layer.ffn(ffn_rows, adapter_rows(lora, ffn_pack.rows)), ffn_pack.source)
            counts.append(torch.stack([pack.counts, ffn_pack.counts]))
        qkv, ffn = torch.stack(counts).transpose(0, 1).tolist()   # one read-back
        return ForwardResult(model.logits(h), FoldCounts(qkv, ffn))
