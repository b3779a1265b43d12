"""The fused CPU decode step: one typed C call (kernels/cpu_decode.c) per decode forward instead of ~200 eager ops.

`fused_decode(model, cache, fallback)` returns a forward backend (`run(plan)`) that runs causal chunks of up to
MAX_CHUNK rows per request (decode steps, few-row verifies and drafts, a LoRA adapter on at any of their rows) in C
and every other plan on the fallback (the runtime's eager backend); None where it does not apply (a model not in
float32 on the CPU, no C compiler, SPECSCOPE_FUSED_DECODE=0).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import Tensor

from specscope.backend.forward.plan import Eager, ForwardBackend, ForwardPlan, ForwardResult
from specscope.backend.forward.weight_blocks import FORMATS, Packed, amx_fits, pack, pack_amx, pack_int8
from specscope.backend.model.transformer import KVContext, PagedKV, Transformer
from specscope.kernels.native import ENABLED, library, ptr

log = logging.getLogger(__name__)

LAYER_TENSORS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm",
                 "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
"""Per layer, in cpu_decode.c's enum order: norms by weight, projections by weight, then q/k/v/o biases."""
PROJECTIONS = LAYER_TENSORS[4:]
CAUSAL = ("causal", "strict_causal")
"""Attention modes whose query chunk attends causally to itself (they differ only in a model's logit convention,
which the runtime applies)."""
MAX_CHUNK = 32
"""Query rows per request the float32 fused step takes (verify chunks, short prompts' prefills); longer chunks are
compute-bound, where eager GEMMs win (the crossover: docs/performance.md)."""
MAX_AMX_CHUNK = 256
"""The same with bf16 or int8 matmuls: AMX tiles and int8 dot products stay far ahead of float32 GEMMs at any width
(a prompt's prefill, spiffy's 8 branches of 32 rows)."""
BIASES = LAYER_TENSORS[4:8]
ODD_HEAD_ROWS = 16
"""Head rows that may sit outside the head's block format, summed in float32 (an adapter's trained MASK row)."""
MATMULS = ("float32", "bf16", "int8", "int16")
"""The fused step's matmul precisions: float32 (the weights exactly, in their narrowest exact format), bf16 on
Intel AMX tiles (weights rounded to bfloat16, rows rounded where they enter a linear, float32 sums), int8 or int16
(GGUF Q4_1 / Q8_0 weight blocks, other weights rounded to Q8_0; rows rounded where they enter a linear to int8, or
to 16-bit codes dotted as two int8 planes, in blocks of 32; exact int32 sums per block). Norms, attention, softmax,
the adapter and KV stay float32. In each a row's numbers do not depend on how many rows share its forward, so the
lossless modes equal `ar` in each."""
INTEGER_MATMULS = {"int8": 1, "int16": 2}
"""The integer precisions and the int8 planes a row's codes take in each (kernels/cpu_int8.c)."""
AUTO = "auto"
"""The matmul choice: bf16 where this CPU and model can run it (AMX tiles), else int16 where the CPU has an ISA in
INT8_AUTO and the weights are GGUF blocks (which the integer formats hold exactly), else float32."""
INT8_ISAS = ("scalar", "avx2", "avx_vnni", "avx512_vnni")
"""The int8 linears' vector ISAs (kernels/int8.h's enum order); every one gives the same numbers bit for bit."""
INT8_AUTO = ("avx512_vnni",)
"""The ISAs on which `auto` takes int16: where it was measured faster than float32 with answers that agree
(docs/performance.md). On AVX2 alone the integer paths run when asked for, but were never measured there."""


class MatmulUnavailable(ValueError):
    """The asked-for matmul precision cannot run on this machine or model (the message says why)."""


def supported(model: Transformer, cache: PagedKV) -> str | None:
    """Why the fused step cannot run this model (None: it can)."""
    weight = model.embed_tokens.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or cache.k.dtype != torch.float32:
        return "float32 on the CPU only"
    if not (cache.k.is_contiguous() and cache.v.is_contiguous()):
        return "the KV cache is not contiguous"
    if model.cfg.head_dim % 2:
        return "odd head_dim"
    return None


def chunk_prefixes(kv: KVContext, queries: int, block: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each query row's slot table and length, one row per (request, query): a request's committed prefix
    followed by its chunk's slots, of which query m reads the first m (causal). The kernel writes every row's K/V
    before any row attends, so row m sees exactly what a 1-row step at its position would: the same numbers. A
    bidirectional `block` reads its committed prefix only (the kernel adds the whole block from the step's own
    K/V). (In NumPy: a decode step runs this per token, and a NumPy op costs a fraction of a torch one.)"""
    table = kv.prefix_slots.numpy()
    requests, width = table.shape
    held = np.full(requests, width) if kv.prefix_valid is None else kv.prefix_valid.numpy().sum(1)
    rows = held[:, None] + (np.zeros(queries, dtype=np.int64) if block else np.arange(queries))[None, :]
    if kv.write_slots is not None and not block:
        write = kv.write_slots.numpy()
        table = np.concatenate([table, write], axis=1)
        if kv.prefix_valid is not None:   # a padded row's chunk follows its own prefix, over its padding
            np.put_along_axis(table, rows, write, axis=1)
    if queries > 1:
        table = np.repeat(table, queries, axis=0)
    return np.ascontiguousarray(table, dtype=np.int64), np.ascontiguousarray(rows.reshape(-1), dtype=np.int64)


def masked_prefixes(kv: KVContext, mask: Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """Each query row's slot table and length from an attention mask [R, 1, Q, P+Q] over [prefix ‖ chunk] of a
    chunk that writes its K/V: the prefix and other chunk slots the row sees, in the mask's column order
    (quadratic's verify; like the eager forward, the mask alone decides, prefix_valid included). The kernel
    writes every row's K/V before any row attends, and each row attends to its own K/V after its table: None for
    a mask with a row that does not see itself."""
    see = mask.numpy()[:, 0]
    requests, queries, width = see.shape
    prefix = kv.prefix_slots.numpy()
    if kv.write_slots is None or width != prefix.shape[1] + queries:
        return None
    diagonal = np.arange(queries)
    if not see[:, diagonal, prefix.shape[1] + diagonal].all():
        return None
    see = see.copy()
    see[:, diagonal, prefix.shape[1] + diagonal] = False       # the kernel appends the row's own K/V
    slots = np.concatenate([prefix, kv.write_slots.numpy()], axis=1)[:, None, :].repeat(queries, axis=1)
    lengths = see.sum(-1)
    first = np.argsort(~see, axis=-1, kind="stable")[..., :max(int(lengths.max()), 1)]  # seen columns, in order
    table = np.take_along_axis(slots, first, axis=-1)
    return (np.ascontiguousarray(table.reshape(requests * queries, -1), dtype=np.int64),
            np.ascontiguousarray(lengths.reshape(-1), dtype=np.int64))


def _flat(t: Tensor) -> np.ndarray:
    """A CPU int tensor's values as one contiguous int64 array (a view where it already is one)."""
    return np.ascontiguousarray(t.numpy().reshape(-1), dtype=np.int64)


class RopeTable:
    """cos, sin [P, head_dim] and the query scale [P] (None when unscaled) of positions 0..P-1, made by the
    model's own Rotary, so the kernel reads the numbers the eager forward computes per call; grown by doubling
    when a position reaches past P."""

    def __init__(self, model: Transformer):
        self.rotary = model.rotary
        self.size = 0
        self.cos = self.sin = torch.empty(0)
        self.q_scale: Tensor | None = None

    def cover(self, last: int) -> None:
        """Make sure position `last` is in the table."""
        if last < self.size:
            return
        size = max(64, 1 << last.bit_length())
        cos, sin, q_scale = self.rotary(torch.arange(size)[None])
        self.cos, self.sin = cos.reshape(size, -1).contiguous(), sin.reshape(size, -1).contiguous()
        self.q_scale = None if q_scale is None else q_scale.reshape(size).contiguous()
        self.size = size


def address_table(rows: list[list[Tensor | None]]) -> Tensor:
    """The int64 table of each tensor's address (0 for None) that cpu_decode.c reads its weights from."""
    return torch.tensor([[0 if t is None else t.data_ptr() for t in row] for row in rows], dtype=torch.long)


@dataclass(frozen=True)
class StepPointers:
    """The typed C pointers a decode step passes on every call, made once (what they point at lives in the
    backend's tables and weight copies)."""
    dims: Any
    eps: Any
    tensors: Any
    embed: Any
    final_norm: Any
    head: Any
    odd_rows: Any
    odd_count: int
    odd_values: Any


@dataclass
class WeightSet:
    """One layout of the step's weights: the projections and the head each in one format (weight_blocks.pack),
    the tables cpu_decode.c reads them through, and the copies those tables point at."""
    projections: Packed
    head: Packed
    dims: Tensor
    tensors: Tensor
    pointers: StepPointers


class FusedDecode:
    """The forward backend for short causal chunks (decode steps, few-row verifies and drafts, the adapter on at
    any rows), as one call into cpu_decode.c; any other plan runs on `fallback` (the runtime's eager backend;
    default: one of its own). It reads its own copies of the weights (row-major), made here once: rebuild it if
    they change. Each weight group is in the narrowest format that holds it exactly (weight_blocks.pack); a block
    format (a GGUF model's Q4_1 / Q8_0) streams a fraction of the bytes, and wider forwards widen each weight
    once into a float32 tile (cpu_decode.c's TILE_ROWS): the same numbers either way."""

    def __init__(self, model: Transformer, lib: Any, fallback: ForwardBackend | None = None,
                 matmul: str = "float32", isa: str | None = None):
        cfg = model.cfg
        self.fallback, self.lib = fallback or Eager(model), lib
        self.matmul = matmul
        self.isa = (isa or best_int8_isa(lib)) if matmul in INTEGER_MATMULS else None
        """The integer linears' vector ISA (INT8_ISAS; None in another precision)."""
        with torch.no_grad():
            layers = [dict(layer.named_modules()) for layer in model.layers]
            projections, head = linear_weights(model)
            copies: dict[int, Tensor] = {}   # one float32 copy per distinct small tensor

            def copy(w: Tensor | None) -> Tensor | None:
                if w is not None and id(w) not in copies:
                    copies[id(w)] = w.detach().float().contiguous()
                return None if w is None else copies[id(w)]

            self.small = [[copy(getattr(m.get(name), "weight", None)) for name in LAYER_TENSORS[:4]]
                          + [copy(m[name].bias) for name in BIASES] for m in layers]
            self.embed, self.final_norm = copy(model.embed_tokens.weight), copy(model.norm.weight)
            self.eps = torch.tensor([cfg.rms_norm_eps], dtype=torch.float32)
            self.weights = self._weights(cfg, *pack_weights(projections, head, matmul))
            self.format, self.head_format = self.weights.projections.format, self.weights.head.format
            self.rounds_weights = self.weights.projections.rounded or self.weights.head.rounded
            """Whether this layout rounds the weights themselves (an integer precision on weights that are no GGUF
            blocks)."""
            self.has_adapter = any(getattr(m[name], "lora_A", None) is not None
                                   for m in layers for name in PROJECTIONS)
            self.lora, self.lora_rank, self.lora_scale, lora_copies = self._lora_table(layers, matmul)
            self.copies = list(copies.values()) + lora_copies   # keeps what the tables point at alive
        self.lora_pointer = ptr(self.lora)
        self.max_chunk = MAX_CHUNK if matmul == "float32" else MAX_AMX_CHUNK
        self.vocab, self.dim = cfg.vocab_size, cfg.hidden_size
        self.rope = RopeTable(model)

    def _weights(self, cfg: Any, projections: Packed, head: Packed) -> WeightSet:
        per_layer = iter(projections.copies)
        tensors = address_table([small[:4] + [next(per_layer) for _ in PROJECTIONS] + small[4:]
                                 for small in self.small])
        dims = torch.tensor([cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size,
                             cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size,
                             FORMATS.index(projections.format), FORMATS.index(head.format),
                             INT8_ISAS.index(self.isa or "scalar"), INTEGER_MATMULS.get(self.matmul, 1)],
                            dtype=torch.long)
        pointers = StepPointers(ptr(dims), ptr(self.eps), ptr(tensors), ptr(self.embed), ptr(self.final_norm),
                                ptr(head.copies[0]), ptr(head.odd_rows[0]), head.odd_rows[0].numel(),
                                ptr(head.odd_values[0]))
        return WeightSet(projections, head, dims, tensors, pointers)

    @staticmethod
    def _lora_table(layers: list[dict], matmul: str = "float32") -> tuple[Tensor | None, int, float, list[Tensor]]:
        """[layers, 2 x 7] pointers to each projection's LoRA A and B (0 where it has none), its rank and scale,
        and the copies they point at: float32 A and B transposed ([rank, out]), or with bf16 matmuls both in the
        amx_bf16 layout (amx_lora_pair); a None table when no projection has an adapter, or when their ranks or
        scales differ, or a bf16 rank is no multiple of 16 (the adapter then runs eagerly)."""
        adapted = [m[name] for m in layers for name in PROJECTIONS if getattr(m[name], "lora_A", None) is not None]
        shapes = {(int(p.lora_A.shape[0]), float(p.lora_scale)) for p in adapted}
        if len(shapes) != 1:
            return None, 0, 0.0, []
        (rank, scale), = shapes
        if matmul == "bf16" and rank % 16:
            return None, 0, 0.0, []
        pair = amx_lora_pair if matmul == "bf16" else float32_lora_pair
        copies = {id(p): pair(p.lora_A.detach().float(), p.lora_B.detach().float()) for p in adapted}
        table = [[w for name in PROJECTIONS for w in copies.get(id(m[name]), (None, None))] for m in layers]
        return address_table(table), rank, scale, [w for pair in copies.values() for w in pair]

    def adapter_rows(self, lora: bool | Tensor, rows: int) -> np.ndarray | None | Literal[False]:
        """The rows the adapter is on, one uint8 each (None: nowhere; False: the kernel cannot apply it)."""
        if lora is False or not self.has_adapter:
            return None
        if self.lora is None:
            return False
        if isinstance(lora, Tensor):
            return np.ascontiguousarray(lora.numpy().reshape(-1), dtype=np.uint8)
        return np.ones(rows, dtype=np.uint8)

    @staticmethod
    def accepts(queries: int, attn: str, mask: Tensor | None, writes: bool, requests: int = 1,
                limit: int = MAX_CHUNK) -> bool:
        """Whether the fused step may compute a forward of this shape: up to `limit` query rows per request (MAX_CHUNK,
        or MAX_AMX_CHUNK with bf16 matmuls); causal (more than one row only when they write their K/V: each row reads
        the rows before it from the cache), bidirectional `block` rows of up to `limit` in all (each attends to its
        whole block from the step's own K/V; in float32, spiffy's 8 branches of 32 rows run faster as eager GEMMs),
        or under a mask override when they write (`masked_prefixes` then checks that the kernel can follow it)."""
        if queries > limit:
            return False
        if mask is not None:
            return writes
        if attn == "block":
            return requests * queries <= limit
        return attn in CAUSAL and (queries == 1 or writes)

    def run(self, plan: ForwardPlan) -> ForwardResult:
        rows = self.rows(plan)
        if rows is None:
            return self.fallback.run(plan)
        return self.call([rows])[0]

    def run_ragged(self, plans: Sequence[ForwardPlan]) -> list[ForwardResult] | None:
        """Several row groups of other lengths, positions, prefixes, attention (causal, a mask override, or
        bidirectional blocks of any width), writes and adapter rows, each its own plan, packed flat into one call,
        never padded to the longest; None unless the kernel takes every group as it is (each then computes what it
        would alone)."""
        rows = [self.rows(p) for p in plans]
        if any(r is None for r in rows):
            return None
        return self.call(cast(list[Rows], rows))

    def rows(self, plan: ForwardPlan) -> Rows | None:
        """The plan's rows as the kernel reads them, or None where the kernel cannot run the plan."""
        ids, kv, mask = plan.ids, plan.kv, plan.mask
        requests, queries = ids.shape
        adapter = self.adapter_rows(plan.adapter, requests * queries)
        if plan.fold is not None or kv is None or adapter is False or not self.accepts(
                queries, plan.attn, mask, kv.write_slots is not None, requests, self.max_chunk):
            return None
        block = plan.attn == "block" and mask is None
        tables = chunk_prefixes(kv, queries, block) if mask is None else masked_prefixes(kv, mask)
        if tables is None:
            return None
        return Rows(requests, queries, _flat(ids), _flat(plan.positions), *tables,
                    None if kv.write_slots is None else _flat(kv.write_slots), adapter, plan.hidden, kv.cache, block)

    def call(self, groups: list[Rows]) -> list[ForwardResult]:
        """One kernel call over every group's rows."""
        flat = packed(groups)
        own_first, own_count = own_windows(groups)
        count, cache = flat.count, flat.cache
        self.rope.cover(int(flat.at.max()))
        rope, weights = self.rope, self.weights.pointers
        logits = torch.empty(count, self.vocab, dtype=torch.float32)
        hidden = torch.empty(count, self.dim, dtype=torch.float32) if flat.hidden else None
        status = self.lib.decode_step(
            weights.dims, weights.eps, weights.tensors, weights.embed, weights.final_norm, weights.head,
            weights.odd_rows, weights.odd_count, weights.odd_values, count, ptr(flat.ids), ptr(flat.at),
            ptr(rope.cos), ptr(rope.sin), ptr(rope.q_scale), ptr(flat.prefix), flat.prefix.shape[1], ptr(flat.lengths),
            ptr(flat.write), ptr(cache.k), ptr(cache.v), cache.k.stride(0), ptr(own_first), ptr(own_count),
            self.lora_pointer if flat.adapter is not None else ptr(None), self.lora_rank, self.lora_scale,
            ptr(flat.adapter),
            ptr(logits), ptr(hidden))
        if status:
            raise MemoryError("fused decode step: out of memory")
        results, row = [], 0
        for g in groups:
            shape = (g.requests, g.queries)
            mine = slice(row, row + g.count)
            results.append(ForwardResult(logits[mine].view(*shape, -1),
                                         hidden=hidden[mine].view(*shape, -1) if g.hidden and hidden is not None
                                         else None))
            row += g.count
        return results


@dataclass
class Rows:
    """A plan's query rows as the fused kernel reads them: per row its token, position, slot table and length,
    write slot and adapter flag."""
    requests: int
    queries: int
    ids: np.ndarray
    at: np.ndarray
    prefix: np.ndarray
    lengths: np.ndarray
    write: np.ndarray | None
    adapter: np.ndarray | None
    hidden: bool
    cache: PagedKV
    block: bool = False
    """Each request's rows are a bidirectional block: every one attends to all of them (else each to itself)."""

    @property
    def count(self) -> int:
        return self.requests * self.queries


def packed(groups: list[Rows]) -> Rows:
    """Several groups' rows as one set (slot tables padded to the widest, adapter flags off where a group has
    none); a lone group as it is."""
    if len(groups) == 1:
        return groups[0]
    width = max(g.prefix.shape[1] for g in groups)
    prefix = np.concatenate([np.pad(g.prefix, ((0, 0), (0, width - g.prefix.shape[1]))) for g in groups])
    at, ids, lengths = (np.concatenate([getattr(g, f) for g in groups]) for f in ("at", "ids", "lengths"))
    write = None
    if any(g.write is not None for g in groups):   # -1: a read-only group's rows write nothing
        write = np.concatenate([np.full(g.count, -1, np.int64) if g.write is None else g.write for g in groups])
    adapter = None
    if any(g.adapter is not None for g in groups):
        adapter = np.concatenate([np.zeros(g.count, np.uint8) if g.adapter is None else g.adapter for g in groups])
    return Rows(1, sum(g.count for g in groups), ids, at, prefix, lengths, write, adapter,
                any(g.hidden for g in groups), groups[0].cache)


def own_windows(groups: list[Rows]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per packed row, the first of the step's rows it attends to beside its table and how many: its request's
    whole block (a bidirectional group), or itself; (None, None) when every row attends to itself alone."""
    if not any(g.block for g in groups):
        return None, None
    first, count, base = [], [], 0
    for g in groups:
        rows = np.arange(g.count, dtype=np.int64)
        first.append(base + (rows // g.queries * g.queries if g.block else rows))
        count.append(np.full(g.count, g.queries if g.block else 1, np.int64))
        base += g.count
    return np.concatenate(first), np.concatenate(count)


def float32_lora_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """A [rank, in] and B [out, rank] as add_lora reads them: A, and B transposed."""
    return a.contiguous(), b.t().contiguous()


def amx_lora_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """A and B as amx_lora reads them, in bfloat16: A row-major [rank, in], B in rank pairs [rank / 2, out, 2]."""
    out, rank = b.shape
    pairs = b.to(torch.bfloat16).view(out, rank // 2, 2).transpose(0, 1)
    return a.to(torch.bfloat16).contiguous(), pairs.contiguous()


def linear_weights(model: Transformer) -> tuple[list[Tensor], Tensor]:
    """Every layer's projection weights, in PROJECTIONS order, and the head's (the tied embedding, or lm_head)."""
    layers = [dict(layer.named_modules()) for layer in model.layers]
    head = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    return [m[name].weight for m in layers for name in PROJECTIONS], head


def pack_weights(projections: list[Tensor], head: Tensor, matmul: str) -> tuple[Packed, Packed]:
    """The projections and the head in the layout of the matmul precision (MATMULS)."""
    if matmul == "bf16":
        return pack_amx(projections), pack_amx([head])
    if matmul in INTEGER_MATMULS:
        return pack_int8(projections), pack_int8([head], spare_rows=ODD_HEAD_ROWS)
    return pack(projections), pack([head], spare_rows=ODD_HEAD_ROWS)


def amx_unsupported(model: Transformer, lib: Any) -> str | None:
    """Why the bf16 matmuls cannot run this model here (None: they can)."""
    if lib is None or not lib.amx_bf16_ready():
        return "this CPU (or its C build) has no AMX bfloat16 tiles"
    projections, head = linear_weights(model)
    if not amx_fits([*projections, head]):
        return "a weight's outputs are no multiple of 16 or its inputs no multiple of 32"
    return None


def int8_unsupported(model: Transformer, lib: Any) -> str | None:
    """Why the integer matmuls cannot run this model here (None: they can)."""
    if lib is None:
        return "no C build of the kernels"
    projections, head = linear_weights(model)
    if any(w.shape[1] % 32 for w in [*projections, head]):
        return "a weight's inputs are no multiple of 32"
    return None


def best_int8_isa(lib: Any, allowed: tuple[str, ...] = INT8_ISAS) -> str | None:
    """The fastest of `allowed` int8 ISAs this CPU has (None: none)."""
    ready = [isa for isa in allowed if lib.int8_isa_ready(INT8_ISAS.index(isa))]
    return ready[-1] if ready else None


def resolve_matmul(model: Transformer, lib: Any, matmul: str) -> str:
    """The precision `matmul` (MATMULS or AUTO) runs in here; MatmulUnavailable where an asked-for one cannot."""
    if matmul == "bf16" and (why := amx_unsupported(model, lib)):
        raise MatmulUnavailable(f"--matmul bf16: {why}")
    if matmul in INTEGER_MATMULS and (why := int8_unsupported(model, lib)):
        raise MatmulUnavailable(f"--matmul {matmul}: {why}")
    if matmul != AUTO:
        return matmul
    if not amx_unsupported(model, lib):
        return "bf16"
    if not int8_unsupported(model, lib) and best_int8_isa(lib, INT8_AUTO):
        return "int16"
    return "float32"


def fused_decode(model: Transformer, cache: PagedKV, fallback: ForwardBackend | None = None,
                 matmul: str = "float32") -> FusedDecode | None:
    """The fused decode step for this model and KV memory (the plans it cannot take run on `fallback`), or None
    where it does not apply. matmul="bf16", "int8" or "int16" (MATMULS) raises MatmulUnavailable where it cannot
    run: a user who asks for it gets it or the reason, never the float32 step instead; matmul=AUTO resolves as
    `resolve_matmul` says."""
    if matmul not in (*MATMULS, AUTO):
        raise MatmulUnavailable(f"matmul {matmul!r}: expected one of {(*MATMULS, AUTO)}")
    reason = supported(model, cache) or (None if ENABLED else "SPECSCOPE_FUSED_DECODE=0")
    lib = None if reason else library()
    if matmul != "float32" and (reason or lib is None):
        if matmul != AUTO:
            raise MatmulUnavailable(f"--matmul {matmul}: {reason or 'no C build of the kernels'}")
        matmul = "float32"
    if reason or lib is None:
        log.info("decoding eagerly: %s", reason or "no C compiler")
        return None
    step = FusedDecode(model, lib, fallback, resolve_matmul(model, lib, matmul))
    if matmul == AUTO and step.matmul in INTEGER_MATMULS and step.rounds_weights:
        log.info("matmul auto: float32, as the integer formats would round this model's weights (no GGUF blocks)")
        return FusedDecode(model, lib, fallback, "float32")
    return step
