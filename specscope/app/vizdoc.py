"""The visualizer's document: one run as compact JSON, sent to the browser once; app/static/viz.js renders each round
from it, so stepping never goes back to the server. Pure functions, no I/O."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from specscope.app.figures import (
    DEFINITIONS,
    acceptance_position_figure,
    accepted_count,
    accepted_length_figure,
    case_figure,
    kv_figure,
    kv_time_figure,
    phase_timeline_figure,
    shown_pieces,
    tree_lanes,
)
from specscope.app.live import running_figures
from specscope.app.modebook import ModeBook
from specscope.app.palette import vocabulary
from specscope.app.specmetrics import fold_ratios, spec_metrics, step_map
from specscope.app.trace import Event, Piece, RunTrace
from specscope.backend.engine.cost_curve import CostCurve
from specscope.backend.engine.speedup import DIGITS, against_one_row, projected, shown, usable


def compact_round(r: Event, piece: Piece, pieces: dict[int, str]) -> dict[str, Any]:
    """A round event without its envelope, plus per-round fold ratios and its accepted count (counted from its
    states for a run stored before rounds recorded it); records every token's text in `pieces`."""
    out = {k: v for k, v in r.items() if k not in ("v", "run_id", "seq", "type") and v is not None}
    out["accepted"] = accepted_count(r)
    lanes = tree_lanes(r)
    if lanes is not None:
        out["lanes"] = lanes
    qkv, ffn = fold_ratios(r)
    if qkv is not None:
        out["fold_qkv"] = qkv
    if ffn is not None:
        out["fold_ffn_ratio"] = ffn
    ids = list(r.get("tokens") or []) + list(r.get("committed") or [])
    ids += [t for b in r.get("branches") or [] for t in b.get("tokens") or []]
    ids += [e.get("token") for e in r.get("pq") or [] if e.get("token") is not None]
    extra = r.get("extra") or {}
    ids += list(extra.get("guess") or [])
    ids += [t for cell in r.get("topk") or [] for entry in cell or [] for t, _ in entry.get("top") or []]
    if extra.get("replaced_draft") is not None:
        ids.append(extra["replaced_draft"])
    for token in ids:
        if token not in pieces:
            pieces[token] = piece(token)
    return out


def speedup_figures(trace: RunTrace, elsewhere: Mapping[str, CostCurve]) -> dict[str, Any] | None:
    """An ended run's speedup explained against its machine's 1-row step (speedup.against_one_row), and what its
    forwards would give on each of `elsewhere`'s curves (stored benches of other machines)."""
    metrics = trace.metrics
    if trace.status == "running" or not trace.cost_curve or not usable(metrics):
        return None
    there = {name: projected(metrics, curve) for name, curve in elsewhere.items()}
    here = against_one_row(metrics, CostCurve.from_json(trace.cost_curve))
    return {"here": None if here is None else shown(here), "digits": DIGITS,
            "elsewhere": [{"machine": name, "speedup": speedup} for name, speedup in there.items()
                          if speedup is not None]}


def viz_document(trace: RunTrace, piece: Piece, start_round: int = 0, book: ModeBook | None = None,
                 fit: dict[str, Any] | None = None, elsewhere: Mapping[str, CostCurve] | None = None) -> dict[str, Any]:
    """Everything the visualizer shows of one run, with what it draws with (`vocab`: states, colours, limits) and
    each piece as shown (`shown`); the per-run charts come as Plotly JSON. `book`: the modes' declarations
    (/api/modes), for what a round means in the run's mode (`explain`) and its colour (`color`); `pq`: whether its
    rounds record a p/q table or a round case (the p/q panel); `fit`: the served model's rating of the answer
    (GET /api/runs/{id}/fit: its own pick and the NLL at each output token), when it has one; `elsewhere`: other
    machines' cost curves, on which the run's speedup is projected."""
    modes = book or ModeBook()
    pieces: dict[int, str] = {t: piece(t) for t in trace.prompt_ids}
    rounds = [compact_round(r, piece, pieces) for r in trace.rounds]
    for token in [*trace.output_ids, *(fit or {}).get("picks", [])]:
        pieces.setdefault(token, piece(token))
    mask_ids = sorted({t for r in trace.rounds for t, s in zip(r.get("tokens") or [], r.get("states") or [],
                                                               strict=False) if s == "mask"})
    n_rounds = len(trace.rounds)
    figures = {"accepted": accepted_length_figure(trace.rounds), "kv": kv_figure(trace.kv, n_rounds),
               "timeline": phase_timeline_figure(trace.rounds)}
    if trace.kv:
        figures["kv_time"] = kv_time_figure(trace.kv, trace.rounds)
    metrics = spec_metrics(trace)
    if metrics:
        figures["positions"] = acceptance_position_figure(metrics["acceptance_rate_per_position"])
    if any(r.get("case") for r in trace.rounds):
        figures["cases"] = case_figure(trace.rounds)
    return {"run_id": trace.run_id, "mode": trace.mode, "model": trace.model, "model_hash": trace.model_hash,
            "matmul": trace.matmul, "tiers": trace.tiers, "tier_note": trace.tier_note, "status": trace.status,
            "error": trace.error, "prompt": trace.prompt, "params": trace.params, "prompt_ids": trace.prompt_ids,
            "output_ids": trace.output_ids, "text": trace.text, "metrics": run_figures(trace), "spec": metrics,
            "speedup": speedup_figures(trace, elsewhere or {}),
            "definitions": DEFINITIONS,
            "step_map": step_map(trace), "rounds": rounds, "pieces": {str(k): v for k, v in pieces.items()},
            "shown": shown_pieces({str(k): v for k, v in pieces.items()}), "vocab": vocabulary(),
            "mask_ids": mask_ids, "explain": modes.explain(trace.mode), "color": modes.color(trace.mode),
            "pq": any(r.get("pq") or r.get("case") for r in trace.rounds), "start_round": start_round,
            "fit": None if fit is None else {k: fit[k] for k in ("picks", "nll", "greedy", "tokens", "nll_mean")},
            "figures": {k: json.loads(f.to_json()) for k, f in figures.items()}}


def document_json(doc: dict[str, Any] | None) -> str:
    """The document as JSON text with `<` escaped (it travels as an HTML component's value)."""
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c") if doc else ""


def run_figures(trace: RunTrace) -> dict[str, Any]:
    """An ended run's metrics; a running one's figures so far (tokens, NFE, TPF, tok/s), over the time its last
    round was made at."""
    seconds = max((float(r.get("t_ms") or 0) for r in trace.rounds), default=0.0) / 1000
    return running_figures(trace, seconds)
