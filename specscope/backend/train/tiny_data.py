"""The tiny model's offline training data and its tri-mode (AR / block-diffusion / I-DLM) dual-stream batch.

Corpus: the Python standard library's source (tests excluded), its pydoc topics, and generated chat tasks.
Text documents are split train/held-out by a hash of their name; tasks by a hash of their prompt.
A batch row is one clean sequence x0 of T tokens laid out three times, [x0 ‖ x_bd ‖ x_idlm], under one mask:
  clean  -> clean: token causal (AR loss, shifted labels)
  bd     -> clean: strictly earlier blocks of size B; bd -> bd: same block, bidirectional
  idlm   -> clean: strictly earlier blocks of size b; idlm -> idlm: same block, token causal
The bd stream keeps each block's first token (the seed) and masks the rest with a random ratio; the I-DLM
stream is all MASK. Noisy position i predicts x0[i+1] (shifted), exactly as the decoding modes read logits.
"""
from __future__ import annotations

import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from specscope.backend.model.tokenizer import EOS, chat_prompt
from specscope.backend.train import tasks

IGNORE = -100
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _heldout(name: str) -> bool:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little") % 20 == 0


def text_documents(split: str) -> list[tuple[str, str]]:
    """(name, text) of the stdlib sources and pydoc topics in a split, sorted by name."""
    root = stdlib_root()
    docs: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS & set(rel.parts):
            continue
        docs.append((f"stdlib/{rel}", path.read_text(encoding="utf-8", errors="replace")))
    from pydoc_data.topics import topics
    docs += [(f"pydoc/{k}", v) for k, v in sorted(topics.items())]
    want_heldout = split == "heldout"
    return [(n, t) for n, t in docs if _heldout(n) == want_heldout]


def chat_text(prompt: str, answer: str) -> str:
    return chat_prompt(prompt) + answer + EOS


def tokenize_documents(tokenizer, docs: list[tuple[str, str]]) -> np.ndarray:
    """One flat uint16 token stream, documents separated by EOS."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    out: list[int] = []
    batch = [t for _, t in docs]
    for i in range(0, len(batch), 256):
        for ids in tokenizer(batch[i:i + 256], add_special_tokens=False)["input_ids"]:
            out.extend(ids)
            out.append(eos)
    return np.asarray(out, dtype=np.uint16)


@dataclass
class BatchSpec:
    seq_len: int = 256
    batch_size: int = 16
    task_fraction: float = 0.6
    pad_tasks: bool = True  # EOS-pad each task to the batch's block-diffusion block size
    bd_blocks: tuple[int, ...] = (8, 16, 32)
    idlm_blocks: tuple[int, ...] = (1, 2, 3, 3, 4, 5, 7)


@dataclass
class TriBatch:
    ids: Tensor        # [B, 3T] inputs: clean ‖ bd noisy ‖ idlm noisy
    positions: Tensor  # [3T]
    mask: Tensor       # [3T, 3T] bool
    labels: Tensor     # [B, 3T] shifted targets, IGNORE where no loss
    bd_block: int
    idlm_block: int


def tri_stream_mask(t: int, bd_block: int, idlm_block: int) -> Tensor:
    """The [3T, 3T] bool attention mask of the three streams (see module docstring)."""
    i = torch.arange(t)
    causal = i[:, None] >= i[None, :]
    bd_q, bd_k = (i // bd_block)[:, None], (i // bd_block)[None, :]
    id_q, id_k = (i // idlm_block)[:, None], (i // idlm_block)[None, :]
    zero = torch.zeros(t, t, dtype=torch.bool)
    rows = [
        [causal, zero, zero],
        [bd_q > bd_k, bd_q == bd_k, zero],
        [id_q > id_k, zero, (id_q == id_k) & causal],
    ]
    return torch.cat([torch.cat(r, dim=1) for r in rows], dim=0)


TASK_WEIGHTS = {"add": 1.5, "sort": 1.5, "spell": 1.25, "copy": 0.5}   # the rest weigh 1


def task_row(tokenizer, rng: random.Random, t: int, split: str = "train", block: int = 1) -> list[int]:
    """Whole chat tasks of one split up to T tokens, each padded with EOS to a multiple of `block` tokens.

    The padding teaches a confident EOS after the answer up to the block end, as Fast-dLLM's SFT does,
    so block diffusion can finish a block in one step once the answer is out. A task that would not fit is
    redrawn a few times, then the row is filled with EOS, so every answer is seen whole.
    """
    kinds = list(tasks.TASK_FAMILIES)
    weights = [TASK_WEIGHTS.get(k, 1.0) for k in kinds]
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    misses = 0
    while len(ids) < t and misses < 4:
        task = tasks.draw(tasks.TASK_FAMILIES[rng.choices(kinds, weights)[0]], rng, split)
        new = tokenizer(chat_text(task.prompt, task.answer), add_special_tokens=False)["input_ids"]
        new += [eos] * (-len(new) % block)
        if ids and len(ids) + len(new) > t:
            misses += 1
            continue
        ids += new
    return (ids + [eos] * t)[:t]


def make_batch(tokenizer, stream: np.ndarray, spec: BatchSpec, seed: int, step: int, mask_id: int,
               split: str = "train") -> TriBatch:
    """The batch of one training step, a pure function of (seed, step); `stream` and tasks from `split`."""
    rng = random.Random(f"{seed}:{step}")
    t = spec.seq_len
    bd_block, idlm_block = rng.choice(spec.bd_blocks), rng.choice(spec.idlm_blocks)
    rows = []
    for _ in range(spec.batch_size):
        if rng.random() < spec.task_fraction:
            rows.append(task_row(tokenizer, rng, t, split, bd_block if spec.pad_tasks else 1))
        else:
            start = rng.randrange(0, len(stream) - t)
            rows.append(stream[start:start + t].tolist())
    x0 = torch.tensor(rows, dtype=torch.long)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))

    ratio = torch.rand(spec.batch_size, 1, generator=gen).clamp(min=0.05)
    ratio[torch.rand(spec.batch_size, 1, generator=gen) < 0.25] = 1.0
    is_seed = (torch.arange(t) % bd_block == 0)[None, :]
    bd_masked = (torch.rand(spec.batch_size, t, generator=gen) < ratio) & ~is_seed
    x_bd = torch.where(bd_masked, torch.full_like(x0, mask_id), x0)
    x_idlm = torch.full_like(x0, mask_id)

    nxt = torch.cat([x0[:, 1:], torch.full_like(x0[:, :1], IGNORE)], dim=1)      # target of position i = x0[i+1]
    ar_labels = nxt
    same_bd_block = torch.cat([(torch.arange(1, t) % bd_block != 0), torch.tensor([False])])[None, :]
    bd_target_masked = torch.cat([bd_masked[:, 1:], torch.zeros_like(bd_masked[:, :1])], dim=1)
    bd_labels = torch.where(same_bd_block & bd_target_masked, nxt, IGNORE)
    idlm_labels = nxt
    return TriBatch(
        ids=torch.cat([x0, x_bd, x_idlm], dim=1),
        positions=torch.arange(t).repeat(3),
        mask=tri_stream_mask(t, bd_block, idlm_block),
        labels=torch.cat([ar_labels, bd_labels, idlm_labels], dim=1),
        bd_block=bd_block, idlm_block=idlm_block,
    )
