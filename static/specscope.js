// specscope UI helpers, loaded into the page head.

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
