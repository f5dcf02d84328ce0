"""The CSS and JavaScript of the attention page (page.py).

Kept as strings so that a copied edge_demo/ folder needs no data files. The
script reads `#attention-data` and draws:

- `#head-view`: an SVG with the query tokens on the left and the keys on the
  right; lines `.attn-line` (one per head and key, `data-head`, `data-key`,
  `data-weight`, `data-source`) from the selected query;
- `#model-view`: one `<canvas class="map">` per layer x head (and per source
  when both are shown), with `data-layer`, `data-head`, `data-source`; each
  `MIN_MAP` (48) to 120 CSS px a side, as the window's width allows (the
  panel scrolls sideways below that);
- `#input-view`: the pixels (one SVG row per token) or the sentence; a token
  typed right after the one before it (`D.joined`) is a `span.joined`
  attached to it, and in the head view a label led by "·";
- `#named-head`: the caption of `D.named_head` (the best coreference head);
  the page opens on its layer, draws its lines over the other heads' (faded)
  while `#focus-toggle` is on, and outlines its map (`canvas.map.named`);
- `#parity`: max |Δ| and most-attended-key agreement per layer.

Every panel is a `<section class="panel">`. Selecting a token (hover or
click, in the head view or the input) sets `body[data-query]`.
"""

STYLE = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d0d7de; --panel: #b0b8c4; }
* { box-sizing: border-box; }
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); margin: 16px; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 0 0 8px; }
#summary { color: var(--muted); }
#summary b { color: var(--ink); }
.warning { background: #fff4d6; border: 1px solid #d4a72c; padding: 6px 10px; margin: 8px 0; }
.notes { color: var(--muted); margin: 4px 0 8px; padding-left: 18px; }
#controls { display: flex; flex-wrap: wrap; gap: 16px; align-items: center; margin: 8px 0; }
#controls fieldset { border: 1px solid var(--line); padding: 4px 8px; margin: 0; }
#controls legend { color: var(--muted); font-size: 12px; }
#controls button { font: inherit; margin: 1px; padding: 1px 8px; border: 1px solid var(--line);
                   background: #f6f8fa; cursor: pointer; }
#controls button.on { background: #1f2328; color: #fff; }
.head-toggle { display: inline-flex; align-items: center; gap: 3px; margin-right: 6px; cursor: pointer; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; }
#panels { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.panel { border: 2px solid var(--panel); border-radius: 6px; padding: 10px 12px; background: #fff; }
.token { cursor: pointer; font-size: 13px; }
.token.selected { font-weight: 700; fill: #b3261e; }
#sentence span { display: inline-block; padding: 1px 3px; margin: 1px 0 1px 5px; border-radius: 3px;
                 cursor: pointer; border: 1px solid transparent; }
#sentence span.selected { border-color: #b3261e; font-weight: 700; }
#sentence span.joined { margin-left: 0; border-left: 1px dotted #8c959f; }
.joiner { fill: #8c959f; }
#named-head { margin: 8px 0; padding: 6px 10px; border-left: 4px solid #1f2328; background: #f6f8fa; }
#named-head button { font: inherit; margin-left: 8px; padding: 0 8px; border: 1px solid var(--line);
                     background: #fff; cursor: pointer; }
#named-head button.on { background: #1f2328; color: #fff; }
.head-toggle.named { font-weight: 700; }
#model-view { max-width: 100%; overflow-x: auto; }
canvas.map.named { outline: 3px solid #1f2328; outline-offset: 1px; }
.grid { display: grid; gap: 8px; }
.cell { text-align: center; font-size: 12px; color: var(--muted); }
.cell .pair { display: flex; gap: 4px; justify-content: center; }
canvas.map { border: 1px solid var(--line); cursor: pointer; image-rendering: pixelated; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border-bottom: 1px solid var(--line); padding: 2px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.scale { display: flex; align-items: center; gap: 6px; font-size: 12px; color: var(--muted); margin-top: 6px; }
.scale .bar { width: 120px; height: 10px; background: linear-gradient(to right, #fff, #08306b);
              border: 1px solid var(--line); }
"""

SCRIPT = r"""
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("attention-data").textContent);
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                   "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"];
  const SVG = "http://www.w3.org/2000/svg";
  const n = D.tokens.length;
  const named = D.named_head;  // {layer, head, caption} or null
  const MIN_MAP = 48, MAX_MAP = 120;  // CSS px of one map's side
  const FADE = 0.2;  // opacity of the other heads' lines while the named head is highlighted
  const state = { layer: D.initial_layer, query: D.initial_query,
                  source: "device", hidden: new Set(), focus: named !== null };
  const hasRef = D.reference !== null;
  const colour = (h) => PALETTE[h % PALETTE.length];
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const svg = (tag, attrs, text) => {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const fmt = (x, d) => Number(x).toFixed(d);
  // the named head, drawn over the others in its layer (unless hidden or turned off)
  const focused = () => named !== null && state.focus && state.layer === named.layer &&
                        !state.hidden.has(named.head);
  const isNamed = (l, h) => named !== null && named.layer === l && named.head === h;
  const tokenText = (node, i) => {  // an SVG label: "·" before a piece joined to the one before
    if (D.joined[i]) node.append(svg("tspan", {class: "joiner"}, "\u00b7"));
    node.append(svg("tspan", {class: "piece"}, D.tokens[i]));
    return node;
  };
  const sources = () => state.source === "both" ? ["device", "reference"] : [state.source];
  const sourceName = (s) => s === "device" ? D.mode : "reference (float Keras)";

  // --- header: prediction, notes, truncation -----------------------------------
  const summary = document.getElementById("summary");
  const p = D.prediction;
  summary.innerHTML = "";
  if (p) {
    summary.append("mode ", el("b", {}, D.mode), " \u00b7 predicted ", el("b", {id: "prediction"}, p.label),
                   " (confidence " + fmt(p.confidence, 4) + ")");
  } else {
    summary.append("mode ", el("b", {}, D.mode), " \u00b7 ",
                   el("b", {id: "prediction"}, "a sentence encoder"), " (no classes)");
  }
  if (D.reference_prediction) {
    const r = D.reference_prediction;
    summary.append(" \u00b7 reference ", el("b", {}, r.label), " (" + fmt(r.confidence, 4) + ")");
  }
  if (D.true_label !== null) summary.append(" \u00b7 true ", el("b", {}, D.true_label));
  const banners = document.getElementById("banners");
  if (D.dropped.length) {
    banners.append(el("p", {class: "warning", id: "truncated"},
      "Input truncated: the model reads " + n + " tokens; " + D.dropped.length +
      " more word(s) were dropped: " + D.dropped.join(" ")));
  }
  if (named !== null) {
    const p = el("p", {id: "named-head"});
    p.append(el("span", {id: "named-caption"}, "\u2605 " + named.caption));
    const show = el("button", {type: "button", id: "named-show"}, "show it");
    show.addEventListener("click", () => { state.layer = named.layer; state.focus = true;
                                           state.hidden.delete(named.head); draw(); });
    const toggle = el("button", {type: "button", id: "focus-toggle"}, "highlight");
    toggle.addEventListener("click", () => { state.focus = !state.focus; draw(); });
    p.append(show, toggle);
    banners.append(p);
  }
  if (D.notes.length) {
    const ul = el("ul", {class: "notes"});
    for (const note of D.notes) ul.append(el("li", {}, note));
    banners.append(ul);
  }

  // --- controls ------------------------------------------------------------------
  const controls = document.getElementById("controls");
  const layerSet = el("fieldset", {id: "layer-buttons"});
  layerSet.append(el("legend", {}, "head view layer"));
  D.heads.forEach((_, l) => {
    const b = el("button", {type: "button", "data-layer": l}, "layer " + l);
    b.addEventListener("click", () => { state.layer = l; draw(); });
    layerSet.append(b);
  });
  controls.append(layerSet);
  const headSet = el("fieldset", {id: "head-toggles"});
  headSet.append(el("legend", {}, "heads (click to hide)"));
  controls.append(headSet);
  if (hasRef) {
    const srcSet = el("fieldset", {id: "source-buttons"});
    srcSet.append(el("legend", {}, "attention from"));
    for (const [key, label] of [["device", D.mode], ["reference", "float Keras"], ["both", "side by side"]]) {
      const b = el("button", {type: "button", "data-source": key}, label);
      b.addEventListener("click", () => { state.source = key; draw(); });
      srcSet.append(b);
    }
    controls.append(srcSet);
  }

  // --- panels --------------------------------------------------------------------
  const panels = document.getElementById("panels");
  const panel = (id, title) => {
    const s = el("section", {class: "panel", id: id});
    s.append(el("h2", {}, title));
    panels.append(s);
    return s;
  };
  const inputPanel = panel("input-view", D.input.kind === "pixels" ? "Input (one token per image row)" : "Input");
  const headPanel = panel("head-view", "Head view");
  const modelPanel = panel("model-view", "Model view (rows: query, columns: key)");
  const parityPanel = hasRef ? panel("parity", "Attention parity: " + D.mode + " vs float Keras") : null;

  const select = (q) => { if (q !== state.query) { state.query = q; draw(); } };

  function weights(source, layer, head, q) { return D[source][layer][head][q]; }
  function meanRow(source, layer, q) {
    if (focused() && layer === named.layer) return weights(source, layer, named.head, q).slice();
    const out = new Array(n).fill(0);
    let heads = 0;
    for (let h = 0; h < D.heads[layer]; h++) {
      if (state.hidden.has(h)) continue;
      heads++;
      const row = weights(source, layer, h, q);
      for (let k = 0; k < n; k++) out[k] += row[k];
    }
    return heads ? out.map((v) => v / heads) : out;
  }

  function drawInput() {
    inputPanel.querySelectorAll(":scope > :not(h2)").forEach((e) => e.remove());
    const mean = meanRow("device", state.layer, state.query);
    if (D.input.kind === "pixels") {
      const rows = D.input.pixels, cols = rows[0].length, c = 18, left = 52, barW = 60;
      const s = svg("svg", {width: left + cols * c + barW + 16, height: n * c + 4, id: "pixels"});
      rows.forEach((row, r) => {
        const label = svg("text", {x: left - 6, y: r * c + c * 0.7, "text-anchor": "end",
                                   class: "token" + (r === state.query ? " selected" : ""),
                                   "data-index": r}, D.tokens[r]);
        label.addEventListener("mouseenter", () => select(r));
        label.addEventListener("click", () => select(r));
        s.append(label);
        row.forEach((v, k) => {
          const g = Math.round(255 * (1 - Math.max(0, Math.min(1, v))));
          s.append(svg("rect", {x: left + k * c, y: r * c, width: c, height: c,
                                fill: "rgb(" + g + "," + g + "," + g + ")"}));
        });
        s.append(svg("rect", {x: left + cols * c + 8, y: r * c + 3, height: c - 6,
                              width: Math.max(0.5, barW * mean[r]), fill: "#08306b", class: "key-bar"}));
      });
      s.append(svg("rect", {x: left, y: state.query * c, width: cols * c, height: c, fill: "none",
                            stroke: "#b3261e", "stroke-width": 2, id: "query-outline"}));
      inputPanel.append(s);
      inputPanel.append(el("div", {class: "scale"},
        "bars: mean weight of the shown heads from the selected row (layer " + state.layer + ")"));
    } else {
      const box = el("div", {id: "sentence"});
      D.tokens.forEach((t, i) => {
        const classes = (i === state.query ? "selected" : "") + (D.joined[i] ? " joined" : "");
        const span = el("span", {class: classes.trim(), "data-index": i}, t);
        span.style.background = "rgba(8,48,107," + fmt(0.85 * mean[i], 3) + ")";
        span.style.color = mean[i] > 0.5 ? "#fff" : "";
        span.addEventListener("mouseenter", () => select(i));
        span.addEventListener("click", () => select(i));
        box.append(span);
      });
      inputPanel.append(box);
      if (D.input.text) inputPanel.append(el("p", {class: "scale"}, "typed: " + D.input.text));
      if (D.padding) inputPanel.append(el("p", {class: "scale"}, D.padding + " padding position(s) not shown"));
      inputPanel.append(el("div", {class: "scale"}, focused()
        ? "shade: weight of layer " + named.layer + " head " + named.head + " from the selected token"
        : "shade: mean weight of the shown heads from the selected token (layer " + state.layer + ")"));
    }
  }

  function drawHeadView() {
    headPanel.querySelectorAll(":scope > :not(h2)").forEach((e) => e.remove());
    const rowH = 22, width = 420, xl = 130, xr = 290, top = 24;
    const s = svg("svg", {width: width, height: top + n * rowH + 8, id: "head-svg"});
    s.append(svg("text", {x: xl, y: 14, "text-anchor": "end", fill: "#59636e", "font-size": 12}, "query"));
    s.append(svg("text", {x: xr, y: 14, fill: "#59636e", "font-size": 12}, "key"));
    const y = (i) => top + i * rowH + rowH / 2;
    const focus = focused();
    const order = [...Array(D.heads[state.layer]).keys()];
    if (focus) order.push(order.splice(named.head, 1)[0]);  // the named head's lines on top
    for (const source of sources()) {
      for (const h of order) {
        if (state.hidden.has(h)) continue;
        const row = weights(source, state.layer, h, state.query);
        const fade = focus && h !== named.head ? FADE : 1;
        for (let k = 0; k < n; k++) {
          const w = row[k];
          const line = svg("line", {x1: xl + 6, y1: y(state.query), x2: xr - 6, y2: y(k),
            stroke: colour(h), "stroke-width": fmt(0.5 + 5 * w, 2),
            "stroke-opacity": fmt(fade * Math.min(1, 0.04 + w), 3),
            class: "attn-line", "data-head": h, "data-key": k, "data-query": state.query,
            "data-weight": fmt(w, 4), "data-source": source});
          if (source === "reference" && state.source === "both") line.setAttribute("stroke-dasharray", "4 3");
          s.append(line);
        }
      }
    }
    for (const [x, anchor, side] of [[xl, "end", "query"], [xr, "start", "key"]]) {
      D.tokens.forEach((t, i) => {
        const label = tokenText(svg("text", {x: x, y: y(i) + 4, "text-anchor": anchor, "data-index": i,
          "data-side": side, class: "token" + (i === state.query && side === "query" ? " selected" : "")}), i);
        label.addEventListener("mouseenter", () => select(i));
        label.addEventListener("click", () => select(i));
        s.append(label);
      });
    }
    headPanel.append(s);
    const legend = state.source === "both" ? "solid: " + D.mode + ", dashed: float Keras; " : "";
    headPanel.append(el("div", {class: "scale", id: "head-caption"}, legend +
      "layer " + state.layer + ", from \u201c" + D.tokens[state.query] + "\u201d; line width and opacity: weight 0..1" +
      (focus ? "; head " + named.head + " on top, the others faded" : "")));
  }

  function mapSize() {
    // as large as the window lets every head of a layer sit in one row, within MIN_MAP..MAX_MAP
    const per = sources().length, columns = Math.max(...D.heads);
    const room = document.documentElement.clientWidth - 32 - 28 - 64;  // margins, panel, labels
    const column = Math.floor(room / columns) - 8;  // the grid's gap
    return Math.max(MIN_MAP, Math.min(MAX_MAP, Math.floor((column - 4 * (per - 1)) / per) - 2));
  }

  function drawMap(canvas, matrix, size) {
    const cell = Math.max(1, Math.ceil(size / n));
    canvas.width = n * cell; canvas.height = n * cell;
    canvas.style.width = size + "px"; canvas.style.height = size + "px";
    const ctx = canvas.getContext("2d");
    for (let q = 0; q < n; q++) {
      for (let k = 0; k < n; k++) {
        const w = Math.max(0, Math.min(1, matrix[q][k]));
        const r = Math.round(255 - 247 * w), g = Math.round(255 - 207 * w), b = Math.round(255 - 148 * w);
        ctx.fillStyle = "rgb(" + r + "," + g + "," + b + ")";
        ctx.fillRect(k * cell, q * cell, cell, cell);
      }
    }
    const line = Math.max(1, Math.min(2, cell / 2));
    ctx.strokeStyle = "#b3261e"; ctx.lineWidth = line;
    ctx.strokeRect(line / 2, state.query * cell + line / 2, n * cell - line, cell - line);
  }

  function drawModelView() {
    modelPanel.querySelectorAll(":scope > :not(h2)").forEach((e) => e.remove());
    const maxHeads = Math.max(...D.heads), size = mapSize();
    const grid = el("div", {class: "grid", id: "map-grid"});
    grid.style.gridTemplateColumns = "auto repeat(" + maxHeads + ", auto)";
    grid.append(el("div", {class: "cell"}, ""));
    for (let h = 0; h < maxHeads; h++) {
      const head = el("div", {class: "cell"}, "head " + h);
      head.style.color = colour(h);
      grid.append(head);
    }
    D.heads.forEach((heads, l) => {
      grid.append(el("div", {class: "cell"}, "layer " + l));
      for (let h = 0; h < maxHeads; h++) {
        const cell = el("div", {class: "cell"});
        if (h < heads) {
          const pair = el("div", {class: "pair"});
          for (const source of sources()) {
            const c = el("canvas", {class: "map" + (isNamed(l, h) ? " named" : ""), "data-layer": l,
                                    "data-head": h, "data-source": source,
                                    title: sourceName(source) + ": layer " + l + " head " + h});
            drawMap(c, D[source][l][h], size);
            c.addEventListener("click", () => { state.layer = l; draw(); });
            pair.append(c);
          }
          cell.append(pair);
          if (state.source === "both") cell.append(el("div", {}, D.mode + " | float"));
          if (isNamed(l, h)) cell.append(el("div", {class: "named-label"}, "\u2605 coreference"));
        }
        grid.append(cell);
      }
    });
    modelPanel.append(grid);
    const scale = el("div", {class: "scale"});
    scale.append("0", el("span", {class: "bar"}), "1 (attention weight); red box: selected query row");
    modelPanel.append(scale);
  }

  function drawParity() {
    if (!parityPanel) return;
    parityPanel.querySelectorAll(":scope > :not(h2)").forEach((e) => e.remove());
    const t = el("table", {id: "parity-table"});
    const head = el("tr");
    for (const c of ["layer", "max |\u0394|", "most-attended key agrees"]) head.append(el("th", {}, c));
    t.append(head);
    for (const row of D.parity) {
      const tr = el("tr", {"data-layer": row.layer});
      tr.append(el("td", {}, "layer " + row.layer), el("td", {}, Number(row.max_abs_diff).toExponential(2)),
                el("td", {}, fmt(100 * row.argmax_agreement, 1) + " %"));
      t.append(tr);
    }
    parityPanel.append(t);
  }

  function drawControls() {
    layerSet.querySelectorAll("button").forEach((b) => b.classList.toggle("on", Number(b.dataset.layer) === state.layer));
    headSet.querySelectorAll(".head-toggle").forEach((e) => e.remove());
    for (let h = 0; h < D.heads[state.layer]; h++) {
      const star = isNamed(state.layer, h);
      const t = el("span", {class: "head-toggle" + (star ? " named" : ""), "data-head": h});
      const sw = el("span", {class: "swatch"});
      sw.style.background = state.hidden.has(h) ? "#fff" : colour(h);
      sw.style.border = "2px solid " + colour(h);
      t.append(sw, (star ? "\u2605 " : "") + "head " + h);
      t.addEventListener("click", () => { state.hidden.has(h) ? state.hidden.delete(h) : state.hidden.add(h); draw(); });
      headSet.append(t);
    }
    document.querySelectorAll("#source-buttons button").forEach((b) => b.classList.toggle("on", b.dataset.source === state.source));
    const toggle = document.getElementById("focus-toggle");
    if (toggle) toggle.classList.toggle("on", state.focus);
  }

  function draw() {
    document.body.dataset.query = state.query;
    document.body.dataset.layer = state.layer;
    document.body.dataset.source = state.source;
    drawControls(); drawInput(); drawHeadView(); drawModelView(); drawParity();
  }
  draw();
  let resized = null;
  window.addEventListener("resize", () => { clearTimeout(resized); resized = setTimeout(drawModelView, 100); });
  document.body.dataset.ready = "1";
})();
"""
