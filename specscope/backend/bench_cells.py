"""The bench table's cells that both its Markdown (`specscope.lab.bench`) and the UI's Bench tab show; no torch here."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def same_as_reference(row: Mapping[str, Any]) -> str:
    """'100 % vs ar'; for a mode whose tokens differ, '0 % vs ar, first 11 % agree'; '—' where no reference ran."""
    same, agreed = row.get("same_as_reference"), row.get("agreed_prefix")
    if same is None:
        return "—"
    text = f"{100 * same:.0f} % vs {row.get('reference')}"
    if same < 1 and agreed is not None:
        text += f", first {100 * agreed:.0f} % agree"
    return text


def model_pick(row: Mapping[str, Any]) -> str:
    """'100 % (0.52)': the share of a row's answer tokens that are the model's own greedy choice after the same
    prefix, and their mean negative log-likelihood under the model; '—' for a row without them."""
    share, nll = row.get("greedy_share"), row.get("answer_nll")
    return "—" if share is None or nll is None else f"{100 * share:.0f} % ({nll:.2f})"


def pick_count(summary: Mapping[str, Any]) -> str:
    """'12/12 (0.58)': of one answer's tokens (an AnswerFit summary, or /api/runs/{id}/fit), those that are the
    model's own greedy pick, and their mean NLL under it; '—' for an empty answer."""
    if not summary.get("tokens"):
        return "—"
    return f"{summary['greedy']}/{summary['tokens']} ({summary['nll_mean']:.2f})"
