"""SpecFold's folded multi-branch forward in float64 PyTorch: the test oracle of the folded backends (the Triton
kernels and the packed CPU path, backend/forward/folded.py and packed.py).

R rows hold R block states of one request (row 0 = the main branch, `parents[i] < i` for the drafts). All
rows attend `block`-wise to the same read-only prefix and to their own block. Per layer, per draft branch i,
per position n, the gate on the layer input ρ = ‖H_i[n] − H_par(i)[n]‖₂ / ‖H_par(i)[n]‖₂ decides:
ρ > δ recomputes the position; ρ ≤ δ folds it. A folded position takes its q/k/v from its *source*, the
nearest ancestor that recomputed n (fold chains resolve in one hop), and its attention output is the
source's streaming-softmax state (m, Z, O) corrected exactly for the block keys on which the two branches
differ: the source's contributions at those keys are removed, the branch's own added.

The FFN output is folded by `ffn_gate`. "paper" (default, the paper's rule): the one gate on the layer input
covers the FFN too, a folded position adds its source's FFN output, although its attention output (and so
its FFN input) may differ from the source's. "strict": a second gate, the same relative residual taken on
the FFN input (the post-attention residual stream). Only strict at δ = 0 folds nothing but bit-identical
inputs and equals the dense forward up to rounding; the paper's rule at δ = 0 is off by up to 7 in the
logits of the shipped model. QKV projection and FFN run on the recomputed rows only, packed; o_proj and
the residual adds run on every row: residual streams are never folded.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from specscope.backend.forward.fold_contract import FoldedForward, adapter_rows, shared_prefix, shared_slots
from specscope.backend.forward.folded import folded_backend
from specscope.backend.forward.plan import FoldCounts, ForwardPlan, ForwardResult
from specscope.backend.model.transformer import DecoderLayer, LoRA, Transformer
from specscope.kernels.gate import parent_rows, recompute_flags


def prefix_scores(q: Tensor, k: Tensor) -> Tensor:
    """Scaled scores [M, H, P] of queries q [M, H, hd] against the shared prefix keys k [P, Hkv, hd]
    (grouped-query heads without copying the keys)."""
    return torch.einsum("mjgd,kjd->mjgk", q.unflatten(1, (k.shape[1], -1)), k).flatten(1, 2) * q.shape[-1] ** -0.5


def prefix_weighted(p: Tensor, v: Tensor) -> Tensor:
    """Σ_k p[m, h, k] v[k] -> [M, H, hd] for weights p [M, H, P] and the shared prefix values v [P, Hkv, hd]."""
    return torch.einsum("mjgk,kjd->mjgd", p.unflatten(1, (v.shape[1], -1)), v).flatten(1, 2)


def swap_keys(m: Tensor, z: Tensor, s_old: Tensor, s_new: Tensor, diff: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Correct a source row's streaming-softmax state (running max m, denominator z [F, H]; output o) for
    a branch whose block keys differ where diff [F, N] is set. s_old / s_new [F, H, N]: scores of the shared
    query against the source's and the branch's block keys. The source's contributions at diff are removed
    and the branch's added: the branch's output is c·o + Σ_n w_old[n]·v_source[n] + Σ_n w_new[n]·v_own[n];
    returns (c [F, H], w_old, w_new [F, H, N])."""
    hide = ~diff[:, None, :]
    e_old = torch.exp(s_old.masked_fill(hide, float("-inf")) - m[..., None])
    s_new = s_new.masked_fill(hide, float("-inf"))
    m_new = torch.maximum(m, s_new.amax(-1))
    scale = torch.exp(m - m_new)
    e_new = torch.exp(s_new - m_new[..., None])
    z_new = (z - e_old.sum(-1)) * scale + e_new.sum(-1)
    return z * scale / z_new, -e_old * (scale / z_new)[..., None], e_new / z_new[..., None]


def resolve_sources(recompute: Tensor, parents: list[int]) -> Tensor:
    """src [R, N]: the nearest ancestor-or-self row that recomputed each position (rows in parents-first
    order; row 0 recomputes everything)."""
    if not bool(recompute[0].all()):
        raise ValueError("the main row (0) must recompute every position")
    src = torch.empty(recompute.shape, dtype=torch.long, device=recompute.device)
    src[0] = 0
    for i in range(1, recompute.shape[0]):
        src[i] = torch.where(recompute[i], i, src[parents[i]])
    return src


def branch_attention(q: Tensor, k: Tensor, v: Tensor, recompute: Tensor, parents: list[int],
                     prefix_k: Tensor, prefix_v: Tensor) -> Tensor:
    """Attention outputs [R, N, H, hd] (float64) of R branches, each over [shared prefix ‖ its own block].

    q [R, N, H, hd] and k, v [R, N, Hkv, hd] are read at recomputed slots only; a folded slot inherits its
    source's q/k/v. Recomputed rows get their exact state (m, z, o) over the prefix and their own block;
    a folded row is its source's state with the differing block keys swapped (`swap_keys`). Block-local
    scores are formed for all row pairs at once (N keys each: cheap); the prefix is scored for recomputed
    rows only. The state arithmetic runs in float64: removing keys that dominate a row cancels badly in
    float32 (a float32 kernel should recompute such rows or keep per-key-set partial states)."""
    r, n = recompute.shape
    src = resolve_sources(recompute, parents)
    pos = torch.arange(n, device=q.device)
    q, k, v = q[src, pos].double(), k[src, pos].double(), v[src, pos].double()
    prefix_k, prefix_v = prefix_k.double(), prefix_v.double()
    hkv, p = k.shape[2], prefix_k.shape[0]
    # s[i, n, h, b, k]: query (i, n) against block key k of branch b
    s = torch.einsum("rnjgd,bkjd->rnjgbk", q.unflatten(2, (hkv, -1)), k).flatten(2, 3) * q.shape[-1] ** -0.5
    w = torch.zeros_like(s)
    ri, rn = recompute.nonzero(as_tuple=True)
    s_rec = torch.cat([prefix_scores(q[ri, rn], prefix_k), s[ri, rn, :, ri]], dim=-1)
    m = s_rec.amax(-1)
    e = torch.exp(s_rec - m[..., None])
    z = e.sum(-1)
    e = e / z[..., None]
    w[ri, rn, :, ri] = e[..., p:]
    fi, fn = (~recompute).nonzero(as_tuple=True)
    a = src[fi, fn]
    row = torch.full((r, n), -1, dtype=torch.long, device=q.device)
    row[ri, rn] = torch.arange(ri.numel(), device=q.device)
    j = row[a, fn]
    c, w_old, w_new = swap_keys(m[j], z[j], s[fi, fn, :, a], s[fi, fn, :, fi], src[fi] != src[a])
    w[fi, fn, :, a] = w_old
    w[fi, fn, :, fi] = w_new
    out = torch.einsum("rnjgbk,bkjd->rnjgd", w.unflatten(2, (hkv, -1)), v).flatten(2, 3)
    out[ri, rn] += prefix_weighted(e[..., :p], prefix_v)
    out[fi, fn] += c[..., None] * out[a, fn]
    return out


def packed(fn: Callable[[Tensor, LoRA], Tensor], h: Tensor, recompute: Tensor, parents: list[int],
           lora: LoRA) -> Tensor:
    """fn (position-wise, with the adapter map of its rows) on the recomputed rows of h [R, N, D] only; folded rows
    take their source's."""
    ri, rn = recompute.nonzero(as_tuple=True)
    y = fn(h[ri, rn][None], adapter_rows(lora, (ri * h.shape[1] + rn)[None]))[0]
    table = y.new_empty(*recompute.shape, *y.shape[1:])
    table[ri, rn] = y
    return table[resolve_sources(recompute, parents), torch.arange(h.shape[1], device=h.device)]


class Float64FoldedForward(FoldedForward):
    """The folded verify in float64 on the model's own modules: every backend's oracle."""

    def run(self, plan: ForwardPlan) -> ForwardResult:
        fold, model, ids, kv, lora = self.check(plan), self.model, plan.ids, plan.kv, plan.adapter
        tree = list(fold.parents)
        parents = parent_rows(tree, ids.device)
        cos, sin, q_scale = model.rotary(plan.positions[:1])   # rows share positions (the model's RoPE variant)
        h = model.embed_tokens(ids)
        slots = shared_slots(kv) if kv is not None else None
        recomputed, ffn_recomputed = [], []
        for index, layer in enumerate(cast(list[DecoderLayer], model.layers)):
            rec = recompute_flags(h, parents, fold.delta)
            ri, rn = rec.nonzero(as_tuple=True)
            q, k, v = layer.self_attn.qkv(layer.input_layernorm(h[ri, rn])[None], cos[:, rn], sin[:, rn],
                                          adapter_rows(lora, (ri * rec.shape[1] + rn)[None]),
                                          None if q_scale is None else q_scale[:, rn])
            q_t, k_t, v_t = (t.new_zeros(*rec.shape, *t.shape[2:]) for t in (q, k, v))
            q_t[ri, rn], k_t[ri, rn], v_t[ri, rn] = q[0], k[0], v[0]
            prefix_k, prefix_v = shared_prefix(kv, slots, index, k)
            o = branch_attention(q_t, k_t, v_t, rec, tree, prefix_k, prefix_v)
            h = h + layer.self_attn.o_proj(o.flatten(2).to(h.dtype), lora)
            ffn_rec = recompute_flags(h, parents, fold.delta) if fold.ffn_gate == "strict" else rec
            h = h + packed(layer.ffn, h, ffn_rec, tree, lora)
            recomputed.append(rec.sum(1).tolist())
            ffn_recomputed.append(ffn_rec.sum(1).tolist())
        return ForwardResult(model.logits(h), FoldCounts(recomputed, ffn_recomputed))


def fold_backend(model: Transformer, name: str) -> FoldedForward:
    """A folded backend by name: `reference` (this oracle) or one of backend.forward.folded.FOLD_BACKENDS."""
    return Float64FoldedForward(model) if name == "reference" else folded_backend(model, name)
