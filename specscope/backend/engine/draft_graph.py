"""Spiffy's calibrated draft graph: the file format, its validation, and how nodes become draft states.

A graph is a list of nodes in parents-first order. Node k = (parent, pos_rank r, vocab_rank v): take the
parent's block state (parent -1 = the main state being verified), pick its r-th most confident masked
position among those the policy may fill next, and set it to that position's v-th ranked token. Ranks come
from the freshest logits, those of the previous main state. `specscope.lab.calibrate` writes the file.

    {"version": 1, "branches": B, "nodes": [{"id", "parent", "pos_rank", "vocab_rank", "hit_rate"}, ...],
     "calibration": {"prompts", "steps", "block_size", "threshold", ...}}
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specscope.backend.engine.scores import Scores

GRAPH_FILE = "draft_graph.json"
VERSION = 1
MAX_POS_RANK = 254          # block_size is at most 256: the seed plus 255 maskable positions
CALIBRATE_HINT = "calibrate one with `specscope calibrate --model NAME|DIR`"

State = tuple[int, ...]


class GraphError(ValueError):
    """A missing or malformed draft-graph file; the message names the file and the problem."""


@dataclass(frozen=True)
class Node:
    id: int
    parent: int          # -1 = the main state
    pos_rank: int
    vocab_rank: int
    hit_rate: float = 0.0


@dataclass(frozen=True)
class DraftGraph:
    nodes: tuple[Node, ...]
    calibration: dict[str, Any]

    @property
    def max_vocab_rank(self) -> int:
        return max((n.vocab_rank for n in self.nodes), default=0)

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "branches": len(self.nodes), "nodes": [asdict(n) for n in self.nodes],
                "calibration": self.calibration}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1))


def _int(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise GraphError(f"{where}: '{key}' must be an integer, got {v!r}")
    return v


def parse_graph(data: Any, where: str = "draft graph") -> DraftGraph:
    """Validate a decoded graph file: version, node ids 0..B-1, parents that exist and form no cycle,
    parents listed before their children, ranks in range."""
    if not isinstance(data, dict):
        raise GraphError(f"{where}: not a JSON object")
    if data.get("version") != VERSION:
        raise GraphError(f"{where}: unsupported version {data.get('version')!r} (expected {VERSION})")
    raw = data.get("nodes")
    if not isinstance(raw, list) or not raw or not all(isinstance(n, dict) for n in raw):
        raise GraphError(f"{where}: 'nodes' must be a non-empty list of objects")
    if _int(data, "branches", where) != len(raw):
        raise GraphError(f"{where}: 'branches' is {data['branches']} but there are {len(raw)} nodes")
    if not isinstance(data.get("calibration", {}), dict):
        raise GraphError(f"{where}: 'calibration' must be an object")
    ids = [_int(n, "id", f"{where} node {k}") for k, n in enumerate(raw)]
    if ids != list(range(len(raw))):
        raise GraphError(f"{where}: node ids must be 0..{len(raw) - 1} in order, got {ids}")
    parents = [_int(n, "parent", f"{where} node {k}") for k, n in enumerate(raw)]
    for k, p in enumerate(parents):
        if p < -1 or p >= len(raw):
            raise GraphError(f"{where}: node {k} has parent {p}, which is neither -1 (main) nor a node id")
    for k, p in enumerate(parents):
        if p >= k:
            seen, cur = [k], p
            while cur != -1 and cur not in seen:
                seen.append(cur)
                cur = parents[cur]
            if cur != -1:
                raise GraphError(f"{where}: parent cycle through nodes {seen[seen.index(cur):]}")
            raise GraphError(f"{where}: node {k}'s parent {p} comes after it; list parents first")
    nodes = []
    for k, n in enumerate(raw):
        r, v = _int(n, "pos_rank", f"{where} node {k}"), _int(n, "vocab_rank", f"{where} node {k}")
        if not 0 <= r <= MAX_POS_RANK or v < 0:
            raise GraphError(f"{where}: node {k} ranks out of range (pos_rank {r} in [0, {MAX_POS_RANK}], "
                             f"vocab_rank {v} >= 0)")
        hit = n.get("hit_rate", 0.0)
        if isinstance(hit, bool) or not isinstance(hit, (int, float)) or not 0 <= hit <= 1:
            raise GraphError(f"{where}: node {k} hit_rate must be a number in [0, 1], got {hit!r}")
        nodes.append(Node(k, parents[k], r, v, float(hit)))
    return DraftGraph(tuple(nodes), dict(data.get("calibration", {})))


def load_graph(path: str | Path) -> DraftGraph:
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"no draft graph at {path}; {CALIBRATE_HINT}")
    try:
        data = json.loads(path.read_bytes())
    except ValueError as e:
        raise GraphError(f"{path}: not valid JSON ({e}); {CALIBRATE_HINT}") from None
    return parse_graph(data, str(path))


@dataclass(frozen=True)
class Ranking:
    """What one forward says about a block: positions 1..N-1 most confident first, and per position the
    token ids best first (top[p] comes from logits[p - 1]: shifted logits; MASK never ranked)."""
    order: tuple[int, ...]
    top: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, block: Scores, k: int) -> Ranking:
        """Ranks from a block state's rows [N, V]; confidence = the top token's probability."""
        x = block.logits[:-1].float().clone()
        if block.mask_id is not None:
            x[:, block.mask_id] = float("-inf")
        top = x.topk(k, dim=-1)
        conf = torch.softmax(x, dim=-1).gather(-1, top.indices[:, :1])[:, 0]
        order = torch.sort(conf, descending=True, stable=True).indices + 1
        return cls(tuple(order.tolist()), ((),) + tuple(map(tuple, top.indices.tolist())))


Eligible = Callable[[list[int]], list[int]]
"""eligible(block): the masked positions the policy may fill next (block_diffusion's candidates)."""


def child(parent: State, ranking: Ranking, eligible: Eligible, pos_rank: int, vocab_rank: int) -> State | None:
    """`parent` with its pos_rank-th most confident eligible position set to that position's vocab_rank-th
    token; None when fewer positions are eligible."""
    allowed = set(eligible(list(parent)))
    ranked = [p for p in ranking.order if p in allowed]
    if pos_rank >= len(ranked):
        return None
    pos = ranked[pos_rank]
    return parent[:pos] + (ranking.top[pos][vocab_rank],) + parent[pos + 1:]


def expand(nodes: Sequence[Node], main: State, ranking: Ranking, eligible: Eligible) -> list[State | None]:
    """Each node's draft state on top of `main` (None where a rank runs past the eligible positions)."""
    states: list[State | None] = []
    for node in nodes:
        parent = main if node.parent < 0 else states[node.parent]
        states.append(None if parent is None else child(parent, ranking, eligible, node.pos_rank, node.vocab_rank))
    return states
