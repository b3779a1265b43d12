"""Pack sequences and their layout chunks into one training forward: a clean causal pass that writes the K/V
of every sequence (no grad: the adapter is off at clean tokens), then one pass of all chunks that reads it."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specscope.backend.model.transformer import KVContext, PagedKV, Transformer
from specscope.backend.train.layouts import IGNORE, KINDS, Chunk


@dataclass
class Packed:
    clean_ids: Tensor       # [B, L]
    clean_len: list[int]
    ids: Tensor             # [B, Q] the chunks of each sequence, concatenated (padded with MASK)
    positions: Tensor       # [B, Q]
    targets: Tensor         # [B, Q] (IGNORE: untrained)
    mask: Tensor            # [B, 1, Q, L + Q] over [clean prefix | chunks]
    kinds: list[list[tuple[str, int, int]]]   # per sequence: (kind, first row, rows) of each chunk

    def to(self, device: str | torch.device) -> Packed:
        return Packed(self.clean_ids.to(device), self.clean_len, self.ids.to(device), self.positions.to(device),
                      self.targets.to(device), self.mask.to(device), self.kinds)

    def kind_index(self) -> Tensor:
        """Every chunk row's layout kind, as its index in layouts.KINDS [B, Q] (padding rows: 0, untrained)."""
        kind_of = torch.zeros_like(self.targets)
        for i, spans in enumerate(self.kinds):
            for kind, row, n in spans:
                kind_of[i, row:row + n] = KINDS.index(kind)
        return kind_of


def pack(seqs: list[list[int]], chunks: list[list[Chunk]], mask_id: int, pad_id: int) -> Packed:
    b = len(seqs)
    width = max(len(s) for s in seqs)
    q = max(1, max(sum(len(c.ids) for c in cs) for cs in chunks))
    clean = torch.full((b, width), pad_id, dtype=torch.long)
    ids = torch.full((b, q), mask_id, dtype=torch.long)
    positions = torch.zeros(b, q, dtype=torch.long)
    targets = torch.full((b, q), IGNORE, dtype=torch.long)
    mask = torch.zeros(b, 1, q, width + q, dtype=torch.bool)
    kinds: list[list[tuple[str, int, int]]] = []
    for i, (seq, cs) in enumerate(zip(seqs, chunks, strict=True)):
        clean[i, :len(seq)] = torch.tensor(seq)
        row, spans = 0, []
        for c in cs:
            n = len(c.ids)
            sl = slice(row, row + n)
            ids[i, sl], positions[i, sl] = torch.tensor(c.ids), torch.tensor(c.positions)
            targets[i, sl] = torch.tensor(c.targets)
            mask[i, 0, sl, :c.seed] = True
            own = torch.ones(n, n, dtype=torch.bool)
            mask[i, 0, sl, width + row:width + row + n] = own.tril() if c.kind == "causal" else own
            spans.append((c.kind, row, n))
            row += n
        for r in range(row, q):        # padding rows see themselves only
            mask[i, 0, r, width + r] = True
        kinds.append(spans)
    return Packed(clean, [len(s) for s in seqs], ids, positions, targets, mask, kinds)


def chunk_logits(model: Transformer, p: Packed, cache: PagedKV, scope: str = "mask") -> Tensor:
    """Logits [B, Q, V] of every chunk row (grad flows through the chunk rows only). The adapter is on at the
    chunks' MASK rows (scope "mask") or at every chunk row (scope "draft": a whole draft forward, as the runtime
    applies a draft-scoped adapter); the clean prefix never sees it."""
    b, width = p.clean_ids.shape
    slots = torch.arange(b * width).view(b, width)
    with torch.no_grad():
        pos = torch.arange(width)[None].expand(b, width)
        model(p.clean_ids, pos, kv=KVContext(cache, torch.zeros(b, 0, dtype=torch.long), None, slots))
    kv = KVContext(cache, slots)
    lora = p.ids == model.cfg.mask_token_id if scope == "mask" else True
    return model(p.ids, p.positions, kv=kv, mask=p.mask, lora=lora)


