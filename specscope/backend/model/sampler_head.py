"""The sampler head of "Your LLM Knows the Future" (arXiv 2507.11851): a small MLP that makes a chain of MASK
drafts coherent. A MASK row predicts its position's token without knowing the token drafted just before it; the
head corrects the row's final (normed) hidden state with that token's embedding, and the LM head reads the
result. Ships beside the adapter that trained the rows (`sampler_head.safetensors`); it never touches a clean
row, so every lossless claim stays exact.

At run time the head reads a draft row's normed hidden state, which the forward returns beside its logits where a
chain will draw from them (`ForwardPlan.hidden`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

SAMPLER_FILE = "sampler_head.safetensors"


class SamplerHead(nn.Module):
    """hidden' = hidden + down(silu(own(hidden) + previous(embedding of the previous draft))): the paper's MLP
    over [hidden; embedding], its first layer in two halves so that a chain computes `own` for all its rows in one
    product; `down` starts at zero, so an untrained head drafts what the rows alone do."""

    def __init__(self, dim: int, width: int, candidates: int = 32, dropout: float = 0.0):
        super().__init__()
        self.own = nn.Linear(dim, width)
        self.previous = nn.Linear(dim, width, bias=False)
        self.drop = nn.Dropout(dropout)      # training only (eval mode and a loaded head: none)
        self.down = nn.Linear(width, dim)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)
        self.candidates = candidates
        """At run time the head ranks only this many of the row's own top tokens (one LM-head row each)."""

    def forward(self, hidden: Tensor, previous: Tensor) -> Tensor:
        """The corrected hidden states [..., D] of draft rows `hidden` [..., D], `previous` [..., D] the
        embeddings of the tokens drafted (or known) just before them."""
        return self.finish(hidden, self.own(hidden), previous)

    def finish(self, hidden: Tensor, own: Tensor, previous: Tensor) -> Tensor:
        """The corrected states, given the rows' `own(hidden)`."""
        return hidden + self.down(self.drop(F.silu(own + self.previous(previous))))

    def candidate_scores(self, hidden: Tensor, previous: Tensor, candidate_rows: Tensor) -> Tensor:
        """Scores [..., C] of candidate tokens, given their LM-head rows [..., C, D]."""
        return (candidate_rows * self(hidden, previous)[..., None, :]).sum(-1)

    def rescore(self, logits: Tensor, hidden: Tensor, previous: Tensor, weight: Tensor) -> Tensor:
        """Draft rows' logits [..., V] ranked by the head instead: its scores of the rows' top `candidates`
        tokens through the LM head `weight` [V, D], -inf elsewhere."""
        candidates = logits.topk(self.candidates, -1).indices
        scores = self.candidate_scores(hidden, previous, weight[candidates])
        return torch.full_like(logits, float("-inf")).scatter(-1, candidates, scores.to(logits.dtype))


def save_sampler(head: SamplerHead, folder: Path) -> None:
    """The head in bf16 (its width fits the adapter folder's size budget), its shape in the metadata."""
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    meta = {"dim": head.down.out_features, "width": head.own.out_features, "candidates": head.candidates}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / SAMPLER_FILE), metadata={"sampler": json.dumps(meta)})


def load_sampler(path: Path, device: str | torch.device = "cpu") -> SamplerHead:
    """A saved head, in float32."""
    with safe_open(str(path), "pt") as f:
        meta = json.loads((f.metadata() or {}).get("sampler", "{}"))
        tensors = {k: f.get_tensor(k).float() for k in f.keys()}
    try:
        head = SamplerHead(meta["dim"], meta["width"], meta["candidates"])
        head.load_state_dict(tensors)
    except (KeyError, RuntimeError) as e:
        raise ValueError(f"{path}: not a sampler head ({e})") from None
    return head.to(device).eval().requires_grad_(False)
