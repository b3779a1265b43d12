"""Plotly charts drawn in the browser by the plotly package's own plotly.min.js (served, never vendored).

A chart is a gr.HTML whose value is a figure's JSON; its js_on_load draws it with Plotly.react and redraws it when
the value changes; the modebar's camera button saves the figure as SVG.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr
import plotly
import plotly.graph_objects as go
from fastapi import FastAPI
from fastapi.responses import FileResponse

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
PLOTLY_ROUTE = "/ui-assets/plotly.min.js"

DRAW_JS = """
const plot = () => element.querySelector('.ss-plot');
const draw = () => {
  const gd = plot();
  if (!gd) return;
  if (!props.value) { Plotly.purge(gd); return; }
  const fig = JSON.parse(props.value);
  gd.style.height = `${fig.layout.height || 400}px`;  // a resize keeps the figure's height, only width follows
  Plotly.react(gd, fig.data, fig.layout,
               {displaylogo: false, responsive: true, toImageButtonOptions: {format: 'svg'}});
};
new ResizeObserver(() => { const gd = plot(); if (gd && gd.data) Plotly.Plots.resize(gd); }).observe(element);
draw();
watch('value', draw);
"""

def chart(elem_id: str, visible: bool = True) -> gr.HTML:
    return gr.HTML(value="", html_template='<div class="ss-plot"></div>', js_on_load=DRAW_JS,
                   head=f'<script src="{PLOTLY_ROUTE}"></script>', elem_id=elem_id, visible=visible,
                   elem_classes=["ss-chart"])


def figure_json(fig: go.Figure | None) -> str:
    """A chart's value: the figure as JSON, or "" for none."""
    return fig.to_json() if fig is not None else ""


def serve_plotly_js(app: FastAPI) -> None:
    """GET PLOTLY_ROUTE: plotly.min.js from the installed plotly package."""
    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    app.add_api_route(PLOTLY_ROUTE, plotly_js, methods=["GET"], include_in_schema=False)
