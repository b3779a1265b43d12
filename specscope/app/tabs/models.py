"""The model picker in the header: the served model (name, weights hash) and a switch to another folder of the
server's models directory (`specscope serve --models DIR`)."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr

from specscope.app.client import BackendError, BackendUnavailable
from specscope.app.figures import warning_html
from specscope.app.session import Backend


def model_info_html(listing: dict[str, Any]) -> str:
    """The served model and its weights hash, plus the catalog folders that cannot be loaded and why."""
    broken = [m for m in listing.get("models", []) if not m.get("loadable")]
    skipped = "".join(f'<li><code>{html.escape(m["name"])}</code>: {html.escape(str(m.get("error")))}</li>'
                      for m in broken)
    return (f'<div id="model-current">serving <b>{html.escape(str(listing.get("current")))}</b> · weights '
            f'<code>{html.escape(str(listing.get("weights_hash") or "?"))}</code> · '
            f'{html.escape(str(listing.get("family") or ""))}'
            + (f' · matmuls in {html.escape(str(listing["matmul"]))}' if listing.get("matmul") else "") + '</div>'
            + (f'<details><summary>{len(broken)} folder(s) cannot be loaded</summary><ul>{skipped}</ul></details>'
               if broken else ""))


def picker_update(listing: dict[str, Any]) -> gr.Dropdown:
    """The loadable folders (and the served model, even when it is not one of them); fixed without a catalog."""
    names = [m["name"] for m in listing.get("models", []) if m.get("loadable")]
    current = str(listing.get("current")).split("+")[0]   # the served model, without its adapter
    return gr.Dropdown(choices=names if current in names else [current, *names], value=current,
                       interactive=bool(names))


@dataclass
class ModelPicker:
    backend: Backend
    choice: gr.Dropdown
    info: gr.HTML

    def show(self, request: gr.Request) -> tuple[Any, str]:
        """The picker and its note as the backend lists them now."""
        try:
            listing = self.backend.client(request).models()
        except (BackendUnavailable, BackendError) as exc:
            return gr.skip(), warning_html(exc)
        return picker_update(listing), model_info_html(listing)

    def follow(self, shown: str | None, request: gr.Request) -> tuple[Any, Any]:
        """Show a switch made elsewhere (another browser, the API): re-list only when the served model changed, and
        not while a switch through this UI loads its model (the picker shows the model it switches to)."""
        if self.backend.switching:
            return gr.skip(), gr.skip()
        try:
            served = self.backend.client(request).health().get("model")
        except (BackendUnavailable, BackendError):
            return gr.skip(), gr.skip()
        if served == shown or self.backend.switching:   # a switch began while health was read
            return gr.skip(), gr.skip()
        return self.show(request)

    def switch(self, name: str, request: gr.Request) -> tuple[Any, str]:
        """Serve `name` (the backend cancels running runs first), then show what is served."""
        try:
            listing = self.backend.client(request).switch_model(name)
        except (BackendUnavailable, BackendError) as exc:
            shown, _ = self.show(request)
            return shown, warning_html(exc)
        return picker_update(listing), model_info_html(listing)


def build_model_picker(backend: Backend) -> ModelPicker:
    with gr.Row(elem_id="model-row"):
        choice = gr.Dropdown(label="model", choices=[], elem_id="model-pick", scale=1, interactive=False)
        info = gr.HTML(elem_id="model-info")
    return ModelPicker(backend, choice, info)
