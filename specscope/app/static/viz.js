// specscope visualizer: renders one run's document (app/vizdoc.py) round by round, entirely in the browser.
// A step redraws only the round panels (grid, confidence, ISD p/q, branches, fold) and moves the chart cursors;
// the per-run charts are drawn once per document. Everything shown is escaped text (esc) or Plotly data.
// What it draws with (states, colours, the counts' definitions, limits) and each piece as shown come inside every
// document (`vocab` and `shown`, from app/palette.py and app/figures.py): nothing of them is written here.
window.specscopeViz = (() => {
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ESC[c]);
  const clip = (text, limit = 14) => (text.length <= limit ? text : text.slice(0, limit - 1) + "…");
  const fmt = (v, d = 3) => (v === null || v === undefined ? "—" : typeof v === "number" && !Number.isInteger(v)
    ? v.toFixed(d) : String(v));
  // a probability: three decimals, or three significant digits below 0.001 (never a 0.000 that is not zero)
  const prob = (v) => (typeof v === "number" && v > 0 && v < 1e-3 ? v.toExponential(2) : fmt(v));
  // "1 token", "2 tokens" (`many` where the plural is not the word + "s")
  const plural = (n, word, many) => `${n} ${n === 1 ? word : many || `${word}s`}`;
  const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(1)}%`);

  // The drawing context of a document: its vocabulary, and each token's piece as written and as shown.
  function context(doc) {
    const vocab = doc.vocab || { states: {}, masked: [], counts: {}, context_cells: 0 };
    const pieces = doc.pieces || {};
    const shown = doc.shown || {};
    return {
      piece: (t) => (pieces[String(t)] ?? `#${t}`),
      shown: (t) => (shown[String(t)] ?? `#${t}`),
      state: (s) => (Object.hasOwn(vocab.states, s) ? s : "unknown"),
      colour: (s) => (vocab.states[s] || { bg: "#0f172a" }).bg,
      masked: new Set(vocab.masked),
      counts: vocab.counts || {},
      contextCells: Number(vocab.context_cells || 0),
      runId: doc.run_id || null,
    };
  }
  // On a phone Plotly's tool bar would cover the charts' right edge: it shows there only while a chart is touched
  // (hover), and the charts keep their SVG export on larger screens.
  const PHONE = window.matchMedia("(max-width: 640px)").matches;
  const PLOT_CONFIG = { displaylogo: false, responsive: true, toImageButtonOptions: { format: "svg" },
                        displayModeBar: PHONE ? false : "hover" };

  const SKELETON = `
    <div class="ssv-summary" id="viz-summary"></div>
    <div class="ssv-controls">
      <button id="viz-prev" class="ssv-btn">◀ prev</button>
      <input id="viz-slider" type="range" min="0" max="0" value="0" step="1" aria-label="round">
      <button id="viz-next" class="ssv-btn">next ▶</button>
      <button id="viz-play" class="ssv-btn">▶ play</button>
      <button id="viz-pause" class="ssv-btn">❚❚ pause</button>
      <label class="ssv-speed">rounds/s <select id="viz-speed">
        <option>0.5</option><option>1</option><option selected>2</option><option>5</option><option>10</option>
        <option>20</option></select></label>
      <label class="ssv-speed" title="colour the round's cells and confidence bars by token state, or by the entropy of the model's prediction there (runs with trace_topk)">colour <select id="viz-colour">
        <option value="state" selected>state</option><option value="entropy">entropy</option></select></label>
      <span id="viz-label" class="ssv-label"></span>
    </div>
    <div id="viz-grid" class="ssv-panel"></div>
    <div id="viz-history" class="ssv-panel" hidden></div>
    <div class="ssv-row">
      <div id="viz-conf" class="ssv-panel"></div>
      <div id="viz-isd" class="ssv-panel" hidden></div>
    </div>
    <div id="viz-branches" class="ssv-panel" hidden></div>
    <div id="viz-fold" class="ssv-panel" hidden></div>
    <div class="ssv-row">
      <div id="viz-accepted" class="ssv-chart ssv-run-chart"></div>
      <div id="viz-cases" class="ssv-chart ssv-run-chart" hidden></div>
      <div id="viz-positions" class="ssv-chart" hidden></div>
    </div>
    <div id="viz-kv" class="ssv-chart ssv-run-chart"></div>
    <div id="viz-kv-time" class="ssv-chart ssv-run-chart" hidden></div>
    <div id="viz-timeline" class="ssv-chart ssv-run-chart"></div>
    <div id="viz-output" class="ssv-panel"></div>`;

  // -- per-run precomputation ----------------------------------------------------------------------------------------

  function prepare(doc) {
    for (const r of doc.rounds) {  // numbers drawn into markup are numbers, whatever an imported trace holds
      for (const key of ["round", "block_start", "accepted", "nfe"]) r[key] = Number(r[key] || 0);
    }
    const seq = [...doc.prompt_ids];
    const before = [];  // committed tokens before each round
    for (const r of doc.rounds) { before.push(seq.length); seq.push(...(r.committed || [])); }
    const maskIds = new Set(doc.mask_ids || []);
    const hits = new Map();  // verified round -> [{branch id, the later round whose main state it was, its index}]
    doc.rounds.forEach((r, k) => (r.branches || []).forEach((b) => {
      if (!b.cache_hit || b.verified_round === undefined) return;
      if (!hits.has(b.verified_round)) hits.set(b.verified_round, []);
      hits.get(b.verified_round).push({ id: b.id, round: r.round, k });
    }));
    const byRound = new Map(doc.rounds.map((r, k) => [r.round, k]));
    return { ...context(doc), seq, before, maskIds, hits, byRound };
  }

  // -- cells ---------------------------------------------------------------------------------------------------------

  // Entropy colouring (params.trace_topk runs): nats of the latest forward that predicted a cell, green (sure) to
  // red (ENTROPY_TOP nats or more).
  const ENTROPY_TOP = 3;
  const entropyOf = (r, i) => {
    const alts = (r.topk || [])[i] || [];
    const h = alts.length ? alts[alts.length - 1].entropy : undefined;
    return typeof h === "number" ? h : null;
  };
  const entropyColour = (h) => `hsl(${Math.round(120 * (1 - Math.min(h / ENTROPY_TOP, 1)))}, 70%, 78%)`;

  // `place`: a tree round's cell, {lane, column, branch} (its row and column in the block's grid, its branch).
  function cell(ctx, pos, token, st, details = [], entropy = null, place = null) {
    const text = ctx.piece(token);
    const title = [`pos ${pos} · ${st}`, `token ${JSON.stringify(text)} (id ${token})`, ...details].join("\n");
    const shown = ctx.masked.has(st) ? "[M]" : clip(ctx.shown(token));
    const style = [entropy === null ? "" : `background:${entropyColour(entropy)}`,
                   place ? `grid-row:${place.lane + 1};grid-column:${place.column + 1}` : ""].filter(Boolean);
    const placed = place ? ` data-lane="${place.lane}"` + (place.branch === null ? "" : ` data-branch="${place.branch}"`)
      : "";
    return `<span class="ss-tok ss-s-${ctx.state(st)}"${style.length ? ` style="${style.join(";")}"` : ""} ` +
      `title="${esc(title)}" data-pos="${pos}" data-token="${esc(token)}"${placed}>` +
      `<span class="ss-txt">${esc(shown)}</span><span class="ss-pos">${pos}</span></span>`;
  }

  // A tree round's layout (app/figures.py:tree_lanes): each cell's row (lane; 0: the seed, the accepted path and
  // the bonus; then each branch's rejected nodes), its column (position - block_start) and its branch (null: the
  // seed and the bonus); null for a round that is no tree. The grid and the confidence chart both place by it.
  function treeLayout(r) {
    const lanes = r.lanes;
    const x = r.extra || {};
    if (!Array.isArray(lanes) || !x.tree || !Array.isArray(x.offsets)) return null;
    const branches = x.tree.branches || [];
    return lanes.map((lane, i) => ({ lane: Number(lane), column: Number(x.offsets[i]),
                                     branch: i >= 1 && i <= branches.length ? Number(branches[i - 1]) : null }));
  }

  // A cell's position - block_start: its index, or extra.offsets[i] where a round lays several cells on one
  // position (quadratic's interleaved [d, M×k] groups).
  function cellOffset(r, i) {
    const off = (r.extra || {}).offsets;
    return off ? off[i] : i;
  }

  // The cell of a position in a round: the one the position's token occupies (quadratic: its d cell, not a mask).
  function cellIndex(ctx, r, pos) {
    const off = (r.extra || {}).offsets;
    if (!off) return pos - (r.block_start || 0);
    const at = pos - (r.block_start || 0);
    const kept = off.findIndex((o, j) => o === at && ["accepted", "bonus", "committed", "cut"]
      .includes((r.states || [])[j]));
    if (kept >= 0) return kept;
    const own = off.findIndex((o, j) => o === at && !ctx.masked.has((r.states || [])[j]) &&
                                        (r.states || [])[j] !== "draft");
    return own >= 0 ? own : off.indexOf(at);
  }

  function blockCells(ctx, r, byEntropy) {
    const start = r.block_start || 0;
    const conf = r.conf || [];
    const guess = (r.extra || {}).guess || [];
    const pq = new Map((r.pq || []).map((e, i) => [(e.i ?? i) + 1, e]));
    const tree = treeLayout(r);
    const labels = new Map();  // a tree's lane -> its branch, labelled in the seed's column
    if (tree) tree.forEach((p) => { if (p.lane > 0 && !labels.has(p.lane)) labels.set(p.lane, p.branch); });
    const laneLabels = [...labels].map(([lane, b]) => `<span class="ss-lane" style="grid-row:${lane + 1};` +
      `grid-column:1" title="branch ${esc(b)}: its drafts the verify rejected">b${esc(b)}</span>`).join("");
    return laneLabels + (r.tokens || []).map((token, i) => {
      const st = (r.states || [])[i];
      const details = [`round ${r.round}`, `confidence ${fmt(conf[i])}`];
      if (ctx.masked.has(st) && i > 0 && i <= guess.length) details.push(`guess ${JSON.stringify(ctx.piece(guess[i - 1]))}`);
      const e = pq.get(i);
      if (e) details.push(`p ${prob(e.p)} · q ${prob(e.q)} · ${e.accepted ? "accepted" : "rejected"}`);
      const h = entropyOf(r, i);
      if (h !== null) details.push(`entropy ${fmt(h, 2)} nats`);
      const place = tree ? tree[i] : null;
      if (place && place.branch !== null) details.push(`branch ${place.branch}`);
      return cell(ctx, start + cellOffset(r, i), token, st, details, byEntropy ? h : null, place);
    }).join("");
  }

  function roundFacts(ctx, r) {
    const x = r.extra || {};
    const size = r.block_size ?? x.block_size;
    const facts = [size != null ? `block at ${r.block_start} · block size ${esc(size)}`
                     : `block at ${r.block_start} (size ${(r.tokens || []).length})`,
                   `<span class="ss-count" data-count="accepted" title="${esc(ctx.counts.accepted)}">accepted ` +
                   `<b>${r.accepted}</b></span>`,
                   `<span class="ss-count" data-count="committed" title="${esc(ctx.counts.committed)}">committed ` +
                   `<b>${(r.committed || []).length}</b></span>`, `NFE +${r.nfe}`];
    if (r.case) facts.push(`case <b>${esc(r.case)}</b>`);
    if (x.threshold !== undefined) facts.push(`τ ${esc(fmt(x.threshold))}`);
    if (x.n !== undefined) facts.push(`n ${esc(x.n)}`);
    if (x.trim !== undefined) facts.push(`KV trimmed ${esc(x.trim)}`);
    if (x.forwards_saved !== undefined) facts.push(`forwards saved so far ${esc(x.forwards_saved)}`);
    if (x.tier) facts.push(tierText(x.tier));
    if (x.verify !== undefined) {
      facts.push(`verify <b>${esc(x.verify)}</b>` + (x.verified !== undefined
        ? ` (${esc(x.verified)} drafts verified, ${esc(x.drafted)} drafted for the next round)` : ""));
    }
    if (x.tree) facts.push(treeHtml(ctx, r));
    if (r.fold_qkv !== undefined) facts.push(`fold QKV ${pct(r.fold_qkv)}`);
    if (r.fold_ffn_ratio !== undefined) facts.push(`fold FFN ${pct(r.fold_ffn_ratio)}`);
    if (x.replaced_draft != null) {
      facts.push(`<span class="ssv-replaced">rejected draft <s>${esc(clip(ctx.shown(x.replaced_draft), 24))}</s> → ` +
                 `correction ${esc(clip(ctx.shown(bonusToken(r)), 24))}</span>`);
    }
    const hit = (r.branches || []).find((b) => b.cache_hit);
    if (hit) facts.push(`<span class="ss-badge ss-ok">cache hit: branch b${esc(hit.id)} verified in round ` +
                        `${esc(hit.verified_round)} · no forward</span>`);
    const shared = (p) => (p.batch_requests > 1 ? `; forward ${p.forward_id}: ${p.batch_requests} requests, ` +
                           `${p.n_query} of ${p.batch_rows} rows` : "");
    const phases = (r.phases || []).map((p) => `${p.kind} (${p.attn}${p.lora ? ", LoRA" : ""}, ${p.n_query} q, ` +
                                              `${fmt(p.ms, 1)} ms${shared(p)})`).join(" → ") || "no forward";
    const replay = ctx.runId && (r.phases || []).some((p) => p.batch_requests > 1)
      ? ` <a class="ss-open ssv-forwards" href="?forwards=${encodeURIComponent(ctx.runId)}" target="_blank">` +
        "what shared these forwards</a>" : "";
    return `<div class="ss-round-head"><b>round ${r.round}</b> · ${facts.join(" · ")}` +
      `<div class="ss-phases">${esc(phases)}${replay}</div></div>`;
  }

  // The tier in force for the round's step (scheduler.py): how many requests ran, and the block size and extra
  // draft rows it allowed (null: the request's own setting; 0 extra rows: a plain decode step).
  function tierText(t) {
    const parts = [];
    if (t.block_size != null) parts.push(`block ${esc(t.block_size)}`);
    if (t.extra_rows != null) parts.push(t.extra_rows ? `≤ ${esc(t.extra_rows)} draft rows` : "no drafting");
    return `tier at ${esc(t.running)} running` + (parts.length ? `: ${parts.join(", ")}` : "");
  }

  // A tree draft's branches: each branch's nodes (cell i + 1 is node i), the rows it cost, and the path that won.
  function treeHtml(ctx, r) {
    const t = r.extra.tree;
    const path = new Set(t.path);
    const branches = (t.branch_rows || []).map((rows, b) => {
      const nodes = t.branches.map((bb, i) => [bb, i]).filter(([bb]) => bb === b)
        .map(([, i]) => (path.has(i) ? `<b>${esc(clip(ctx.shown(r.tokens[i + 1]), 16))}</b>`
                                     : esc(clip(ctx.shown(r.tokens[i + 1]), 16))));
      const won = t.won === b ? ' <span class="ss-badge ss-ok">won</span>' : "";
      return `<span class="ssv-branch" data-branch="${b}">branch ${b}: ${nodes.join(" ")} (${plural(rows, "row")})${won}</span>`;
    });
    return `<span class="ssv-tree" title="the draft tree: each branch a first token and the chain after it; ` +
      `bold: the accepted path">tree ${branches.join(" · ")}</span>`;
  }

  function bonusToken(r) {
    const i = (r.states || []).indexOf("bonus");
    return i >= 0 ? r.tokens[i] : (r.committed || []).slice(-1)[0];
  }

  // A round as one grid: its facts, the context cells before its block (prompt and committed, dimmed), then the
  // block, then `after` (hints). The visualizer's and the chat's latest round (liveHtml) alike.
  function roundGrid(ctx, r, context, byEntropy = false, after = "") {
    return `<div class="ss-round">${roundFacts(ctx, r)}<div class="ss-grid">${context}` +
      `<span class="ss-block${treeLayout(r) ? " ss-tree" : ""}">${blockCells(ctx, r, byEntropy)}</span></div>` +
      `${after}</div>`;
  }

  const earlier = (n) => (n > 0 ? `<span class="ss-more">… ${n} earlier</span>` : "");

  function gridHtml(doc, ctx, k, byEntropy = false) {
    const r = doc.rounds[k];
    const n = doc.prompt_ids.length;
    const stop = Math.min(ctx.before[k], r.block_start || 0);
    const from = Math.max(0, stop - ctx.contextCells);
    let parts = earlier(from);
    for (let pos = from; pos < stop; pos++) parts += cell(ctx, pos, ctx.seq[pos], pos < n ? "prompt" : "committed");
    return roundGrid(ctx, r, parts, byEntropy,
      (byEntropy ? `<div class="ssv-hint ssv-entropy-key">entropy: <span style="background:${entropyColour(0)}">0</span>` +
        ` … <span style="background:${entropyColour(ENTROPY_TOP / 2)}">${ENTROPY_TOP / 2}</span> … ` +
        `<span style="background:${entropyColour(ENTROPY_TOP)}">≥ ${ENTROPY_TOP} nats</span>` +
        (r.topk ? "" : " (this round recorded no top-k)") + "</div>" : "") +
      `<div class="ssv-hint">click a token to see its history across rounds</div>`);
  }

  // The chat's latest round, as app/figures.py:live_round sends it: {round, context: [[pos, token, state], ...]
  // (the last vocab.context_cells cells before the block), hidden (context cells left out), missing (positions
  // before the block that the stream skipped), pieces and shown: {token id: text}, vocab}.
  function liveHtml(live) {
    const r = live.round || {};
    for (const key of ["round", "block_start", "accepted", "nfe"]) r[key] = Number(r[key] || 0);
    const ctx = context(live);
    const missing = Number(live.missing || 0);
    const parts = earlier(Number(live.hidden || 0)) +
      (live.context || []).map(([pos, token, st]) => cell(ctx, Number(pos), token, st)).join("") +
      (missing > 0 ? `<span class="ss-more" title="rounds the live stream skipped; the stored run has them">` +
        `… ${missing} position${missing > 1 ? "s" : ""} not streamed</span>` : "");
    return roundGrid(ctx, r, parts);
  }

  // -- ISD -----------------------------------------------------------------------------------------------------------

  function isdHtml(doc, ctx, r) {
    const temp = Number(doc.params.temperature || 0);
    const alpha = Number(doc.params.alpha ?? 1);
    const pq = r.pq || [];
    if (!pq.length) {
      const why = r.round === 0 ? "prefill: the prompt's forward; there are no specs yet."
        : r.case === "C" ? "case C (cold start): the previous round left no specs to verify; this forward only " +
          "drafts the next ones." : "no specs were verified this round.";
      return `<div class="ss-round-head"><b>p / q</b> · round ${r.round}</div><div class="ssv-note">${esc(why)}</div>`;
    }
    const head = ["spec", "token", "p (verifier)", "q (draft)"];
    if (temp > 0) head.push("min(1, p/(αq))", "u");
    head.push("verdict");
    const rows = pq.map((e, i) => {
      const cells = [esc(e.i ?? i), esc(clip(ctx.shown(e.token), 24)), esc(prob(e.p)), esc(prob(e.q))];
      if (temp > 0) {
        const accept = e.accept_prob ?? (e.q ? Math.min(1, Number(e.p) / (alpha * Number(e.q))) : null);
        cells.push(accept != null ? esc(prob(accept)) : "—");
        cells.push(e.u === undefined ? "not recorded" : e.u === null ? "—" : esc(fmt(e.u)));
      }
      cells.push(e.tested === false ? '<span class="ss-badge">not reached</span>'
        : e.accepted ? '<span class="ss-badge ss-ok">accepted</span>' : '<span class="ss-badge ss-bad">rejected</span>');
      return `<tr>${cells.map((c) => `<td>${c}</td>`).join("")}</tr>`;
    }).join("");
    const rule = temp > 0 ? `T = ${temp}: a spec is accepted when u < min(1, p/(αq)), α = ${alpha}.`
      : "T = 0: a spec is accepted when it is the verifier's argmax.";
    return `<div class="ss-round-head"><b>p / q per spec</b> · round ${r.round}</div>` +
      `<div class="ss-scroll"><table class="ss-table"><thead><tr>${head.map((h) => `<th>${esc(h)}</th>`).join("")}` +
      `</tr></thead><tbody>${rows}</tbody></table></div><div class="ssv-note">${esc(rule)}</div>`;
  }

  // -- branches and fold ---------------------------------------------------------------------------------------------

  function branchesHtml(doc, ctx, k) {
    const r = doc.rounds[k];
    const branches = r.branches || [];
    const start = r.block_start || 0;
    const main = r.tokens || [];
    const states = r.states || [];
    const matches = ctx.hits.get(r.round) || [];
    const rows = branches.map((b) => {
      const cells = (b.tokens || []).map((t, i) => {
        const st = main[i] === t ? states[i] : ctx.maskIds.has(t) ? "mask" : "draft";
        return cell(ctx, start + i, t, st, [`branch ${b.id}`]);
      }).join("");
      const badges = [];
      if (b.cache_hit) badges.push(`<span class="ss-badge ss-ok">cache hit · verified in round ${esc(b.verified_round)}</span>`);
      const mine = matches.filter((m) => m.id === b.id);
      for (const m of mine) badges.push(`<span class="ss-badge ss-ref" data-jump="${m.k}">= round ${m.round}'s main state ↗</span>`);
      const root = b.parent === null || b.parent === undefined;
      const name = root ? `b${b.id} = main` : `b${b.id} ← b${b.parent}`;
      return `<div class="ss-branch${mine.length ? " ssv-matched" : ""}">` +
        `<span class="ss-branch-id">${esc(name)}</span>${badges.join("")}` +
        `<div class="ss-grid">${cells}</div></div>`;
    }).join("");
    const note = matches.length ? matches.map((m) => `branch b${m.id} matched the main state of round ${m.round} ` +
      `(a cache hit there)`).join("; ") : "no branch of this round matched a later main state";
    return `<div class="ss-round-head"><b>draft branches</b> · round ${r.round} · ${branches.length} branches · ` +
      `${esc(note)}<div class="ss-phases">yellow = drafted token that differs from the main block; [M] = still ` +
      `masked in that branch</div></div><div class="ss-branches">${rows}</div>`;
  }

  function heatTable(title, counts, width) {
    if (!counts || !counts.length) return "";
    const head = counts[0].map((_, j) => `<th>b${j}</th>`).join("");
    const rows = counts.map((layer, l) => `<tr><th>L${l}</th>${layer.map((c) => {
      const a = width ? Math.min(1, Number(c) / width) || 0 : 0;
      return `<td style="background:rgba(37,99,235,${(0.08 + 0.8 * a).toFixed(2)})" title="layer ${l} · ` +
        `recomputed ${esc(c)} of ${width}">${esc(c)}</td>`;
    }).join("")}</tr>`).join("");
    return `<div><b>${esc(title)}</b><div class="ss-scroll"><table class="ssv-heat"><thead><tr><th></th>${head}` +
      `</tr></thead><tbody>${rows}</tbody></table></div></div>`;
  }

  function foldHtml(doc, r) {
    const width = Math.max(0, ...(r.branches || []).map((b) => (b.tokens || []).length));
    return `<div class="ss-round-head"><b>fold</b> · round ${r.round} · QKV folded ${pct(r.fold_qkv)} · FFN folded ` +
      `${pct(r.fold_ffn_ratio)} · run overall ${pct(doc.metrics.fold_ratio)}<div class="ss-phases">recomputed ` +
      `positions per layer × branch (b0, the main state, always runs dense)</div></div><div class="ssv-row">` +
      heatTable("QKV / attention", r.fold, width) + heatTable("FFN", (r.extra || {}).fold_ffn, width) + "</div>";
  }

  // -- token history -------------------------------------------------------------------------------------------------

  function historyHtml(doc, ctx, pos) {
    const entries = [];  // one per round whose block holds the position; unchanged runs are merged below
    doc.rounds.forEach((r, k) => {
      const i = cellIndex(ctx, r, pos);
      if (i < 0 || i >= (r.tokens || []).length) return;
      const st = r.states[i];
      const guess = (r.extra || {}).guess || [];
      const e = (r.pq || []).find((x, j) => (x.i ?? j) + 1 === i);
      const drafts = new Set((r.branches || []).map((b) => (b.tokens || [])[i]).filter((t) => t !== undefined &&
        !ctx.maskIds.has(t) && t !== r.tokens[i]));
      const notes = [];
      if (ctx.masked.has(st) && i > 0 && i <= guess.length) notes.push(`guess ${clip(ctx.shown(guess[i - 1]), 20)}`);
      if (e) notes.push(`p ${fmt(e.p)} q ${fmt(e.q)} ${e.accepted ? "accepted" : "rejected"}`);
      if (st === "bonus" && (r.extra || {}).replaced_draft != null) {
        notes.push(`replaced draft ${clip(ctx.shown(r.extra.replaced_draft), 20)}`);
      }
      if (drafts.size) notes.push(`branch drafts ${[...drafts].map((t) => clip(ctx.shown(t), 12)).join(", ")}`);
      for (const alt of ((r.topk || [])[i] || [])) {  // params.trace_topk: each forward that predicted the position
        const top = (alt.top || []).map(([t, p]) => `${clip(ctx.shown(t), 12)} ${prob(p)}`).join(", ");
        notes.push(`${alt.kind}: ${top} (entropy ${fmt(alt.entropy, 2)}, margin ${fmt(alt.margin, 2)})`);
      }
      const token = ctx.masked.has(st) ? "[M]" : clip(ctx.shown(r.tokens[i]), 24);
      const entry = { k, from: r.round, to: r.round, st, token, conf: fmt((r.conf || [])[i]), notes: notes.join(" · ") };
      const last = entries[entries.length - 1];
      if (last && last.to === r.round - 1 && last.st === st && last.token === token && last.conf === entry.conf &&
          last.notes === entry.notes) last.to = r.round;
      else entries.push(entry);
    });
    const rows = entries.map((x) => `<tr data-jump="${x.k}" data-from="${x.from}" data-to="${x.to}"><td>` +
      `${x.from === x.to ? x.from : `${x.from}–${x.to}`}</td><td><span class="ss-badge ss-s-${ctx.state(x.st)}">` +
      `${esc(x.st)}</span></td><td>${esc(x.token)}</td><td>${esc(x.conf)}</td><td>${esc(x.notes)}</td></tr>`);
    const n = doc.prompt_ids.length;
    const where = pos < n ? "a prompt token" : `output token ${pos - n}`;
    return `<div class="ss-round-head"><b>history of position ${pos}</b> (${esc(where)}) · click a row to jump ` +
      `<button class="ssv-btn" data-close="1">close</button></div>` + (rows.length
      ? `<div class="ss-scroll"><table class="ss-table ssv-history"><thead><tr><th>round</th><th>state</th>` +
        `<th>token</th><th>confidence</th><th>details</th></tr></thead><tbody>${rows.join("")}</tbody></table></div>`
      : `<div class="ssv-note">position ${pos} was never in a round's block (${esc(where)}).</div>`) +
      (doc.rounds.some((r) => r.topk) ? ""
        : `<div class="ssv-note">top-k alternatives were not recorded: run with the parameter trace_topk = k.</div>`);
  }

  // -- summary, metrics, step map ------------------------------------------------------------------------------------

  function summaryHtml(doc) {
    const m = doc.metrics || {};
    const params = Object.entries(doc.params || {}).map(([k, v]) => `${k}=${v}`).join(", ");
    const tiers = (doc.tiers || []).map(([running, size]) => `≤${running} running → ${size}`).join(", ");
    const ours = [["tokens", m.tokens], ["NFE", m.nfe], ["TPF", fmt(m.tpf, 2)], ["tok/s", fmt(m.tok_per_s, 1)],
                  ["tokens / round", fmt(m.accept_len_mean, 2)], ["KV peak", m.kv_peak], ["KV leaked", m.kv_leaked]];
    if (m.fold_ratio !== undefined && m.fold_ratio !== null) ours.push(["fold ratio (run)", pct(m.fold_ratio)]);
    if (m.cache_hits !== undefined) ours.push(["cache hits", m.cache_hits], ["forwards saved", m.forwards_saved],
                                               ["verify forwards", m.verify_forwards],
                                               ["draft hit rate", pct(m.draft_hit_rate)]);
    if (m.case_V !== undefined) ours.push(["cases V/R/C", `${m.case_V}/${m.case_R}/${m.case_C}`]);
    const s = doc.spec;
    const vllm = s ? [["mean acc. length (vLLM)", fmt(s.mean_acceptance_length, 2)],
                      ["draft acc. rate (vLLM)", pct(s.draft_acceptance_rate)], ["verify steps", s.num_spec_steps],
                      ["drafted", s.num_draft_tokens], ["drafts accepted", s.num_accepted_draft_tokens]] : [];
    const defs = doc.definitions || {};
    const kv = (rows) => rows.map(([k, v]) => `<span class="ssv-metric" title="${esc(defs[k] || "")}">` +
                                   `<span>${esc(k)}</span> <b>${esc(fmt(v))}</b></span>`).join("");
    const status = doc.status === "running" ? '<span class="ss-badge ss-ref">● live: following</span>'
      : `<span class="ss-badge ${doc.status === "done" ? "ss-ok" : "ss-bad"}">${esc(doc.status)}</span>`;
    return `<div class="ss-summary"><b><span class="ssv-mode" style="color:${esc(doc.color || "")}">${esc(doc.mode)}</span> · ${esc(doc.run_id)} · ${esc(doc.status)} · ` +
      `${plural(doc.rounds.length, "round")} · NFE ${esc(fmt(m.nfe))} · TPF ${esc(fmt(m.tpf, 2))}</b> ${status}` +
      (doc.error ? `<div class="ss-badge ss-bad">${esc(doc.error)}</div>` : "") +
      (doc.tier_note ? `<div class="ss-tier-note ss-badge ss-bad">⚠ ${esc(doc.tier_note)}</div>` : "") +
      `<div><b>prompt</b> <code>${esc(doc.prompt)}</code></div><div><b>params</b> <code>${esc(params)}</code></div>` +
      (tiers ? `<div><b>block_size_tiers</b> <code>${esc(tiers)}</code> (the size each round used is in its header)</div>` : "") +
      `<div><b>model</b> <code>${esc(doc.model)}${doc.model_hash ? " · " + esc(doc.model_hash) : ""}` +
      `${doc.matmul ? " · " + esc(doc.matmul) + " matmuls" : ""}</code></div>` +
      `<div class="ssv-explain">${esc(doc.explain)}</div>` +
      `<div class="ssv-metrics"><b>run</b> ${kv(ours)}</div>` +
      (s ? `<div class="ssv-metrics" id="viz-vllm"><b>spec-decode (vLLM)</b> ${kv(vllm)}</div>` : "") +
      speedupHtml(doc.speedup) + `</div>`;
  }

  // the speedup explained: TPF × (1-row forward ms ÷ the run's mean forward ms) × forward share, and the same
  // run's forwards priced on other machines' stored curves
  function speedupHtml(sp) {
    if (!sp || !sp.here) return "";
    const h = sp.here, d = sp.digits;   // the factors as shown multiply to the product as shown (speedup.shown)
    const there = (sp.elsewhere || []).map((e) => `${esc(e.machine)}: <b>${esc(fmt(e.speedup, 2))}×</b>`).join(" · ");
    return `<div class="ssv-metrics" id="viz-speedup"><b>speedup explained</b> TPF ${esc(fmt(h.tpf, d))} × ` +
      `row cost ${esc(fmt(h.row_cost, d))} (1-row step ${esc(fmt(h.one_row_ms, 2))} ms ÷ this run's mean forward) × ` +
      `forward share ${esc(fmt(h.forward_share, d))} = <b>${esc(fmt(h.product, d))}×</b> an ar whose 1-row ` +
      `forwards take all its time, on this machine` +
      (there ? `<div>its forwards on another machine's curve (forwards only): ${there}</div>` : "") + `</div>`;
  }

  function outputHtml(doc, ctx) {
    const last = Math.max(1, ...doc.step_map);
    const fit = doc.fit && doc.fit.picks.length === doc.output_ids.length ? doc.fit : null;
    const toks = doc.output_ids.map((t, k) => {
      const r = doc.step_map[k];
      const hue = Math.round(220 - 200 * (r / last));
      const off = fit && fit.picks[k] !== t;
      const pick = !fit ? "" : off ? ` · the model would pick ${ctx.piece(fit.picks[k])} here (NLL ${fmt(fit.nll[k], 2)})`
        : ` · the model's own pick (NLL ${fmt(fit.nll[k], 2)})`;
      return `<span class="ssv-step${off ? " ssv-offpick" : ""}" style="background:hsl(${hue},70%,88%)" ` +
        `data-jump-round="${r}" data-pos="${doc.prompt_ids.length + k}" ` +
        `title="${esc(`output token ${k} · revealed in round ${r}${pick}`)}">${esc(ctx.piece(t))}</span>`;
    }).join("");
    const rated = fit ? ` · <span id="viz-fit" title="${esc((doc.definitions || {})["model's pick"] || "")}">` +
      `${fit.greedy} of ${plural(fit.tokens, "token")} ${fit.greedy === 1 ? "is" : "are"} the model's own pick; ` +
      `mean NLL ${fmt(fit.nll_mean, 2)} nats${fit.greedy < fit.tokens
        ? "; underlined: tokens the model would not pick" : ""}</span>` : "";
    return `<div class="ss-round-head"><b>output · step map</b> (colour = the round that revealed each token, ` +
      `blue early → red late; click one to jump to that round)${rated}</div><div class="ssv-output">` +
      `${toks || "<i>empty</i>"}</div>`;
  }

  // -- charts --------------------------------------------------------------------------------------------------------

  // confidence per block position as inline SVG (redrawn every step: far cheaper than a Plotly redraw)
  // A tree round (treeLayout) has a slot a position, split among its lanes as the grid's rows are: each bar at its
  // token's position, beside the other branches' drafts there.
  function confSvg(doc, ctx, r, byEntropy = false) {
    const start = r.block_start || 0;
    const tree = treeLayout(r);
    const cells = (r.tokens || []).length;
    const n = Math.max(tree ? Math.max(...tree.map((p) => p.column)) + 1 : cells, 1);
    const lanes = tree ? Math.max(...tree.map((p) => p.lane)) + 1 : 1;
    const conf = r.conf || [];
    const tau = (r.extra || {}).threshold ?? doc.params.threshold;
    const W = 800, H = 200, L = 44, B = 34, T = 14;
    const bw = (W - L - 8) / n;
    const lw = bw / lanes;
    const y = (v) => T + (H - T - B) * (1 - v);
    let bars = "";
    let ticks = "";
    const every = Math.ceil(n / 16);
    for (let i = 0; i < n; i += every) {
      ticks += `<text x="${L + i * bw + bw / 2}" y="${H - B + 14}" class="ssv-tick">${start + i}</text>`;
    }
    for (let i = 0; i < cells; i++) {
      const place = tree ? tree[i] : null;
      const column = place ? place.column : i;
      const x = L + column * bw + (place ? place.lane * lw : 0);
      const c = conf[i];
      if (c === null || c === undefined) continue;
      const st = ctx.state((r.states || [])[i]);
      const h = entropyOf(r, i);
      const fill = byEntropy && h !== null ? entropyColour(h) : ctx.colour(st);
      const branch = place && place.branch !== null ? `\nbranch ${place.branch}` : "";
      const placed = place ? ` data-lane="${place.lane}"` + (place.branch === null ? "" : ` data-branch="${place.branch}"`)
        : "";
      bars += `<rect x="${x + lw * 0.1}" y="${y(c)}" width="${lw * 0.8}" height="${y(0) - y(c)}" ` +
        `class="ssv-bar" style="fill:${fill}" data-pos="${start + column}" data-token="${esc(r.tokens[i])}"${placed}>` +
        `<title>pos ${start + column} · ${esc(st)}${branch}\n` +
        `token ${esc(JSON.stringify(ctx.piece(r.tokens[i])))}\nconf ${esc(fmt(c))}` +
        `${h === null ? "" : `\nentropy ${esc(fmt(h, 2))} nats`}</title></rect>`;
    }
    const grid = [0, 0.5, 1].map((v) => `<line x1="${L}" x2="${W - 8}" y1="${y(v)}" y2="${y(v)}" class="ssv-gridline"/>` +
      `<text x="${L - 6}" y="${y(v) + 4}" class="ssv-tick" text-anchor="end">${v}</text>`).join("");
    const line = tau ? `<line x1="${L}" x2="${W - 8}" y1="${y(tau)}" y2="${y(tau)}" class="ssv-tau"/>` +
      `<text x="${W - 10}" y="${y(tau) - 4}" class="ssv-tick ssv-tau-label" text-anchor="end">τ = ${esc(tau)}</text>` : "";
    return `<div class="ss-round-head"><b>confidence per position</b> · round ${r.round}</div>` +
      `<div class="ss-scroll"><svg class="ssv-conf" viewBox="0 0 ${W} ${H}" role="img" ` +
      `aria-label="confidence per position">${grid}${ticks}${bars}${line}` +
      `<text x="${(L + W) / 2}" y="${H - 4}" class="ssv-axis" text-anchor="middle">position</text>` +
      `<text x="12" y="${(T + H - B) / 2}" class="ssv-axis" text-anchor="middle" ` +
      `transform="rotate(-90 12 ${(T + H - B) / 2})">confidence</text></svg></div>`;
  }

  function moveCursor(gd, round) {
    const shapes = (gd.layout && gd.layout.shapes) || [];
    const k = shapes.findIndex((s) => s.name === "cursor");
    if (k < 0) return;
    const path = gd.querySelector(`.shapelayer path[data-index="${k}"]`);
    const area = gd.querySelector(".nsewdrag");
    const range = gd.layout.xaxis && gd.layout.xaxis.range;
    if (path && area && range) {  // shift the drawn line: no Plotly redraw
      if (path.dataset.drawnX === undefined) path.dataset.drawnX = shapes[k].x0;
      const perUnit = Number(area.getAttribute("width")) / (range[1] - range[0]);
      path.setAttribute("transform", `translate(${(round - Number(path.dataset.drawnX)) * perUnit},0)`);
      shapes[k].x0 = shapes[k].x1 = round;
    }
  }

  // -- the component -------------------------------------------------------------------------------------------------

  class Viz {
    constructor(root) {
      this.root = root;
      root.ssViz = this;  // reachable from the page (tests, console): document.querySelector(".ssv").ssViz
      root.innerHTML = SKELETON;
      this.$ = (id) => root.querySelector(`#${id}`);
      this.doc = null;
      this.k = 0;
      this.timer = null;
      this.pos = null;
      this.$("viz-prev").onclick = () => this.go(this.k - 1);
      this.$("viz-next").onclick = () => this.go(this.k + 1);
      this.$("viz-slider").oninput = (e) => this.go(Number(e.target.value));
      this.$("viz-play").onclick = () => this.play();
      this.$("viz-pause").onclick = () => this.stop();
      this.$("viz-speed").onchange = () => { if (this.timer) this.play(); };
      this.$("viz-colour").onchange = () => this.go(this.k, true);
      root.addEventListener("click", (e) => this.click(e));
      let width = 0;
      new ResizeObserver(() => {  // a chart follows its box's width (rows wrap on narrow screens)
        if (root.clientWidth === width || !window.Plotly) return;
        width = root.clientWidth;
        root.querySelectorAll(".ssv-chart").forEach((gd) => { if (gd.data && !gd.hidden) Plotly.Plots.resize(gd); });
      }).observe(root);
    }

    load(value) {
      if (!value) { this.doc = null; this.$("viz-summary").innerHTML = '<div class="ss-empty">Pick a run.</div>'; return; }
      const doc = JSON.parse(value);
      const same = this.doc && this.doc.run_id === doc.run_id;
      const following = same && this.k >= this.doc.rounds.length - 1;
      this.doc = doc;
      this.ctx = prepare(doc);
      this.$("viz-summary").innerHTML = summaryHtml(doc);
      this.$("viz-output").innerHTML = outputHtml(doc, this.ctx);
      this.drawRunCharts();
      const slider = this.$("viz-slider");
      slider.max = String(Math.max(doc.rounds.length - 1, 0));
      if (!doc.rounds.length) { this.$("viz-grid").innerHTML = '<div class="ss-empty">No rounds yet.</div>'; return; }
      const end = doc.rounds.length - 1;
      let k = same ? (following ? end : this.k) : doc.status === "running" ? end : 0;  // a live run opens at its head
      const url = new URLSearchParams(window.location.search);
      if (!same && url.get("run") === doc.run_id && url.get("round") !== null) {
        k = this.ctx.byRound.get(Number(url.get("round"))) ?? (Number(url.get("round")) > 0 ? end : 0);
      }
      this.pos = same ? this.pos : null;
      this.go(k, true);
    }

    drawRunCharts() {
      const figs = this.doc.figures;
      const charts = [["accepted", "viz-accepted"], ["cases", "viz-cases"], ["positions", "viz-positions"],
                      ["kv", "viz-kv"], ["kv_time", "viz-kv-time"], ["timeline", "viz-timeline"]];
      for (const [name, id] of charts) this.$(id).hidden = !figs[name];  // widths settle before drawing
      if (!window.Plotly) return;
      for (const [name, id] of charts) {
        const gd = this.$(id);
        if (!figs[name]) continue;
        Plotly.react(gd, figs[name].data, figs[name].layout, PLOT_CONFIG);
        if (!gd.ssClick) {
          gd.ssClick = true;
          gd.on("plotly_click", (ev) => this.clickChart(id, ev));
        }
      }
      // react keeps the width a chart had before (another run's charts may have shared its row differently):
      // once the row has laid out, fit each chart to its box
      requestAnimationFrame(() => {
        for (const [name, id] of charts) {
          const gd = this.$(id);
          const svg = figs[name] && gd.querySelector(".main-svg");
          if (svg && Math.abs(svg.getBoundingClientRect().width - gd.clientWidth) > 1) Plotly.Plots.resize(gd);
        }
      });
    }

    clickChart(id, ev) {
      const p = ev.points && ev.points[0];
      if (!p) return;
      const round = id === "viz-kv" ? p.customdata[1] : id === "viz-positions" ? null
        : id === "viz-timeline" ? p.customdata[0] : id === "viz-kv-time" ? p.customdata : p.x;
      if (round !== null && this.ctx.byRound.has(round)) this.go(this.ctx.byRound.get(round));
    }

    click(e) {
      const t = e.target.closest("[data-jump],[data-jump-round],[data-pos],[data-close]");
      if (!t || !this.doc) return;
      if (t.dataset.close) { this.pos = null; this.$("viz-history").hidden = true; return; }
      if (t.dataset.jumpRound !== undefined) { this.pos = Number(t.dataset.pos); this.go(this.ctx.byRound.get(Number(t.dataset.jumpRound)) ?? this.k); return; }
      if (t.dataset.jump !== undefined) { this.go(Number(t.dataset.jump)); return; }
      this.pos = Number(t.dataset.pos);
      this.renderHistory();
    }

    renderHistory() {
      const h = this.$("viz-history");
      h.hidden = this.pos === null;
      if (this.pos !== null) {
        h.innerHTML = historyHtml(this.doc, this.ctx, this.pos);
        const round = this.doc.rounds[this.k].round;
        h.querySelectorAll("tr[data-from]").forEach((row) => row.classList.toggle("ssv-current",
          Number(row.dataset.from) <= round && round <= Number(row.dataset.to)));
      }
    }

    go(k, force = false) {
      const t0 = performance.now();
      const doc = this.doc;
      if (!doc || !doc.rounds.length) return;
      k = Math.max(0, Math.min(k, doc.rounds.length - 1));
      if (k === this.k && !force) return;
      this.k = k;
      const r = doc.rounds[k];
      this.$("viz-slider").value = String(k);
      this.$("viz-label").textContent = `round ${r.round} of ${doc.rounds[doc.rounds.length - 1].round}`;
      const byEntropy = this.$("viz-colour").value === "entropy";
      this.$("viz-grid").innerHTML = gridHtml(doc, this.ctx, k, byEntropy);
      const conf = this.$("viz-conf");
      const hasConf = (r.conf || []).some((c) => c !== null && c !== undefined);
      conf.hidden = !hasConf;
      if (hasConf) conf.innerHTML = confSvg(doc, this.ctx, r, byEntropy);
      const isd = this.$("viz-isd");
      isd.hidden = !doc.pq;   // the run records p/q tables or round cases
      if (!isd.hidden) isd.innerHTML = isdHtml(doc, this.ctx, r);
      const br = this.$("viz-branches");
      br.hidden = !(r.branches || []).length;
      if (!br.hidden) br.innerHTML = branchesHtml(doc, this.ctx, k);
      const fold = this.$("viz-fold");
      fold.hidden = !(r.fold || []).length;
      if (!fold.hidden) fold.innerHTML = foldHtml(doc, r);
      this.renderHistory();
      this.root.querySelectorAll(".ssv-run-chart").forEach((gd) => moveCursor(gd, r.round));
      const url = new URL(window.location.href);
      url.searchParams.set("run", doc.run_id);
      url.searchParams.set("round", String(r.round));
      window.history.replaceState(null, "", url);
      if (k === doc.rounds.length - 1 && this.timer) this.stop();
      this.lastStepMs = performance.now() - t0;
    }

    play() {
      this.stop();
      if (!this.doc) return;
      if (this.k >= this.doc.rounds.length - 1) this.go(0);
      const rate = Number(this.$("viz-speed").value);
      this.timer = setInterval(() => this.go(this.k + 1), 1000 / rate);
    }

    stop() { clearInterval(this.timer); this.timer = null; }
  }

  return {
    mount(element, value) {
      if (!element.ssViz) element.ssViz = new Viz(element.querySelector(".ssv") || element);
      element.ssViz.load(value);
    },
    // The chat's latest-round panel: value is live_round's JSON ("": nothing streamed yet).
    live(element, value) {
      element.innerHTML = value ? liveHtml(JSON.parse(value))
        : '<div class="ss-empty">The latest round of a streaming run shows here.</div>';
    },
    liveHtml,
  };
})();
