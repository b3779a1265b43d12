"""Why two runs of one prompt diverged, as HTML: the /api/diverge report (backend/engine/diverge.py) laid out for the
Compare and Runs tabs. Pure, no I/O: token texts come from a `piece` function."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specscope.app.figures import badge, esc, fmt, plural, show_piece
from specscope.app.trace import Piece, id_piece

Report = Mapping[str, Any]


def adapter_words(adapter: object) -> str:
    """on / off for a flag, else the adapter's name (— for none)."""
    if isinstance(adapter, bool):
        return "on" if adapter else "off"
    return str(adapter or "—")


def token_text(token: int | None, piece: Piece) -> str:
    """'"Paris" (id 3681)', escaped; 'no token' for None."""
    if token is None:
        return "no token"
    return f"<code>{esc(show_piece(piece(int(token)), 24))}</code> <small>(id {int(token)})</small>"


def top_table(side: Mapping[str, Any], piece: Piece) -> str:
    """A side's top-k at the position: rank, token, logit and the gap to the first; its own token marked."""
    top: Sequence[Mapping[str, Any]] = side.get("top") or []
    if not top:
        why = side.get("not_rescored") or ("the run ended before this position" if side.get("ended") else
                                           "not re-scored")
        return f'<div class="ss-note">no logits: {esc(why)}</div>'
    best = float(top[0]["logit"])
    rows = "".join(
        f'<tr class="{"ss-div-own" if t["id"] == side.get("token") else ""}"><td>{i + 1}</td>'
        f'<td>{token_text(t["id"], piece)}{" ◀ its token" if t["id"] == side.get("token") else ""}</td>'
        f'<td class="ss-num">{float(t["logit"]):.3f}</td><td class="ss-num">{best - float(t["logit"]):.3f}</td></tr>'
        for i, t in enumerate(top))
    return ('<table class="ss-table ss-div-top"><thead><tr><th>#</th><th>token</th><th>logit</th>'
            f'<th title="the first logit minus this one">below the first</th></tr></thead><tbody>{rows}</tbody>'
            '</table>')


def side_html(name: str, side: Mapping[str, Any], piece: Piece) -> str:
    """One run at the position: which run, its token, the forward that picked it, margin, resolution, top-k."""
    margin, resolution = side.get("margin"), side.get("resolution")
    shown = "—" if resolution is None else f"{resolution:.3g}"
    tie = badge("ss-bad", "near-tie") if side.get("near_tie") else ""
    reproduced = side.get("reproduced")
    again = "" if reproduced is None else badge("ss-ok", "re-scored alone, it picks the same") if reproduced else \
        badge("ss-bad", f"re-scored alone, it picks id {side.get('argmax')}")
    facts = [f"matmul {esc(side.get('matmul') or '?')}",
             f"adapter {esc(adapter_words(side.get('adapter')))}",
             f"T={fmt(side.get('temperature'))}"]
    return (f'<div class="ss-div-side" id="div-{name}"><div><b>{name}</b> · <b>{esc(side.get("mode"))}</b> '
            f'<code>{esc(side.get("run_id"))}</code> · {" · ".join(facts)}</div>'
            f'<div>its token: {token_text(side.get("token"), piece)} {again}</div>'
            f'<div class="ss-note">picked by {esc(side.get("path") or "—")}</div>'
            f'<div>margin (first − second logit) <b>{fmt(margin)}</b> · resolution <b>{shown}</b> '
            f'<span class="ss-note" title="{esc(side.get("resolution_note") or "")}">(what its precision can tell '
            f'apart here)</span> {tie}</div>{top_table(side, piece)}</div>')


def attribution_html(report: Report) -> str:
    """Each differing setting swapped alone: what the row then picks, and whether that moves it to the other's."""
    swaps: Sequence[Mapping[str, Any]] = report.get("attribution") or []
    if not swaps:
        return ""
    rows = []
    for w in swaps:
        verdict = badge("ss-bad", "moves it to the other's token") if w.get("to_other") else \
            badge("ss-ref", "moves the argmax") if w.get("moves") else badge("ss-ok", "no change")
        picks = esc(w.get("not_rescored") or f"id {w.get('argmax')}")
        rows.append(f'<tr><td>{esc(w.get("factor"))}</td><td>{esc(w.get("a"))}</td><td>{esc(w.get("b"))}</td>'
                    f'<td>{esc(w.get("probe"))}</td><td>{picks}</td><td>{verdict}</td></tr>')
    return ('<div><b>attribution</b>: each differing setting swapped alone<div class="ss-scroll"><table '
            'class="ss-table" id="div-attribution"><thead><tr><th>setting</th><th>a</th><th>b</th><th>re-scored</th>'
            f'<th>picks</th><th>effect</th></tr></thead><tbody>{"".join(rows)}</tbody></table></div></div>')


def claim_html(claim: Mapping[str, Any] | None) -> str:
    """The lossless claim one run's mode makes against the other's, and the verdict on it."""
    if not claim:
        return ""
    said = f"{esc(claim['mode'])} claims {esc(claim['reference'])}'s tokens"
    if claim.get("broken"):
        return f'<div>lossless claim: {said}: {badge("ss-bad", "broken")} {esc(claim.get("agreement") or "")}</div>'
    if claim.get("holds"):
        return f'<div>lossless claim: {said}: {badge("ss-ok", "holds")}</div>'
    blockers = ", ".join(claim.get("blockers") or []) or "not checked"
    return f'<div>lossless claim: {said}: not claimed here ({esc(blockers)})</div>'


def diverge_html(report: Report, piece: Piece = id_piece) -> str:
    """The whole report: where the runs part (or that they do not), the cause in words, the near-tie flag, both
    sides' top-k with logits and margins, the attribution and the lossless claim."""
    position = report.get("position")
    a, b = report.get("a") or {}, report.get("b") or {}
    runs = (f'<b>{esc(a.get("mode"))}</b> <code>{esc(a.get("run_id"))}</code> and <b>{esc(b.get("mode"))}</b> '
            f'<code>{esc(b.get("run_id"))}</code>')
    if position is None:
        where = f"{runs} never part"
    else:
        prompt = int(report.get("prompt_tokens") or 0)
        where = (f"{runs} first part at output token {int(position)} (after {plural(int(position), 'shared token')}"
                 f"; position {int(position) + prompt} counting the prompt's {plural(prompt, 'token')})")
    tie = badge("ss-bad", "near-tie: a margin is under its precision's resolution") if report.get("near_tie") else ""
    sides = "" if position is None else \
        f'<div class="ss-div-sides">{side_html("a", a, piece)}{side_html("b", b, piece)}</div>'
    return (f'<div class="ss-diverge" id="div-report"><div class="ss-round-head">{where}</div>'
            f'<div class="ss-div-cause"><b>cause</b>: {esc(report.get("cause") or "—")} {tie}</div>'
            f'{claim_html(report.get("lossless_claim"))}{sides}{attribution_html(report)}</div>')


def differing_pairs(runs: Sequence[Any], reference: Any, labels: Sequence[str]) -> list[tuple[str, str]]:
    """(choice label, 'A B' run ids) for each finished run whose output differs from the finished reference's, the
    reference first: the pairs a comparison offers to explain."""
    if reference is None or reference.status != "done" or not reference.run_id:
        return []
    named = dict(zip((id(r) for r in runs), labels, strict=True))
    return [(f"{named[id(reference)]} vs {named[id(r)]} ({r.run_id})", f"{reference.run_id} {r.run_id}")
            for r in runs if r is not reference and r.status == "done" and r.run_id
            and r.output_ids != reference.output_ids]
