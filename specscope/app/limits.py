"""The server's input limits as every tab applies them: max_new_tokens clamped into its range, a message's length
refused in words before it is sent; and the Race's and Compare's choice of load tiers."""
from __future__ import annotations

import gradio as gr

from specscope.backend.server.protocol import MAX_NEW_TOKENS, MAX_PROMPT_CHARS

MAX_NEW = (1, MAX_NEW_TOKENS)
"""max_new_tokens bounds: the server's cap."""
MAX_NEW_LABEL = f"max_new_tokens [{MAX_NEW[0]}, {MAX_NEW[1]}]"
MAX_MESSAGE_CHARS = MAX_PROMPT_CHARS
"""The longest message the server takes."""
LENGTH_NOTE = f"at most {MAX_MESSAGE_CHARS:,} characters"


def clamp_max_new(value: float | None) -> int:
    """max_new_tokens within the server's range (an empty box means the smallest)."""
    return int(min(max(round(value or MAX_NEW[0]), MAX_NEW[0]), MAX_NEW[1]))


def too_long(text: str) -> str | None:
    """Why a message cannot be sent (it is longer than the server takes), in words; None when it can."""
    if len(text) <= MAX_PROMPT_CHARS:
        return None
    return (f"This message has {len(text):,} characters; a message may have {LENGTH_NOTE}. "
            f"Shorten it by {len(text) - MAX_PROMPT_CHARS:,} characters and send it again.")


SERVED_INFO = ("off: each mode drafts as it would alone; on: the server's load tiers may shorten or stop its drafts "
               "while several runs are active")


def served_toggle(elem_id: str) -> gr.Checkbox:
    """Whether the runs of an experiment go under the server's load tiers (their `tiers` parameter): off by
    default, so each mode runs as it would alone."""
    return gr.Checkbox(label="as served under load", info=SERVED_INFO, value=False, elem_id=elem_id, scale=1)
