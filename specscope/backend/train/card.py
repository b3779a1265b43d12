"""The model card of the shipped tiny model: what it was trained on, what it knows, what is out of its domain."""
from __future__ import annotations

from typing import Any

from specscope.backend.train.domain import TASK_FAMILIES
from specscope.backend.train.tasks import example_prompts

OUT_OF_DOMAIN = (
    "open questions, chat and general knowledge (it is a 5 M-parameter model, not a chatbot)",
    "arithmetic other than addition (no subtraction, multiplication beyond the tables, division)",
    "numbers outside each family's range (counting past 999, spelling past 9999, more than 4-digit sums)",
    "Python beyond the one-function families listed; free text continues like stdlib source, unchecked",
    "languages other than English",
)


def model_card() -> dict[str, Any]:
    """A short, machine-readable card: the families (with example prompts) and what is out of domain."""
    examples = example_prompts()
    return {
        "summary": "A tiny tri-mode (AR / block diffusion / I-DLM) model trained on CPU for a declared domain of "
                   "task families with canonical, checkable answers, plus Python standard-library source text.",
        "families": [{"name": f.name, "what": f.summary, "examples": examples[f.name]} for f in TASK_FAMILIES.values()],
        "answer_style": "lists space-separated; addition shows ones/tens/... columns, then 'So a + b = s'; "
                        "tables as 'n x i = p' lines; JSON as json.dumps; functions as def + 4-space body",
        "out_of_domain": list(OUT_OF_DOMAIN),
    }
