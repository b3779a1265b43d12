"""Calibrate Spiffy's draft graph on the model's own block_diffusion trajectories.

    specscope calibrate [--model tiny|smollm2-135m|DIR] [--out DIR] [--per-kind 10] [--branches 7]

Runs block_diffusion (greedy, default parameters) on the calibration prompts (`task_set("calibration")`,
every task family x per-kind; disjoint from the held-out split by construction) and records every denoise step: the
block state and the ranks its logits give (positions by confidence, tokens per position). Each step's
successor is the unmask pattern the real trajectory took, as (position rank, vocab rank) under the previous
step's logits. The graph then grows greedily, one node (parent, pos_rank, vocab_rank) at a time: the node
that most increases the forwards Spiffy saves when replaying the recorded trajectories with the same
expansion and cache rule as the mode (a hit = a state whose logits a verify forward already produced).
Writes draft_graph.json to --out (default: the adapter folder of a model with one, else the checkpoint folder).
"""
from __future__ import annotations

import argparse
import itertools
from collections.abc import Generator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specscope.backend.engine.ask import Ask
from specscope.backend.engine.blocks import BlockState, Dense, candidates
from specscope.backend.engine.draft_graph import GRAPH_FILE, DraftGraph, Eligible, Node, Ranking, State, child
from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes.block_diffusion import BlockDiffusion
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.scores import Scores
from specscope.backend.model.checkpoint import load_checkpoint
from specscope.backend.model.source import resolve
from specscope.backend.train.prompts import CATEGORIES, prompt_set
from specscope.backend.train.tasks import task_set

CALIBRATION_SEED = 11


@dataclass(frozen=True)
class Step:
    """One denoise step of a recorded trajectory: the block state and the ranks of its logits."""
    state: State
    ranking: Ranking


class RecordingDense(Dense):
    """block_diffusion's dense logits source, recording each denoise step as (block start, step)."""

    def __init__(self, top_k: int, steps: list[tuple[int, Step]]):
        self.top_k, self.steps = top_k, steps

    def logits(self, req: Request, rt: Runtime, block: BlockState) -> Generator[Ask, Any, Scores]:
        scores = yield from super().logits(req, rt, block)
        self.steps.append((block.start, Step(tuple(block.tokens), Ranking.of(scores, self.top_k))))
        return scores


class Recorder(BlockDiffusion):
    """block_diffusion, unchanged, whose logits source records its denoise steps (not a registered mode)."""

    def __init__(self, top_k: int):
        self.top_k = top_k
        self.steps: list[tuple[int, Step]] = []

    def source(self, req: Request, rt: Runtime) -> RecordingDense:
        return RecordingDense(self.top_k, self.steps)


def record(engine: Engine, prompts: list[str], params: dict[str, Any], top_k: int) -> list[list[Step]]:
    """The denoise steps of block_diffusion on each prompt, grouped by block."""
    blocks: list[list[Step]] = []
    for prompt in tqdm(prompts, desc=Recorder.name, leave=False):
        recorder = engine.scheduler.policies[Recorder.name] = Recorder(top_k)   # in the registered mode's place
        engine.run([engine.new_request(prompt, Recorder.name, params)])
        for _, steps in itertools.groupby(recorder.steps, key=lambda s: s[0]):
            blocks.append([s for _, s in steps])
    return blocks


@dataclass
class Replay:
    saved: int           # cache hits = forwards saved
    verifies: int        # verify forwards that carried drafts
    hits: list[int]      # per node


class Replayer:
    """Spiffy on recorded trajectories: at a miss, verify the main state plus the graph's drafts (expanded
    with the previous step's ranks); a later state found among verified drafts is a saved forward."""

    def __init__(self, blocks: list[list[Step]], eligible: Eligible, mask_id: int):
        self.blocks, self.eligible, self.mask_id = blocks, eligible, mask_id
        self.nodes: list[Node] = []
        self.states: list[list[list[State | None]]] = [[[] for _ in b] for b in blocks]   # [block][step][node]

    def draft(self, block: int, t: int, node: Node, known: list[State | None]) -> State | None:
        steps = self.blocks[block]
        parent = steps[t].state if node.parent < 0 else known[node.parent]
        if parent is None:
            return None
        return child(parent, steps[t - 1].ranking, self.eligible, node.pos_rank, node.vocab_rank)

    def add(self, node: Node) -> None:
        self.nodes.append(node)
        for b, steps in enumerate(self.states):
            for t in range(1, len(steps)):
                steps[t].append(self.draft(b, t, node, steps[t]))

    def run(self, extra: Node | None = None) -> Replay:
        """Replay with the graph's nodes (plus `extra`, a candidate next node)."""
        n = len(self.nodes) + (extra is not None)
        out = Replay(0, 0, [0] * n)
        for b, steps in enumerate(self.blocks):
            cache: dict[State, int] = {}
            for t, step in enumerate(steps):
                node = cache.pop(step.state, None)
                if node is not None:
                    out.saved += 1
                    out.hits[node] += 1
                elif t:
                    out.verifies += 1
                    states = self.states[b][t]
                    if extra is not None:
                        states = states + [self.draft(b, t, extra, states)]
                    fresh: dict[State, int] = {}
                    for k, s in enumerate(states):
                        if s is not None and self.mask_id in s:
                            fresh.setdefault(s, k)
                    cache.update(fresh)
        return out


def grow_graph(replayer: Replayer, branches: int, max_pos_rank: int, max_vocab_rank: int) -> Replay:
    """Add `branches` nodes greedily, each the candidate that saves the most forwards on the replay."""
    for _ in tqdm(range(branches), desc="graph nodes", leave=False):
        taken = {(n.parent, n.pos_rank, n.vocab_rank) for n in replayer.nodes}
        k = len(replayer.nodes)
        grid = itertools.product(range(-1, k), range(max_pos_rank), range(max_vocab_rank))
        best = max((Node(k, *c) for c in grid if c not in taken), key=lambda c: replayer.run(c).saved)
        replayer.add(best)
    return replayer.run()


def calibrate(engine: Engine, prompts: list[str], branches: int, max_pos_rank: int = 6,
              max_vocab_rank: int = 3, max_new_tokens: int = 64) -> DraftGraph:
    """A draft graph of `branches` nodes calibrated on block_diffusion (greedy, default params)."""
    params = {"max_new_tokens": max_new_tokens}
    blocks = record(engine, prompts, params, max_vocab_rank)
    defaults = {p.name: p.default for p in BlockDiffusion.params}
    eligible = partial(candidates, mask_id=engine.rt.mask, sub_block=defaults["sub_block"])
    replayer = Replayer(blocks, eligible, engine.rt.mask)
    replay = grow_graph(replayer, branches, max_pos_rank, max_vocab_rank)
    steps = sum(len(b) for b in blocks)
    nodes = tuple(Node(n.id, n.parent, n.pos_rank, n.vocab_rank,
                       round(replay.hits[n.id] / replay.verifies, 4) if replay.verifies else 0.0)
                  for n in replayer.nodes)
    return DraftGraph(nodes, {"prompts": len(prompts), "steps": steps, "block_size": defaults["block_size"],
                              "threshold": defaults["threshold"], "sub_block": defaults["sub_block"],
                              "max_new_tokens": max_new_tokens, "model": engine.model_name,
                              "verifies": replay.verifies, "forwards_saved": replay.saved})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "--checkpoint", dest="model", default="tiny",
                   help="model name or checkpoint folder (default: tiny)")
    p.add_argument("--out", default=None, help=f"folder for {GRAPH_FILE} (default: the model's adapter folder if it "
                                               "has one, else the checkpoint folder)")
    p.add_argument("--per-kind", type=int, default=10,
                   help="calibration prompts per task family (the tiny model); other models take this many chat "
                        "prompts per category of the training templates")
    p.add_argument("--branches", type=int, default=7, help="graph nodes (draft branches)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-pos-rank", type=int, default=6, help="position ranks searched")
    p.add_argument("--max-vocab-rank", type=int, default=3, help="vocabulary ranks searched")


def calibration_prompts(name: str, per_kind: int) -> list[str]:
    """The tiny model's calibration split, else chat prompts of the training templates (never the held-out ones
    the bench uses)."""
    if name == "tiny":
        return [t.prompt for t in task_set("calibration", per_kind)]
    rows = prompt_set(per_kind * len(CATEGORIES), seed=CALIBRATION_SEED, held_out=False)
    return [r["messages"][0]["content"] for r in rows]


def run(args: argparse.Namespace) -> DraftGraph:
    source = resolve(args.model)
    engine = Engine(load_checkpoint(source.folder, adapter=source.adapter, name=source.name), num_slots=8192)
    prompts = calibration_prompts(source.name, args.per_kind)
    graph = calibrate(engine, prompts, args.branches, args.max_pos_rank, args.max_vocab_rank, args.max_new_tokens)
    path = Path(args.out or engine.rt.loaded.adapter_dir or source.folder) / GRAPH_FILE
    graph.save(path)
    cal = graph.calibration
    print(f"{path}: {len(graph.nodes)} nodes from {cal['prompts']} prompts, {cal['steps']} denoise steps; "
          f"replay saves {cal['forwards_saved']} forwards ({cal['forwards_saved'] / max(cal['steps'], 1):.0%})")
    for n in graph.nodes:
        print(f"  node {n.id}: parent {n.parent:2d}  pos_rank {n.pos_rank}  vocab_rank {n.vocab_rank}  "
              f"hit_rate {n.hit_rate:.3f}")
    return graph
