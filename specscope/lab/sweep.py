"""`specscope sweep SPEC.yaml`: a grid of runs (modes × parameter lists × a prompt set × repeats), each stored with
the sweep's id and its cell, run on this machine's engine in batches or spread over a Ray cluster's engines, resumed
without redoing the cells already stored, and summed up as the bench's table.

A spec:

    name: block-vs-n            # the sweep's id (default: the file's name)
    model: tiny                 # optional; else --model
    modes:                      # each mode with lists of values (a single value is a list of one)
      linear_spec: {block_size: [4, 8]}
      isd: {n: [2, 4]}
    prompts: heldout            # the model's held-out set (as the bench takes it), or a JSONL file of {"prompt"}
    count: 6                    # prompts taken from the set
    repeats: 1
    max_new_tokens: 32
"""
from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specscope.backend.engine.engine import Engine
from specscope.backend.engine.modes import baseline, mode_names
from specscope.backend.tracing import RecordingTracer

Event = dict[str, Any]
BATCH = 8
"""Cells an engine runs at once (the batched engine shares their forwards)."""


class SpecError(ValueError):
    """A sweep spec that cannot run, with what is wrong in it."""


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""
    mode: str
    params: tuple[tuple[str, Any], ...]
    prompt: int
    repeat: int

    def key(self) -> str:
        return json.dumps([self.mode, list(self.params), self.prompt, self.repeat])

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "params": dict(self.params), "prompt": self.prompt, "repeat": self.repeat}

    @staticmethod
    def of(stored: dict[str, Any]) -> Cell:
        return Cell(stored["mode"], tuple(sorted(stored["params"].items())), stored["prompt"], stored["repeat"])


@dataclass
class Sweep:
    name: str
    modes: dict[str, dict[str, list[Any]]]
    prompts: list[str]
    repeats: int = 1
    max_new_tokens: int = 32
    model: str | None = None
    cells: list[Cell] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cells = [Cell(mode, params, p, r) for mode, grid in self.modes.items() for params in combinations(grid)
                      for p in range(len(self.prompts)) for r in range(self.repeats)]


def combinations(grid: dict[str, list[Any]]) -> Iterator[tuple[tuple[str, Any], ...]]:
    names = sorted(grid)
    for values in itertools.product(*(grid[n] for n in names)):
        yield tuple(zip(names, values, strict=True))


def load_spec(path: Path, default_model: str | None, held_out: Callable[[str | None, int], list[str]]) -> Sweep:
    """The sweep a YAML spec describes; SpecError naming what is wrong. `held_out(model, count)`: the prompt set."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("modes"), dict) or not doc["modes"]:
        raise SpecError(f"{path}: a sweep spec is a mapping with `modes: {{mode: {{param: [values]}}}}`")
    known = set(mode_names())
    modes: dict[str, dict[str, list[Any]]] = {}
    for mode, grid in doc["modes"].items():
        if mode not in known:
            raise SpecError(f"{path}: unknown mode {mode!r} (known: {', '.join(sorted(known))})")
        if grid is not None and not isinstance(grid, dict):
            raise SpecError(f"{path}: {mode}'s parameters are a mapping of lists, got {grid!r}")
        modes[mode] = {k: v if isinstance(v, list) else [v] for k, v in (grid or {}).items()}
    count, model = int(doc.get("count", 6)), doc.get("model") or default_model
    source = doc.get("prompts", "heldout")
    prompts = held_out(model, count) if source == "heldout" else jsonl_prompts(path.parent / source, count)
    if not prompts:
        raise SpecError(f"{path}: the prompt set {source!r} is empty")
    return Sweep(str(doc.get("name") or path.stem), modes, prompts, int(doc.get("repeats", 1)),
                 int(doc.get("max_new_tokens", 32)), model)


def jsonl_prompts(path: Path, count: int) -> list[str]:
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [str(r["prompt"]) for r in rows][:count]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError(f"{path}: a JSONL file of {{\"prompt\": ...}} rows ({e})") from None


def run_cells(engine: Engine, sweep_id: str, cells: Sequence[Cell], prompts: Sequence[str],
              max_new_tokens: int) -> list[list[Event]]:
    """The cells' runs together on one engine (its batches share forwards); each run's events, tagged with the
    sweep and its cell. A cell whose parameters are refused is a run with an error."""
    tracers, requests = [], []
    for cell in cells:
        tracer = RecordingTracer(tags={"sweep": {"id": sweep_id, "cell": cell.as_dict()}})
        tracers.append(tracer)
        params = {"max_new_tokens": max_new_tokens, **dict(cell.params)}
        try:
            requests.append(engine.new_request(prompts[cell.prompt], cell.mode, params, tracer))
        except ValueError as e:
            tracer.emit("error", {"code": "bad_params", "message": str(e)})
    if requests:
        engine.run(requests)
    return [t.events for t in tracers]


def chunks(cells: Sequence[Cell], size: int) -> list[list[Cell]]:
    return [list(cells[i:i + size]) for i in range(0, len(cells), size)]


def store_run(store: Any, events: list[Event]) -> None:
    """One finished run's events into the store (a refused cell's lone error event is not a run)."""
    if events and events[0]["type"] == "run_start":
        for event in events:
            store.record(event)


def stored_cells(store: Any, sweep_id: str) -> set[str]:
    """The keys of the cells this sweep has stored as done runs."""
    runs = store.list_runs(status="done", sweep=sweep_id, limit=1_000_000)
    return {Cell.of(r["cell"]).key() for r in runs if r.get("cell")}


def summary_rows(store: Any, sweep_id: str) -> list[dict[str, Any]]:
    """One row per mode and parameters: runs, tokens, NFE, TPF, median tok/s, tokens per round, and tok/s
    against the sweep's `ar` runs where it has them."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in store.list_runs(status="done", sweep=sweep_id, limit=1_000_000):
        cell = run.get("cell") or {}
        label = run["mode"] + "".join(f" {k}={v}" for k, v in sorted((cell.get("params") or {}).items()))
        groups.setdefault(label, []).append(run["metrics"])
    rows = []
    for label, metrics in sorted(groups.items()):
        tokens, nfe = sum(m["tokens"] for m in metrics), sum(m["nfe"] for m in metrics)
        accept = [m["accept_len_mean"] for m in metrics if m.get("accept_len_mean") is not None]
        rows.append({"row": label, "runs": len(metrics), "tokens": tokens, "nfe": nfe,
                     "tpf": tokens / nfe if nfe else None,
                     "tok_per_s": statistics.median(m["tok_per_s"] for m in metrics if m.get("tok_per_s")),
                     "accept_len_mean": statistics.mean(accept) if accept else None})
    ar = next((r["tok_per_s"] for r in rows if r["row"] == baseline()), None)   # vs the exact mode
    for r in rows:
        r["vs_ar"] = r["tok_per_s"] / ar if ar else None
    return rows


def markdown(sweep_id: str, rows: Sequence[dict[str, Any]]) -> str:
    def f(x: float | None, spec: str, suffix: str = "") -> str:
        return "—" if x is None else f"{x:{spec}}{suffix}"
    lines = [f"| {r['row']} | {r['runs']} | {r['nfe']} | {f(r['tpf'], '.2f')} | {f(r['tok_per_s'], '.0f')} | "
             f"{f(r['vs_ar'], '.2f', '×')} | {f(r['accept_len_mean'], '.2f')} |" for r in rows]
    return (f"Sweep `{sweep_id}` (stored runs that ended done; tok/s: the median over runs):\n\n"
            f"| mode | runs | NFE | TPF | tok/s | vs {baseline()} | tokens / round |\n|---|---|---|---|---|---|---|\n"
            + "\n".join(lines) + "\n")


def progress(total: int, done: int) -> Any:
    from tqdm import tqdm
    return tqdm(total=total, initial=done, unit="run", desc="sweep", smoothing=0.1)


def run_local(sweep: Sweep, engine: Engine, todo: Sequence[Cell], keep: Callable[[list[Event]], None]) -> None:
    for group in chunks(todo, BATCH):
        for events in run_cells(engine, sweep.name, group, sweep.prompts, sweep.max_new_tokens):
            keep(events)


def execute(sweep: Sweep, store: Any, run: Callable[[Sequence[Cell], Callable[[list[Event]], None]], Any],
            out: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run the cells not stored yet through `run`, storing each as it ends, with a progress bar; then the table."""
    done = stored_cells(store, sweep.name)
    todo = [c for c in sweep.cells if c.key() not in done]
    out(f"sweep {sweep.name}: {len(sweep.cells)} cells, {len(sweep.cells) - len(todo)} stored already, "
        f"{len(todo)} to run")
    started = time.perf_counter()
    with progress(len(sweep.cells), len(sweep.cells) - len(todo)) as bar:
        def keep(events: list[Event]) -> None:
            store_run(store, events)
            bar.update(1)
        run(todo, keep)
    rows = summary_rows(store, sweep.name)
    out(f"ran {len(todo)} cells in {time.perf_counter() - started:.1f} s\n\n" + markdown(sweep.name, rows))
    return rows
