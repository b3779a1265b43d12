// specscope UI helpers, loaded into the page head.

// Move the "cursor" shape of every cursor chart (app/plot.py) to a round, in the browser. The drawn SVG path is
// shifted (cheap: no Plotly redraw) and the layout updated, so any later redraw puts it at the same round.
window.specscopeMoveCursor = (round) => {
  document.querySelectorAll(".ss-cursor-chart .ss-plot").forEach((gd) => {
    const shapes = (gd.layout && gd.layout.shapes) || [];
    const k = shapes.findIndex((s) => s.name === "cursor");
    if (k < 0) return;
    const path = gd.querySelector(`.shapelayer path[data-index="${k}"]`);
    const area = gd.querySelector(".nsewdrag");
    const range = gd.layout.xaxis && gd.layout.xaxis.range;
    if (path && area && range) {
      if (path.dataset.drawnX === undefined) path.dataset.drawnX = shapes[k].x0;
      const perUnit = Number(area.getAttribute("width")) / (range[1] - range[0]);
      path.setAttribute("transform", `translate(${(round - Number(path.dataset.drawnX)) * perUnit},0)`);
      shapes[k].x0 = shapes[k].x1 = round;
    } else if (window.Plotly) {
      window.Plotly.relayout(gd, { [`shapes[${k}].x0`]: round, [`shapes[${k}].x1`]: round });
    }
  });
};

// Arrow keys step the round visualizer (when its tab is shown and no text field has focus).
document.addEventListener("keydown", (event) => {
  if (event.key !== "ArrowLeft" && event.key !== "ArrowRight") return;
  const target = event.target;
  if (target && (["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName) || target.isContentEditable)) return;
  const panel = document.getElementById("viz-panel");
  if (!panel || panel.offsetParent === null) return;
  const button = document.getElementById(event.key === "ArrowLeft" ? "viz-prev" : "viz-next");
  if (button) {
    event.preventDefault();
    button.click();
  }
});
