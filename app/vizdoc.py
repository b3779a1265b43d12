"""The visualizer's document: one run as compact JSON, sent to the browser once; static/viz.js renders each round
from it, so stepping never goes back to the server. Pure functions, no I/O."""
from __future__ import annotations

import json
from typing import Any

from app.figures import acceptance_position_figure, accepted_length_figure, isd_case_figure, kv_figure
from app.specmetrics import fold_ratios, spec_metrics, step_map
from app.trace import Event, Piece, RunTrace

# per mode: what a round, "accepted" and "committed" mean there (shown in place in the visualizer)
EXPLAIN: dict[str, str] = {
    "ar": "One forward per token. Each round commits exactly the token the model picked; nothing is drafted.",
    "block_diffusion": "A block of masks is denoised in several rounds: every round unmasks (accepts) the positions "
                       "whose confidence passes τ (at least one); the block is committed once no mask is left.",
    "linear_spec": "Round = draft the block in one pass (block attention, LoRA), then verify it causally. Accepted = "
                   "the leading drafts the verifier agrees with; the first disagreement becomes the correction "
                   "(bonus) and the rest is rejected; its KV is trimmed. Committed = accepted + correction.",
    "isd": "Introspective strided decoding: each forward verifies the previous round's N-1 specs against p and "
           "drafts new ones. Case V: every spec accepted; R: a spec rejected, the correction replaces it and the "
           "rest is dropped (KV trimmed); C: cold start, nothing to verify. Accepted spec: p/q test passed (greedy: "
           "same argmax; T > 0: u < min(1, p/(αq))).",
    "quadratic": "One forward per round over [d0, M×k, d1, M×k, …]: each spec d_j is followed by k masks that see "
                 "exactly d0..d_j. Accepted = the specs the causal rows confirm, then the correction (bonus); the "
                 "accepted group's masks become the next k specs (drafts). Cells are in input order; the small "
                 "number under a cell is its position. Masks and rejected specs have their KV freed.",
    "spiffy": "Block diffusion with drafted future states: a verify forward denoises the main state and every "
              "drafted branch at once; when the next main state equals a drafted branch it is a cache hit and "
              "that round costs no forward (forwards saved). Accepted = unmasked this round.",
    "specfold": "spiffy whose verify forward folds work across branches: per layer and position, a branch whose "
                "input is within δ of its parent's reuses the parent's Q/K/V and FFN output. Fold ratio = share "
                "of draft rows not recomputed (QKV and FFN).",
}


def compact_round(r: Event, piece: Piece, pieces: dict[int, str]) -> dict[str, Any]:
    """A round event without its envelope, plus per-round fold ratios; records every token's text in `pieces`."""
    out = {k: v for k, v in r.items() if k not in ("v", "run_id", "seq", "type") and v is not None}
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
    if extra.get("replaced_draft") is not None:
        ids.append(extra["replaced_draft"])
    for token in ids:
        if token not in pieces:
            pieces[token] = piece(token)
    return out


def viz_document(trace: RunTrace, piece: Piece, start_round: int = 0) -> dict[str, Any]:
    """Everything the visualizer shows of one run; the per-run charts come as Plotly JSON."""
    pieces: dict[int, str] = {t: piece(t) for t in trace.prompt_ids}
    rounds = [compact_round(r, piece, pieces) for r in trace.rounds]
    for token in trace.output_ids:
        pieces.setdefault(token, piece(token))
    mask_ids = sorted({t for r in trace.rounds for t, s in zip(r.get("tokens") or [], r.get("states") or [],
                                                               strict=False) if s == "mask"})
    n_rounds = len(trace.rounds)
    figures = {"accepted": accepted_length_figure(trace.rounds), "kv": kv_figure(trace.kv, n_rounds)}
    metrics = spec_metrics(trace)
    if metrics:
        figures["positions"] = acceptance_position_figure(metrics["acceptance_rate_per_position"])
    if any(r.get("case") for r in trace.rounds):
        figures["cases"] = isd_case_figure(trace.rounds)
    return {"run_id": trace.run_id, "mode": trace.mode, "model": trace.model, "model_hash": trace.model_hash,
            "tiers": trace.tiers, "status": trace.status,
            "error": trace.error, "prompt": trace.prompt, "params": trace.params, "prompt_ids": trace.prompt_ids,
            "output_ids": trace.output_ids, "text": trace.text, "metrics": trace.metrics, "spec": metrics,
            "step_map": step_map(trace), "rounds": rounds, "pieces": {str(k): v for k, v in pieces.items()},
            "mask_ids": mask_ids, "explain": EXPLAIN.get(trace.mode, ""), "start_round": start_round,
            "figures": {k: json.loads(f.to_json()) for k, f in figures.items()}}


def document_json(doc: dict[str, Any] | None) -> str:
    """The document as JSON text with `<` escaped (it travels as an HTML component's value)."""
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c") if doc else ""
