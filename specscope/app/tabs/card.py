"""The served model's card (what it knows, what is out of its domain) and one-click example prompts per family."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.session import Backend

Card = dict[str, Any]
NO_CARD = "This checkpoint ships no model card (model_card.json): nothing is declared about what it knows."


def cost_html(answer: Card) -> str:
    """What a forward costs here by its rows (the engine's cost curve): the price the cost-aware verify length
    and the draft tiers pay for each drafted row."""
    curve = answer.get("cost_curve")
    if not curve:
        return ""
    rows = list(curve["ms"])
    head = "".join(f"<th>{html.escape(r)}</th>" for r in rows)
    ms = "".join(f'<td class="ss-num">{curve["ms"][r]:.2f}</td>' for r in rows)
    ratio = "".join(f'<td class="ss-num">{curve["vs_one_row"][r]:.2f}×</td>' for r in rows)
    return (f'<div id="ss-cost-curve"><p><b>what a forward costs here</b> ({html.escape(str(answer.get("matmul")))}'
            ' matmuls): a verify of k rows against a decode step of one, which is what a drafted token must pay '
            'for</p><table class="ss-table"><thead><tr><th>rows</th>' + head + "</tr></thead><tbody>"
            f"<tr><td>ms</td>{ms}</tr><tr><td>vs 1 row</td>{ratio}</tr></tbody></table>"
            f'<p class="ss-provenance" id="ss-cost-provenance">{html.escape(provenance_text(curve))}</p></div>')


def provenance_text(curve: Card) -> str:
    """How the curve was measured, in a sentence: when, how long, on how many CPUs and threads, the machine's load
    before and after, and whether it was kept as the machine's."""
    p = curve.get("provenance")
    if not p:
        flat = all(v == 1 for v in curve.get("vs_one_row", {}).values())
        return "Not measured: " + ("rows are priced as free (the flat curve)." if flat else
                                   "the server was given this curve.")
    where = "Read from this machine's cache" if p.get("source") == "cache" else "Measured as the engine started"
    facts = (f"{where}: measured {p['measured_at']} in {p['seconds']:.1f} s on {p['cpus']} CPUs with "
             f"{p['threads']} threads, 1-minute load average {p['load_before']:.2f} before and "
             f"{p['load_after']:.2f} after")
    if p.get("busy"):
        return f"{facts}. The machine was busy ({p['busy']}): this engine uses the curve; it is not kept."
    return f"{facts}; " + ("kept as the machine's." if p.get("cached") else "not kept (the cache was not writable).")


def card_html(answer: Card) -> str:
    """The card as escaped HTML: summary, the task families it was trained on, what is out of its domain, and
    what a forward costs on this machine."""
    card = answer.get("card")
    name = html.escape(str(answer.get("model", "?")))
    if not card:
        return f'<div class="ss-card" id="ss-card"><b>{name}</b>: {html.escape(NO_CARD)}{cost_html(answer)}</div>'
    rows = "".join(f"<tr><td><b>{html.escape(f['name'])}</b></td><td>{html.escape(f.get('what', ''))}</td></tr>"
                   for f in card.get("families", []))
    outside = "".join(f"<li>{html.escape(x)}</li>" for x in card.get("out_of_domain", []))
    style = card.get("answer_style")
    adapter = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{value_html(v)}</td></tr>"
                      for k, v in (card.get("adapter") or {}).items())
    return (f'<div class="ss-card" id="ss-card"><p><b>{name}</b>: {html.escape(card.get("summary", ""))}</p>'
            f'<table class="ss-table"><thead><tr><th>family</th><th>what it knows</th></tr></thead>'
            f'<tbody>{rows}</tbody></table>'
            + (f"<p><b>answers</b>: {html.escape(style)}</p>" if style else "")
            + (f'<p><b>self-speculation adapter</b></p><table class="ss-table"><tbody>{adapter}</tbody></table>'
               if adapter else "")
            + f"<p><b>out of its domain</b></p><ul>{outside}</ul>{cost_html(answer)}</div>")


def value_html(value: Any) -> str:
    """A card value as escaped HTML: text as it is, a list as a list, a mapping of records (the held-out figures
    per adapter stage) as a table with a column per field, another mapping as a two-column table."""
    if isinstance(value, list):
        return f"<ul>{''.join(f'<li>{value_html(v)}</li>' for v in value)}</ul>"
    if not isinstance(value, dict):
        return html.escape(str(value))
    if value and all(isinstance(v, dict) for v in value.values()):
        fields = list(dict.fromkeys(k for record in value.values() for k in record))
        head = "".join(f"<th>{html.escape(f)}</th>" for f in fields)
        rows = "".join(f"<tr><td>{html.escape(name)}</td>" + "".join(cell(r.get(f)) for f in fields) + "</tr>"
                       for name, r in value.items())
        return f'<table class="ss-table"><thead><tr><th></th>{head}</tr></thead><tbody>{rows}</tbody></table>'
    rows = "".join(f"<tr><td>{html.escape(k)}</td>{cell(v)}</tr>" for k, v in value.items())
    return f'<table class="ss-table"><tbody>{rows}</tbody></table>'


def cell(value: Any) -> str:
    """A table cell: numbers right-aligned, anything else as value_html, left-aligned."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<td class="ss-num">{html.escape(str(value))}</td>'
    return f"<td>{'' if value is None else value_html(value)}</td>"


def example_samples(answer: Card) -> list[list[str]]:
    """[family, prompt] rows for the example pickers."""
    card = answer.get("card") or {}
    return [[f["name"], p] for f in card.get("families", []) for p in f.get("examples", [])]


@dataclass
class ModelCard:
    html: gr.HTML
    backend: Backend

    def load(self, request: gr.Request) -> list[Any]:
        """The card and fresh example rows for every example picker (after a load or a model switch)."""
        try:
            answer = self.backend.client(request).model_card()
        except (BackendUnavailable, BackendError) as exc:
            return [f'<div class="ss-card" id="ss-card">model card unavailable: {html.escape(str(exc))}</div>',
                    gr.skip(), gr.skip()]
        samples = example_samples(answer)
        return [card_html(answer), gr.Dataset(samples=samples), gr.Dataset(samples=samples)]


def build_model_card(backend: Backend) -> ModelCard:
    with gr.Accordion("model card: what this model knows", open=False, elem_id="ss-card-open"):
        shown = gr.HTML(elem_id="ss-card-body")
    return ModelCard(shown, backend)


def example_picker(target: gr.Textbox, elem_id: str) -> gr.Dataset:
    """One-click examples (family, prompt): clicking a row puts its prompt into `target`."""
    examples = gr.Dataset(components=[gr.Textbox(visible=False), gr.Textbox(visible=False)],
                          headers=["family", "prompt"], samples=[], label="examples (one click fills the prompt)",
                          samples_per_page=6, elem_id=elem_id, layout="table")
    examples.click(lambda row: row[1], examples, target, show_progress="hidden")
    return examples
