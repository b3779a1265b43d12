// specscope UI helpers, loaded into the page head.

// Keys of the round visualizer (when its tab is shown and no text field has focus): ← → step, Home / End jump to
// the first / last round, Space plays or pauses.
const VIZ_KEYS = {
  ArrowLeft: (viz) => viz.go(viz.k - 1),
  ArrowRight: (viz) => viz.go(viz.k + 1),
  Home: (viz) => viz.go(0),
  End: (viz) => viz.go(viz.doc.rounds.length - 1),
  " ": (viz) => (viz.timer ? viz.stop() : viz.play()),
};

document.addEventListener("keydown", (event) => {
  const action = VIZ_KEYS[event.key];
  if (!action || event.ctrlKey || event.metaKey || event.altKey) return;
  const target = event.target;
  if (target && (["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName) || target.isContentEditable)) return;
  const panel = document.getElementById("viz-panel");
  if (!panel || panel.offsetParent === null) return;
  const viz = panel.querySelector(".ssv")?.ssViz;
  if (!viz || !viz.doc || !viz.doc.rounds.length) return;
  event.preventDefault();
  action(viz);
});
