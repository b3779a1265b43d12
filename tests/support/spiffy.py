"""A draft graph for spiffy / specfold tests, written into a checkpoint folder of the shipped model; the
`spiffy_engine` fixture (tests/conftest.py) is an engine on it."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from specscope.backend.engine.draft_graph import GRAPH_FILE, State
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.scores import Scores
from specscope.backend.forward.plan import Fold, FoldCounts
from specscope.backend.model.checkpoint import LoadedModel

# A typical calibrated shape: top-1 chains from the main state and its siblings (rank 2 position, 2nd token).
NODES = [(-1, 0, 0), (0, 0, 0), (-1, 1, 0), (1, 0, 0), (-1, 0, 1), (2, 0, 0), (-1, 2, 0)]


def graph_json(**overrides: Any) -> dict[str, Any]:
    g: dict[str, Any] = {"version": 1, "branches": len(NODES),
                         "nodes": [{"id": i, "parent": p, "pos_rank": r, "vocab_rank": v, "hit_rate": 0.5}
                                   for i, (p, r, v) in enumerate(NODES)],
                         "calibration": {"prompts": 0, "steps": 0, "block_size": 32, "threshold": 0.9}}
    g.update(overrides)
    return g


def engine_with_graph(loaded: LoadedModel, folder: Path, graph: dict[str, Any] | str | None = None) -> Engine:
    """An engine on `loaded` whose checkpoint folder is `folder`, holding `graph` (JSON text or an object) if given."""
    if graph is not None:
        (folder / GRAPH_FILE).write_text(graph if isinstance(graph, str) else json.dumps(graph))
    return Engine(dataclasses.replace(loaded, folder=folder), num_slots=4096, check_invariants=True)


def stacked(scores: list[Scores]) -> torch.Tensor:
    """The logits [R, N, V] of a branched verify's row groups."""
    return torch.stack([s.logits for s in scores])


def branch_logits(rt: Any, req: Any, start: int, states: list[State], backend: Any,
                  fold: Fold) -> tuple[torch.Tensor, FoldCounts]:
    """The logits [R, N, V] of states verified as one request's row groups through a folded `backend`
    (backend.forward.folded), and its fold counts."""
    result = rt.branch_forward(req, states, start, fold, backend)
    return result.logits, result.folds
