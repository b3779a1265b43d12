"""The draft layouts the adapter is trained on, each as the engine's modes run it.

Every layout is a chunk of query rows placed after a clean prefix: a seed token x_s at position s, then
positions s+1.. that hold MASK (or, in a partially masked block, some clean tokens). A row at position p
predicts x_{p+1}, as the modes read it. The chunk sees the clean prefix x_0..x_{s-1} and, inside itself:
- `block`: every row of the chunk (linear_spec's draft, block_diffusion's first pass), rows 0..B-2 trained;
- `causal`: the rows before it (isd's MASK specs, quadratic's mask groups), the mask rows trained;
- `partial`: every row, with a random share of the block masked (block_diffusion's later passes, spiffy,
  specfold), trained where the next position is masked.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

IGNORE = -100
KINDS = ("block", "causal", "partial")


@dataclass
class Chunk:
    """One layout instance: its ids, positions, targets (IGNORE where untrained) and attention kind."""
    kind: str
    seed: int                 # s: the chunk sees prefix positions < s
    ids: list[int]
    targets: list[int]

    @property
    def positions(self) -> list[int]:
        return list(range(self.seed, self.seed + len(self.ids)))


def block_chunk(x: list[int], s: int, size: int, mask: int) -> Chunk:
    targets = [x[s + i + 1] if s + i + 1 < len(x) and i < size - 1 else IGNORE for i in range(size)]
    return Chunk("block", s, [x[s]] + [mask] * (size - 1), targets)


def causal_chunk(x: list[int], s: int, masks: int, mask: int) -> Chunk:
    targets = [IGNORE] + [x[s + i + 1] if s + i + 1 < len(x) else IGNORE for i in range(1, masks + 1)]
    return Chunk("causal", s, [x[s]] + [mask] * masks, targets)


def partial_chunk(x: list[int], s: int, size: int, mask: int, ratio: float, rng: random.Random) -> Chunk:
    ids = [x[s]] + [mask if rng.random() < ratio else (x[s + i] if s + i < len(x) else mask)
                    for i in range(1, size)]
    if mask not in ids:
        ids[rng.randrange(1, size)] = mask
    targets = [x[s + i + 1] if i + 1 < size and ids[i + 1] == mask and s + i + 1 < len(x) else IGNORE
               for i in range(size)]
    return Chunk("partial", s, ids, targets)


@dataclass(frozen=True)
class Mix:
    """How many chunks of each layout one sequence gets, and their sizes. Short block and causal drafts: what the
    modes accept is the first few positions, and far positions (hardly predictable by a 135 M model) would
    dominate the loss; the partial blocks keep the block modes' full sizes."""
    block: int = 6
    block_sizes: tuple[int, ...] = (4, 8)
    causal: int = 8
    causal_masks: tuple[int, ...] = (3, 4, 6)
    partial: int = 3
    partial_sizes: tuple[int, ...] = (8, 16, 32)


def chunks_for(x: list[int], prompt_len: int, mask: int, mix: Mix, rng: random.Random) -> list[Chunk]:
    """Random layout instances whose seeds lie in the answer (the last prompt token included)."""
    lo, hi = prompt_len - 1, len(x) - 2
    if hi < lo:
        return []
    out = [block_chunk(x, rng.randint(lo, hi), rng.choice(mix.block_sizes), mask) for _ in range(mix.block)]
    out += [causal_chunk(x, rng.randint(lo, hi), rng.choice(mix.causal_masks), mask) for _ in range(mix.causal)]
    out += [partial_chunk(x, rng.randint(lo, hi), rng.choice(mix.partial_sizes), mask, rng.uniform(0.15, 1.0), rng)
            for _ in range(mix.partial)]
    return out
