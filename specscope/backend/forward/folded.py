"""A whole SpecFold verification forward through the kernels: per layer gate → sources → packed QKV →
prefix+block attention (recomputed rows) → folded correction (folded rows) → o_proj and residual on every
row → (ffn_gate=strict: FFN gate → sources) → packed FFN → every row adds its source's FFN output.

Same contract (backend/forward/fold_contract.py) and counters as the float64 oracle of the tests. The ops run as
Triton kernels on CUDA tensors and as their PyTorch twins elsewhere (`triton` forces either)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from specscope.backend.forward.fold_contract import FoldedForward, shared_slots
from specscope.backend.forward.packed import PackedFoldedForward
from specscope.backend.forward.plan import Fold, FoldCounts, ForwardPlan, ForwardResult
from specscope.backend.model.transformer import DecoderLayer, KVContext, Transformer
from specscope.kernels import attention, ffn, gate, on_triton, qkv, sources


@dataclass(frozen=True)
class FoldOps:
    """The six SpecFold layer steps, all Triton kernels or all PyTorch twins."""
    gate: Callable[..., gate.Gate]
    sources: Callable[..., Tensor]
    qkv: Callable[..., None]
    attention: Callable[..., None]
    correction: Callable[..., None]
    ffn: Callable[..., None]
    add_sources: Callable[..., None]


TRITON_OPS = FoldOps(gate.fold_gate_triton, sources.resolve_sources_triton, qkv.packed_qkv_triton,
                     attention.prefix_block_attention_triton, attention.folded_correction_triton,
                     ffn.packed_ffn_triton, ffn.add_from_sources_triton)
TORCH_OPS = FoldOps(gate.fold_gate_torch, sources.resolve_sources_torch, qkv.packed_qkv_torch,
                    attention.prefix_block_attention_torch, attention.folded_correction_torch,
                    ffn.packed_ffn_torch, ffn.add_from_sources_torch)


def layer_weights(layer: DecoderLayer, eps: float) -> tuple[qkv.QKVWeights, ffn.FFNWeights]:
    """The layer's weights as the kernels read them: row-major [out, in] (a no-op unless the runtime stored
    them input-major for CPU matmuls, Transformer.store_weights_input_major)."""
    a, mlp = layer.self_attn, layer.mlp
    has_norm = a.cfg.qk_norm
    w = {name: getattr(a, name).weight.contiguous() for name in ("q_proj", "k_proj", "v_proj")}
    attn_w = qkv.QKVWeights(layer.input_layernorm.weight, w["q_proj"], w["k_proj"], w["v_proj"],
                            a.q_proj.bias, a.k_proj.bias, a.v_proj.bias,
                            a.q_norm.weight if has_norm else None, a.k_norm.weight if has_norm else None, eps)
    ffn_w = ffn.FFNWeights(layer.post_attention_layernorm.weight, mlp.gate_proj.weight.contiguous(),
                           mlp.up_proj.weight.contiguous(), mlp.down_proj.weight.contiguous(), eps)
    return attn_w, ffn_w


class KernelFoldedForward(FoldedForward):
    """FoldedForward (same plans and counts) through the kernels, on its own row-major copy of the layer weights,
    made once here."""

    def __init__(self, model: Transformer, triton: bool | None = None):
        super().__init__(model)
        self.triton = triton                    # None: Triton on CUDA, twins elsewhere
        with torch.no_grad():
            self.weights = [layer_weights(layer, model.cfg.rms_norm_eps)
                            for layer in cast(list[DecoderLayer], model.layers)]

    def run(self, plan: ForwardPlan) -> ForwardResult:
        fold = self.check(plan)
        if plan.adapter is not False:
            raise ValueError("the kernel backend has no LoRA path; use backend=torch")
        use_triton = on_triton(plan.ids) if self.triton is None else self.triton
        with torch.no_grad():
            return self._forward(TRITON_OPS if use_triton else TORCH_OPS, fold, plan.ids, plan.positions, plan.kv)

    def _forward(self, ops: FoldOps, fold: Fold, ids: Tensor, positions: Tensor,
                 kv: KVContext | None) -> ForwardResult:
        model, cfg = self.model, self.model.cfg
        r, n = ids.shape
        cos, sin, q_scale = model.rotary(positions[:1])
        if q_scale is not None:
            raise ValueError("the kernel pipeline has no llama-4 query scale; use backend=torch")
        cos, sin = (t[0, :, 0].contiguous() for t in (cos, sin))
        h = model.embed_tokens(ids).reshape(r * n, -1)
        parents = gate.parent_rows(list(fold.parents), ids.device)
        blank = h.new_zeros(1, cfg.num_key_value_heads, cfg.head_dim)       # K/V memory when there is no prefix
        # the shared prefix's slot list, checked once; every layer reads its K/V in place through it
        slots = shared_slots(kv).int() if kv is not None else torch.zeros(0, dtype=torch.int32, device=ids.device)
        counts = []
        for index, layer in enumerate(cast(list[DecoderLayer], model.layers)):
            cache_k, cache_v = (kv.cache.k[index], kv.cache.v[index]) if kv is not None else (blank, blank)
            h, layer_counts = fold_layer(ops, layer, self.weights[index], h.view(r, n, -1), parents, fold.delta,
                                         cos, sin, cache_k, cache_v, slots, fold.ffn_gate)
            counts.append(layer_counts)
        qkv_counts, ffn_counts = torch.stack(counts).transpose(0, 1).tolist()   # one read-back
        return ForwardResult(model.logits(h.view(r, n, -1)), FoldCounts(qkv_counts, ffn_counts))


def fold_layer(ops: FoldOps, layer: DecoderLayer, weights: tuple[qkv.QKVWeights, ffn.FFNWeights], h: Tensor,
               parents: Tensor, delta: float, cos: Tensor, sin: Tensor, cache_k: Tensor, cache_v: Tensor,
               slots: Tensor, ffn_gate: str = "paper") -> tuple[Tensor, Tensor]:
    """One SpecFold layer on h [R, N, D] (parents from gate.parent_rows; the layer's kernel weights from
    layer_weights) -> (h' [R*N, D], recompute counts [2, R]: QKV and FFN per branch, left on the device)."""
    cfg = layer.self_attn.cfg
    r, n, _ = h.shape
    attn_w, ffn_w = weights
    heads, kv_heads, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = ops.gate(h, parents, delta)
    src = ops.sources(g.recompute, parents)
    h = h.reshape(r * n, -1)
    q_t = h.new_empty(r * n, heads, hd)          # written at recomputed rows; folded slots are never read
    k_t, v_t = h.new_empty(r * n, kv_heads, hd), h.new_empty(r * n, kv_heads, hd)
    ops.qkv(h, g.recomputed_rows, attn_w, cos, sin, q_t, k_t, v_t)
    o_t = h.new_empty(r * n, heads, hd)
    state = attention.PrefixState.empty(r * n, heads, hd, h.device)
    ops.attention(q_t, k_t, v_t, g.recomputed_rows, src, cache_k, cache_v, slots, o_t, state)
    ops.correction(q_t, k_t, v_t, g.folded_rows, src, o_t, state)
    h = h + layer.self_attn.o_proj(o_t.flatten(1))
    g_ffn, src_ffn = g, src
    if ffn_gate == "strict":
        g_ffn = ops.gate(h.view(r, n, -1), parents, delta)
        src_ffn = ops.sources(g_ffn.recompute, parents)
    table = h.new_empty(r * n, h.shape[1])
    ops.ffn(h, g_ffn.recomputed_rows, ffn_w, table)
    ops.add_sources(h, table, src_ffn)
    return h, torch.stack([g.branch_counts, g_ffn.branch_counts])


FOLD_BACKENDS = ("torch", "triton")
"""torch: float32 packed PyTorch (the CPU path); triton: the kernels (their PyTorch twins off CUDA)."""


def folded_backend(model: Transformer, backend: str = "torch") -> FoldedForward:
    """SpecFold's folded verify backend by name (FOLD_BACKENDS): `run(plan)` of a plan whose `fold` gives the
    branch tree and the gate, its ForwardResult carrying the fold counts."""
    if backend == "torch":
        return PackedFoldedForward(model)
    if backend == "triton":
        return KernelFoldedForward(model)
    raise ValueError(f"folded forward backend {backend!r}: expected one of {FOLD_BACKENDS}")
