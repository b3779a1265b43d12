"""Tree drafts from the sampler head (EAGLE-2's dynamic tree on a self-speculative drafter): the first drafted
position keeps the draft row's top few tokens, each followed by the chain the sampler head draws after it from the
same MASK rows, so one draft pass offers several continuations. A node's chance is the product of its path's draft
probabilities; the verify keeps the nodes with the best chances (as many as pay for their rows on the cost curve)
and checks them all in one causal forward under a tree mask, each row seeing its ancestors. The accepted path is the
longest one whose every node is the verifier's own token after its parent, so greedy output stays `ar`'s."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.scores import Scores
from specscope.backend.engine.verify_length import best_count

ROOT = -1
"""The parent of a first-position node: the seed (row 0 of the verify)."""


@dataclass(frozen=True)
class DraftTree:
    """Nodes in verify-row order (node i is row i + 1; parents come before their children)."""
    tokens: list[int]
    parents: list[int]      # the node each hangs from (ROOT: the seed)
    depths: list[int]       # 1 for the first drafted position
    chances: list[float]    # the chance its whole path is accepted
    branches: list[int]     # the first-position branch it belongs to (0: the draft row's best token)

    def rows(self) -> list[int]:
        """Each verify row's parent row (the seed's: ROOT)."""
        return [ROOT] + [p + 1 for p in self.parents]

    def path(self, verifier: list[int]) -> list[int]:
        """The accepted nodes, seed down: at each step the child whose token is the verifier's at its parent's
        row (verifier[row]: the verify's token after row `row`)."""
        path: list[int] = []
        at = ROOT
        while True:
            wanted = verifier[at + 1]
            child = next((i for i, (p, t) in enumerate(zip(self.parents, self.tokens, strict=True))
                          if p == at and t == wanted), None)
            if child is None:
                return path
            path.append(child)
            at = child

    def best(self, keep: int) -> DraftTree:
        """The `keep` nodes with the best chances (a node never beats its parent, so every kept node's parent is
        kept), in their row order."""
        order = sorted(range(len(self.tokens)), key=lambda i: (-self.chances[i], self.depths[i], i))[:keep]
        kept = sorted(order)
        index = {old: new for new, old in enumerate(kept)}
        return DraftTree([self.tokens[i] for i in kept], [index.get(self.parents[i], ROOT) for i in kept],
                         [self.depths[i] for i in kept], [self.chances[i] for i in kept],
                         [self.branches[i] for i in kept])

    def paying(self, round_ms: Callable[[int], float]) -> DraftTree:
        """The best nodes, as many as give the most expected tokens per ms of the round (`round_ms(n)`)."""
        return self.best(best_count(sorted(self.chances, reverse=True), round_ms))


def grow(rt: Runtime, rows: Scores, branches: int) -> DraftTree:
    """The tree of a draft pass's rows (row 0 the seed's, which drafts the first position; the rest MASK rows):
    the seed row's `branches` likeliest tokens, each followed by the sampler head's chain."""
    firsts, first_probs = rows.rows(slice(0, 1)).top(branches)
    masks = rows.rows(slice(1, len(rows) - 1))      # row j drafts position j + 1; the last row's is past the block
    tree = DraftTree([], [], [], [], [])
    for branch, (first, p_first) in enumerate(zip(firsts, first_probs, strict=True)):
        chain, ranked = rt.drafts(masks, first, argmax=True) if len(masks) else ([], masks)
        probs = ranked.confidence_of(chain) if chain else []
        parent, chance = ROOT, p_first
        for depth, (token, prob) in enumerate(zip([first, *chain], [1.0, *probs], strict=True), start=1):
            chance *= prob
            tree.tokens.append(token)
            tree.parents.append(parent)
            tree.depths.append(depth)
            tree.chances.append(chance)
            tree.branches.append(branch)
            parent = len(tree.tokens) - 1
    return tree


def tree_mask(parents: Sequence[int], prefix: int) -> Tensor:
    """[1, 1, Q, P+Q] attention mask over [prefix ‖ chunk] of a draft tree's rows (`parents[i]`: the row that row i
    hangs from, -1 for the root): each row sees the prefix, its ancestors and itself."""
    q = len(parents)
    sees = torch.eye(q, dtype=torch.bool)
    for row, parent in enumerate(parents):
        if parent >= 0:
            sees[row] |= sees[parent]
    return torch.cat([torch.ones(q, prefix, dtype=torch.bool), sees], dim=1)[None, None]
