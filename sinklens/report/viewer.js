// sinklens interactive viewer: reads the data embedded by sinklens/report/html.py (no network).
// Per trace view: a JSON header plus one base64 element per stored step, decoded lazily on demand.
// Every element id starts with the page prefix P (html.py substitutes it), so two pages can share
// one document (a notebook). One column per trace; a trace with several unit views (an ARM's sums
// and uniform_ratio) gets a units toggle in its column.
"use strict";
(function () {
  const P = "__SL_PREFIX__";
  const CACHE_CHUNKS = 256;           // decoded (step, layer) chunks kept in memory (LRU)
  const $ = (id) => document.getElementById(P + "-" + id);

  function bytes(b64) {
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function typed(b64, Type) {
    const b = bytes(b64);
    return new Type(b.buffer, 0, b.byteLength / Type.BYTES_PER_ELEMENT);
  }
  // the figures' colormap (magma), 256 RGB entries written by html.py
  const RAMP = JSON.parse($("cmap").textContent);
  /*__SL_COMMON__*/
  function niceStride(n, want) {      // 1, 2, 5, 10, 20, 50, ... so that about `want` ticks show
    const raw = Math.max(1, n / Math.max(want, 1));
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return Math.max(1, Math.round(m * p));
    return Math.max(1, Math.round(10 * p));
  }
  function showToken(s) {
    return s.replace(/Ġ/g, "␣").replace(/Ċ/g, "↵").replace(/ĉ/g, "⇥").replace(/▁/g, "␣")
            .replace(/\n/g, "↵").replace(/ /g, "␣") || "∅";
  }
  // log-quantised byte -> value, the inverse of html.py `quantise`: x0 = xmax / range
  function dequant(q, xmax, range) { return xmax / range * Math.expm1(q / 255 * Math.log1p(range)); }

  class TraceData {
    constructor(k) {
      this.k = k;
      const h = JSON.parse($("head-" + k).textContent);
      Object.assign(this, h);
      this.tok = typed(h.tokens, Int32Array);
      this.mask = bytes(h.masked);
      this.largestArr = typed(h.largest, Int16Array);
      this.largestMean = typed(h.largest_mean, Int16Array);
      this.sinkOff = typed(h.sinks.off, Int32Array);
      this.sinkPos = typed(h.sinks.pos, Int32Array);
      this.sinkNear = bytes(h.sinks.near);        // 1: a sink float16 rounding could flip (near ε)
      this.headSet = new Set(h.head_steps);
      this.meanIndex = new Map();
      let i = 0;
      for (let t = 0; t < h.T; t++) if (!this.headSet.has(t)) this.meanIndex.set(t, i++);
      this.lut = new Float32Array(256).map((_, q) => dequant(q, h.xmax, h.log_range));
      // masked positions per step as runs [lo, hi] (chart shading): exactly the masked cells, as Fig. 7
      // (Dream unmasks anywhere: a leftmost..rightmost span would shade unmasked tokens too)
      this.maskRuns = [];
      for (let t = 0; t < h.T; t++) {
        const runs = [];
        for (let j = 0; j < h.S; j++) if (this.mask[t * h.S + j]) {
          if (runs.length && runs[runs.length - 1][1] === j - 1) runs[runs.length - 1][1] = j; else runs.push([j, j]);
        }
        this.maskRuns.push(runs);
      }
      this.cache = new Map();
      this.S3 = h.S + ((3 - h.S % 3) % 3);
      // editing samplers: editedBefore[t * S + j] = 1 when position j was rewritten at step t or earlier
      this.editedBefore = null;
      if (h.edited) {
        const at = bytes(h.edited.at);
        this.editedBefore = new Uint8Array(h.T * h.S);
        for (let t = 0; t < h.T; t++) for (let j = 0; j < h.S; j++)
          this.editedBefore[t * h.S + j] = at[t * h.S + j] || (t > 0 && this.editedBefore[(t - 1) * h.S + j]) ? 1 : 0;
      }
      this.blockStarts = new Set(h.blocks ? h.blocks.starts : []);
    }
    _cached(key, make) {
      if (this.cache.has(key)) { const v = this.cache.get(key); this.cache.delete(key); this.cache.set(key, v); return v; }
      const v = make();
      this.cache.set(key, v);
      if (this.cache.size > CACHE_CHUNKS) this.cache.delete(this.cache.keys().next().value);
      return v;
    }
    _headChunk(t, l) {            // (H + 1) * S bytes of a stored step and layer
      return this._cached(t + ":" + l, () => {
        const txt = $(this.k + "-" + t).textContent;
        const n = this.chunk_bytes / 3 * 4;
        return bytes(txt.substr(l * n, n));
      });
    }
    _meanRow(t, l) {              // S bytes of the mean over heads at a step without per-head bytes
      return this._cached("m" + t + ":" + l, () => {
        if (!this._meanText) this._meanText = $(this.k + "-mean").textContent;
        const n = this.S3 / 3 * 4, i = this.meanIndex.get(t) * this.L + l;
        return bytes(this._meanText.substr(i * n, n));
      });
    }
    nearestHeadStep(t) {
      let best = this.head_steps[0];
      for (const s of this.head_steps) if (Math.abs(s - t) < Math.abs(best - t)) best = s;
      return best;
    }
    // quantised bytes (S) of (t, l, head) — head -1: mean over heads — and the step they come from
    values(t, l, head) {
      if (head < 0) {
        if (this.headSet.has(t)) return { q: this._headChunk(t, l).subarray(this.H * this.S, (this.H + 1) * this.S), from: t };
        return { q: this._meanRow(t, l).subarray(0, this.S), from: t };
      }
      if (this.head_layers.indexOf(l) < 0) return { q: null, from: t, note: "per-head data not stored for layer " + l };
      const s = this.nearestHeadStep(t);
      return { q: this._headChunk(s, l).subarray(head * this.S, (head + 1) * this.S), from: s };
    }
    sinkList(t, l, head) {
      if (head < 0) { const p = this.largestMean[t * this.L + l]; return p >= 0 ? [p] : []; }
      const key = (t * this.L + l) * this.H + head;
      return Array.from(this.sinkPos.subarray(this.sinkOff[key], this.sinkOff[key + 1]));
    }
    nearList(t, l, head) {        // the sinks of sinkList(t, l, head) within float16 rounding of ε
      if (head < 0) return [];
      const key = (t * this.L + l) * this.H + head, out = [];
      for (let i = this.sinkOff[key]; i < this.sinkOff[key + 1]; i++) if (this.sinkNear[i]) out.push(this.sinkPos[i]);
      return out;
    }
    largestAt(t, l, head) {
      return head < 0 ? this.largestMean[t * this.L + l] : this.largestArr[(t * this.L + l) * this.H + head];
    }
    tokenAt(t, j) { const id = this.tok[t * this.S + j]; return id < 0 ? null : (this.vocab[id] ?? "<" + id + ">"); }
    isMasked(t, j) { return this.mask[t * this.S + j] === 1; }
    isEdited(t, j) { return this.editedBefore !== null && this.editedBefore[t * this.S + j] === 1; }
    mapAt(t, l, head) { return this.maps.find(m => m.t === t && m.l === l && m.h === head) || null; }
    stepAxis() { return this.causal ? "decoding step index (0 = prefill)" : "denoising step index"; }
  }

  const viewers = [];

  class Viewer {
    constructor(root, alts) {
      this.alts = alts;
      const data = this.d = alts[0];
      this.t = 0; this.timer = null;
      // first view: the head with the strongest sink (mean over heads has none on many traces)
      if (data.has_sinks) { this.l = data.strongest[0]; this.h = data.strongest[1]; }
      else { this.l = data.L - 1; this.h = -1; }
      const box = this.box = el("section", { class: "sl-viewer", "data-trace": data.label, "data-units": data.units }, root);
      el("h2", {}, box, data.label);
      this.unitsNote = el("p", { class: "note" }, box);
      this.warn = el("p", { class: "note sl-warn" }, box);
      this.hint = el("p", { class: "sl-hint" }, box);
      const c = el("div", { class: "sl-controls" }, box);
      this.play = el("button", { type: "button", class: "sl-play" }, c, "▶ play");
      this.slider = el("input", { type: "range", min: 0, max: data.T - 1, value: 0, step: 1, class: "sl-step",
                                  "aria-label": "step" }, c);
      this.stepLabel = el("span", { class: "sl-steplabel" }, c);
      // the pickers on a row of their own, each label with its select (they wrap as pairs, never apart)
      const pk = el("div", { class: "sl-controls sl-pickers" }, box);
      this.layerSel = el("select", { class: "sl-layer" }, el("label", { class: "sl-pick" }, pk, "layer "));
      for (let l = 0; l < data.L; l++) el("option", { value: l }, this.layerSel, String(l));
      this.layerSel.value = this.l;
      this.headSel = el("select", { class: "sl-head" }, el("label", { class: "sl-pick" }, pk, "head "));
      el("option", { value: -1 }, this.headSel, "mean over heads");
      for (let h = 0; h < data.H; h++) el("option", { value: h }, this.headSel, String(h));
      this.headSel.value = this.h;
      if (alts.length > 1) {
        this.unitsSel = el("select", { class: "sl-units" }, el("label", { class: "sl-pick" }, pk, "units "));
        alts.forEach((a, i) => el("option", { value: i }, this.unitsSel, a.units));
        this.unitsSel.addEventListener("change", () => this.setUnits(+this.unitsSel.value));
      }
      this.info = el("p", { class: "sl-info" }, box);
      this.strip = el("div", { class: "sl-strip" }, box);
      this.cells = [];
      for (let j = 0; j < data.S; j++) this.cells.push(el("span", { class: "sl-tok" }, this.strip));
      this.legend = el("div", { class: "sl-legend" }, box);
      el("h3", {}, box, "Largest sink position over steps");
      this.chart = el("canvas", { class: "sl-chart", width: 800, height: 230 }, box);
      el("p", { class: "note" }, box, "red: position of the largest Eq. 3 sink at each step (gaps: no sink); grey: " +
         "masked positions; dashed: prompt | answer" + (data.blocks ? "; dotted: block boundaries" : "") +
         "; click to jump to a step.");
      el("h3", {}, box, "Attention map of the selected slice");
      this.mapNote = el("p", { class: "note sl-mapnote" }, box);
      this.mapCanvas = el("canvas", { class: "sl-map", width: 1, height: 1 }, box);
      this.summaryBox = el("details", { class: "sl-summary", open: "" }, box);
      this.blocksBox = el("details", { class: "sl-blocks", open: "" }, box);
      this.figures(box);
      this.slider.addEventListener("input", () => this.setStep(+this.slider.value, true));
      this.layerSel.addEventListener("change", () => { this.l = +this.layerSel.value; this.update(); });
      this.headSel.addEventListener("change", () => { this.h = +this.headSel.value; this.update(); });
      this.play.addEventListener("click", () => this.toggle());
      this.chart.addEventListener("click", (e) => {
        const r = this.chart.getBoundingClientRect(), g = this._chartGeom;
        if (!g) return;
        const x = (e.clientX - r.left) / r.width * this.chart.width;
        this.setStep(Math.round((x - g.x0) / g.w * Math.max(this.d.T - 1, 1)), true);
      });
      this.setUnits(0);
    }
    setUnits(i) {
      const d = this.d = this.alts[i];
      this.box.setAttribute("data-units", d.units);
      this.unitsNote.textContent = "units: " + d.units + " — " + d.units_label + "; sinks: Eq. 3 with ε = " + d.sink_eps +
        (d.causal ? " (causal model: raw sums carry the H_S − H_j baseline; see the uniform_ratio view)" : "") +
        (d.blocks && d.blocks.attention && d.units !== "uniform_ratio"
          ? " (block-causal: keys of earlier blocks are seen by more queries; see the uniform_ratio view)" : "");
      const notes = (d.summary && d.summary.notes) || [];
      this.warn.textContent = notes.length ? "⚠ " + notes.join(" · ") : "";
      this.warn.style.display = notes.length ? "" : "none";
      this.hint.textContent = d.has_sinks
        ? "Strongest sink in these units: layer " + d.strongest[0] + ", head " + d.strongest[1] + " (largest Eq. 3 " +
          "sink score, averaged over steps)" + (i === 0 ? "; the first view shows it" : "") + ". Pick another layer / " +
          "head, or \"mean over heads\", below."
        : "No Eq. 3 sink in any head at ε = " + d.sink_eps + (i === 0 ? ": showing the mean over heads of the last layer." : ".");
      this.drawLegend();
      this.summary();
      this.blocksPanel();
      this.update();
    }
    blocksPanel() {                // block diffusion: sinks across blocks; editing: sinks on rewritten tokens
      const d = this.d, det = this.blocksBox;
      det.textContent = "";
      det.style.display = d.blocks || d.edited ? "" : "none";
      if (!d.blocks && !d.edited) return;
      el("summary", {}, det, (d.blocks ? "Sinks across blocks" : "") + (d.blocks && d.edited ? " · " : "") +
         (d.edited ? "sinks on edited tokens" : "") + " [units=" + d.units + "]");
      if (d.blocks) {
        const k = d.blocks.dynamics;
        el("p", { class: "note" }, det, (d.blocks.attention ? "block-causal attention, " : "generation ") + "blocks of " +
           d.blocks.size + " (dotted lines in the chart and the token strip). Sinks = (layer, head, position) Eq. 3 sinks " +
           "at each block's last step, by where they sit (prompt, earlier blocks, the block's own positions); persist / " +
           "new / gone: compared with the next block's.");
        const tb = el("table", { class: "sl-block-table" }, det);
        const hr = el("tr", {}, tb);
        for (const c of ["block", "steps", "sinks", "prompt", "earlier", "own", "persist", "new", "gone"]) el("th", {}, hr, c);
        k.blocks.forEach((b, i) => {
          const tr = el("tr", {}, tb);
          const last = i === k.blocks.length - 1;
          for (const v of [b, d.step_numbers[k.first_step[i]] + "–" + d.step_numbers[k.last_step[i]], k.sinks[i],
                           k.in_prompt[i], k.in_earlier_blocks[i], k.in_own_block[i],
                           last ? "" : k.persist[i], last ? "" : k.new[i], last ? "" : k.gone[i]]) el("td", {}, tr, String(v));
        });
      }
      if (d.edited) {
        const total = d.edited.on_edited.reduce((x, y) => x + y, 0);
        this.editedNote = el("p", { class: "note sl-edited" }, det, "Edited tokens (double red underline in the strip): " +
          d.edited.positions.length + " positions rewritten (" + (d.edited.positions.join(", ") || "none") + "); " +
          total + " (step, layer, head) sinks sit on an edited token.");
      }
    }
    drawLegend() {
      const d = this.d, lg = this.legend;
      lg.textContent = "";
      const bar = el("div", { class: "sl-legend-bar" }, lg);
      const cv = el("canvas", { width: 256, height: 10 }, bar);
      const ctx = cv.getContext("2d");
      for (let i = 0; i < 256; i++) { ctx.fillStyle = rgb(RAMP[i]); ctx.fillRect(i, 0, 1, 10); }
      for (const q of [0, 64, 128, 192, 255]) {
        el("span", { class: "sl-legend-num", style: "left:" + q + "px" }, bar, fmt(d.lut[q]));
      }
      // an ARM's largest score is often at a decoding step of one query row, where uniform_ratio and the
      // summed units agree: the same numbers are then right for both views, and said so
      const same = this.alts.length > 1 && this.alts.every(x => x.xmax === d.xmax) && d.xmax_rows === 1;
      this.legendSame = same;
      el("span", {}, lg, "received attention per token, log colour [units=" + d.units + "]" +
         (same ? " (same scale in every units view: the largest score is at a step of one query row, where " +
                 this.alts.map(x => x.units).join(" and ") + " agree)" : "") + "; outlined: Eq. 3 sink, " +
         "thick: largest; dashed: a sink within float16 rounding of ε; dotted underline: masked");
    }
    summary() {
      const s = this.d.summary, det = this.summaryBox;
      det.textContent = "";
      el("summary", {}, det, "Summary [units=" + this.d.units + "] (every number: summary.json)");
      const tb = el("table", {}, det);
      for (const [k, v] of s.rows) {            // Analysis.summary_rows(): already 3 significant digits
        const tr = el("tr", {}, tb); el("th", {}, tr, k); el("td", {}, tr, v);
      }
    }
    figures(box) {
      const all = this.d.figures || {};
      // the mechanism readouts (figures named readout_*: sinklens/report/readouts.py) get a panel of their own
      const panels = [["Figures", (n) => !n.startsWith("readout_")],
                      ["Mechanism readouts", (n) => n.startsWith("readout_")]];
      for (const [title, keep] of panels) {
        const names = Object.keys(all).filter(keep);
        if (!names.length) continue;
        const fd = el("details", { class: "sl-figs" }, box);
        el("summary", {}, fd, title + " (" + names.length + ")");
        for (const name of names) {
          const f = el("figure", {}, fd);
          el("img", { src: all[name], alt: name, loading: "lazy" }, f);
          el("figcaption", {}, f, name);
        }
      }
    }
    toggle() {
      if (this.timer) { clearInterval(this.timer); this.timer = null; this.play.textContent = "▶ play"; return; }
      if (this.t >= this.d.T - 1) this.setStep(0, true);
      this.play.textContent = "❚❚ pause";
      this.timer = setInterval(() => {
        if (this.t >= this.d.T - 1) { this.toggle(); return; }
        this.setStep(this.t + 1, true);
      }, 150);
    }
    setStep(t, propagate) {
      t = Math.max(0, Math.min(this.d.T - 1, t | 0));
      if (t === this.t && +this.slider.value === t) { this.update(); return; }
      this.t = t; this.slider.value = t;
      this.update();
      const link = $("link");
      if (propagate && link && link.checked) {
        const frac = this.d.T > 1 ? t / (this.d.T - 1) : 0;
        for (const v of viewers) if (v !== this) v.setStep(Math.round(frac * (v.d.T - 1)), false);
      }
    }
    update() {
      const d = this.d, t = this.t, l = this.l, h = this.h;
      this.stepLabel.textContent = " step " + d.step_numbers[t] + " (" + (t + 1) + "/" + d.T + ")";
      const v = d.values(t, l, h);
      const sinks = new Set(d.sinkList(t, l, h));
      const near = new Set(d.nearList(t, l, h));
      const big = d.largestAt(t, l, h);
      const n = d.seq_len[t];
      let note = "";
      if (v.note) note = v.note;
      else if (v.from !== t) note = "per-head data stored every " + d.head_stride + " steps (size cap): showing step " + d.step_numbers[v.from];
      this.info.textContent = (h < 0 ? "mean over heads" : "head " + h) + ", layer " + l + ": " +
        (sinks.size ? sinks.size + " sink(s), largest at position " + big : "no sink") +
        (h < 0 ? " (largest Eq. 3 sink of the head-averaged scores)" : "") + (note ? " — " + note : "") +
        (d.edited ? "; on edited tokens: " + [...sinks].filter(j => d.isEdited(t, j)).length : "");
      for (let j = 0; j < d.S; j++) {
        const cell = this.cells[j];
        if (j >= n || d.tokenAt(t, j) === null) { cell.style.display = "none"; continue; }
        cell.style.display = "";
        const q = v.q ? v.q[j] : 0;
        const c = RAMP[q];
        cell.style.background = rgb(c);
        cell.style.color = (0.3 * c[0] + 0.6 * c[1] + 0.1 * c[2]) > 140 ? "#000" : "#fff";
        const tokText = d.tokenAt(t, j);
        if (cell._tok !== tokText) {
          const id = d.tok[t * d.S + j];
          cell.textContent = id === d.mask_id ? "[M]" : showToken(tokText.length > 14 ? tokText.slice(0, 13) + "…" : tokText);
          cell._tok = tokText;
        }
        cell.className = "sl-tok" + (sinks.has(j) ? " sink" : "") + (near.has(j) ? " near" : "") + (j === big ? " largest" : "") + (d.isMasked(t, j) ? " masked" : "") +
          (d.blockStarts.has(j) ? " block-start" : "") + (d.isEdited(t, j) ? " edited" : "");
        cell.title = "position " + j + " · " + JSON.stringify(tokText) + " · score " +
          (v.q ? fmt(d.lut[q]) : "n/a") + " (" + d.units + ")" + (d.isMasked(t, j) ? " · masked" : "") +
          (d.isEdited(t, j) ? " · edited" : "") + (sinks.has(j) ? " · SINK" : "") +
          (near.has(j) ? " (near ε: within float16 rounding, could flip)" : "");
      }
      this.drawChart();
      this.drawMap();
    }
    drawChart() {
      const d = this.d, cv = this.chart, ctx = cv.getContext("2d");
      const cw = Math.round(cv.clientWidth || 800);
      if (cw > 0 && cv.width !== cw) cv.width = cw;     // draw at the displayed size (no stretched text)
      const W = cv.width, H = cv.height, x0 = 58, y0 = 8, w = W - x0 - 12, hh = H - y0 - 44;
      this._chartGeom = { x0: x0, w: w };
      ctx.clearRect(0, 0, W, H);
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
      const X = t => x0 + (d.T > 1 ? t / (d.T - 1) : 0.5) * w, Y = p => y0 + (p + 0.5) / Math.max(d.S, 1) * hh;
      ctx.fillStyle = "#e4e4e4";                      // masked positions per step
      for (let t = 0; t < d.T; t++) {
        const a = Math.max(x0, X(t) - w / d.T / 2), b = Math.min(x0 + w, X(t) + w / d.T / 2);
        for (const [lo, hi] of d.maskRuns[t]) ctx.fillRect(a, Y(lo - 0.5), Math.max(b - a, 1), Y(hi + 0.5) - Y(lo - 0.5));
      }
      ctx.strokeStyle = "#888"; ctx.lineWidth = 1; ctx.strokeRect(x0, y0, w, hh);
      ctx.fillStyle = "#333"; ctx.font = "11px sans-serif"; ctx.strokeStyle = "#888";
      // x: step ticks labelled with the sampler's step numbers
      ctx.textAlign = "center"; ctx.textBaseline = "top";
      const xs = niceStride(d.T, Math.max(2, Math.floor(w / 60)));
      this.chartTicks = { x: [], y: [] };            // what was drawn (read by the browser test)
      for (let t = 0; t < d.T; t += xs) {
        ctx.beginPath(); ctx.moveTo(X(t), y0 + hh); ctx.lineTo(X(t), y0 + hh + 4); ctx.stroke();
        ctx.fillText(String(d.step_numbers[t]), X(t), y0 + hh + 6);
        this.chartTicks.x.push(d.step_numbers[t]);
      }
      ctx.fillText(d.stepAxis(), x0 + w / 2, y0 + hh + 22);
      // y: token positions
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      const ys = niceStride(d.S, Math.max(2, Math.floor(hh / 28)));
      for (let p = 0; p < d.S; p += ys) {
        ctx.beginPath(); ctx.moveTo(x0 - 4, Y(p)); ctx.lineTo(x0, Y(p)); ctx.stroke();
        ctx.fillText(String(p), x0 - 6, Y(p));
        this.chartTicks.y.push(p);
      }
      ctx.save(); ctx.translate(12, y0 + hh / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center";
      ctx.fillText("token position", 0, 0); ctx.restore();
      const pl = d.prompt_length;
      if (pl !== null && pl !== undefined && pl > 0 && pl < d.S) {
        ctx.setLineDash([4, 3]); ctx.strokeStyle = "#555";
        ctx.beginPath(); ctx.moveTo(x0, Y(pl - 0.5)); ctx.lineTo(x0 + w, Y(pl - 0.5)); ctx.stroke();
        ctx.setLineDash([]);
        ctx.textAlign = "left"; ctx.textBaseline = "bottom"; ctx.fillStyle = "#555";
        ctx.fillText("prompt | answer", x0 + 4, Y(pl - 0.5) - 1);
      }
      this.chartBlocks = [];                          // block boundaries drawn (read by the browser test)
      if (d.blocks) {
        ctx.setLineDash([1, 3]); ctx.strokeStyle = "#777";
        for (const p of d.blocks.starts) {
          ctx.beginPath(); ctx.moveTo(x0, Y(p - 0.5)); ctx.lineTo(x0 + w, Y(p - 0.5)); ctx.stroke();
          this.chartBlocks.push(p);
        }
        ctx.setLineDash([]);
      }
      ctx.fillStyle = "#c0392b"; ctx.strokeStyle = "#c0392b";
      let prev = null;
      ctx.beginPath();
      for (let t = 0; t < d.T; t++) {
        const p = d.largestAt(t, this.l, this.h);
        if (p < 0) { prev = null; continue; }
        ctx.fillRect(X(t) - 2, Y(p) - 2, 4, 4);
        if (prev !== null) { ctx.moveTo(X(t - 1), Y(prev)); ctx.lineTo(X(t), Y(p)); }
        prev = p;
      }
      ctx.stroke();
      ctx.strokeStyle = "#2c3e50"; ctx.beginPath(); ctx.moveTo(X(this.t), y0); ctx.lineTo(X(this.t), y0 + hh); ctx.stroke();
    }
    drawMap() {
      const d = this.d, m = this.h >= 0 ? d.mapAt(this.t, this.l, this.h) : null, cv = this.mapCanvas;
      if (!m) {
        const all = d.maps.map(x => "step " + d.step_numbers[x.t] + " L" + x.l + " H" + x.h);
        const where = all.slice(0, 12).join(", ") + (all.length > 12 ? ", … (" + all.length + " in all)" : "");
        this.mapNote.textContent = d.maps.length ? "No map stored for this slice. Stored: " + where + "."
          : "This trace stores no full attention maps (sinklens trace --map-slices LAYER:HEAD,...; Python: CaptureOptions(map_slices=[(layer, head)])).";
        cv.width = 1; cv.height = 1; cv.style.display = "none";
        return;
      }
      if (!m._q) m._q = bytes(m.data);
      this.mapNote.textContent = "A[i, j]: rows = queries i, columns = keys j; log colour (magma, as Fig. 4); max " +
        fmt(m.max) + ".";
      // geometry: map, axes (left, bottom), colour bar (right)
      const left = 104, top = 8, bottom = 96, right = 92;   // room for "position token" tick labels
      const avail = Math.max(160, Math.min((this.box.clientWidth || 520) - 30, 560) - left - right);
      const cwid = avail / m.sk, chei = m.sq === 1 ? 22 : Math.min(cwid, 380 / m.sq);
      const mw = Math.round(cwid * m.sk), mh = Math.max(Math.round(chei * m.sq), 22);
      cv.style.display = ""; cv.width = left + mw + right; cv.height = top + Math.max(mh, 110) + bottom;
      const ctx = cv.getContext("2d");
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, cv.width, cv.height);
      const off = document.createElement("canvas"); off.width = m.sk; off.height = m.sq;
      const octx = off.getContext("2d"), img = octx.createImageData(m.sk, m.sq);
      for (let i = 0; i < m.sq * m.sk; i++) {
        const c = RAMP[m._q[i]];
        img.data[4 * i] = c[0]; img.data[4 * i + 1] = c[1]; img.data[4 * i + 2] = c[2]; img.data[4 * i + 3] = 255;
      }
      octx.putImageData(img, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(off, left, top, mw, mh);
      ctx.strokeStyle = "#888"; ctx.strokeRect(left, top, mw, mh);
      ctx.fillStyle = "#333"; ctx.font = "11px sans-serif";
      // tick labels "position token" as the step fed them ([M]: masked), as the figures' Fig. 4
      const tokLabel = (p) => {
        const tok = d.isMasked(m.t, p) ? "[M]" : showToken(d.tokenAt(m.t, p) ?? "");
        return p + " " + (tok.length > 9 ? tok.slice(0, 8) + "…" : tok);
      };
      this.mapTicks = { x: [], y: [] };               // tick labels drawn (read by the browser test)
      ctx.font = "10px ui-monospace, Menlo, Consolas, monospace";
      // x: key positions j, labels turned to run downwards
      const xs = niceStride(m.sk, Math.max(2, Math.floor(mw / 14)));
      for (let j = 0; j < m.sk; j += xs) {
        const x = left + (j + 0.5) * mw / m.sk;
        ctx.beginPath(); ctx.moveTo(x, top + mh); ctx.lineTo(x, top + mh + 4); ctx.stroke();
        ctx.save(); ctx.translate(x, top + mh + 6); ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "right"; ctx.textBaseline = "middle"; ctx.fillText(tokLabel(j), 0, 0); ctx.restore();
        this.mapTicks.x.push(tokLabel(j));
      }
      ctx.font = "11px sans-serif"; ctx.textAlign = "center"; ctx.textBaseline = "bottom";
      ctx.fillText("key position j and its token", left + mw / 2, top + Math.max(mh, 110) + bottom - 2);
      // y: query rows = the step's last sq positions (all of a DLM step; an ARM decoding step's newest)
      ctx.font = "10px ui-monospace, Menlo, Consolas, monospace";
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      const first = m.sk - m.sq;
      const ys = niceStride(m.sq, Math.max(1, Math.floor(mh / 13)));
      for (let i = 0; i < m.sq; i += ys) {
        const y = top + (i + 0.5) * mh / m.sq;
        ctx.beginPath(); ctx.moveTo(left - 4, y); ctx.lineTo(left, y); ctx.stroke();
        ctx.fillText(tokLabel(first + i), left - 6, y);
        this.mapTicks.y.push(tokLabel(first + i));
      }
      ctx.font = "11px sans-serif";
      ctx.save(); ctx.translate(10, top + mh / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center";
      ctx.fillText(m.sq === 1 ? "query (newest)" : "query position i", 0, 0); ctx.restore();
      // colour bar with numbers: the map's own log scale (html.py quantises each map to its max)
      const bx = left + mw + 14, bh = Math.max(mh, 110), bw = 12;
      for (let y = 0; y < bh; y++) {
        ctx.fillStyle = rgb(RAMP[Math.round(255 * (1 - y / Math.max(bh - 1, 1)))]);
        ctx.fillRect(bx, top + y, bw, 1);
      }
      ctx.strokeStyle = "#888"; ctx.strokeRect(bx, top, bw, bh);
      ctx.fillStyle = "#333"; ctx.textAlign = "left"; ctx.textBaseline = "middle";
      this.mapBar = [];                               // colour-bar numbers drawn (read by the browser test)
      for (const q of [0, 64, 128, 192, 255]) {
        const y = top + (1 - q / 255) * (bh - 1);
        ctx.fillText(fmt(dequant(q, m.max, d.log_range)), bx + bw + 4, y);
        this.mapBar.push(dequant(q, m.max, d.log_range));
      }
      this.mapGeom = { left: left, top: top, w: mw, h: mh };
      ctx.save(); ctx.translate(cv.width - 4, top + bh / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center";
      ctx.fillText("A[i, j]", 0, 0); ctx.restore();
    }
  }

  function start() {
    const root = $("viewers");
    const groups = [];
    for (let k = 0; $("head-" + k); k++) {
      const data = new TraceData(k);
      (groups[data.group] = groups[data.group] || []).push(data);
    }
    for (const alts of groups) viewers.push(new Viewer(root, alts));
    window.sinklensPages = window.sinklensPages || {};
    window.sinklensPages[P] = viewers;
    window.sinklensViewers = viewers;       // the last page started (a standalone page has one)
    const page = $("page");
    document.addEventListener("keydown", (e) => {
      if (e.target.tagName === "SELECT" || e.target.tagName === "INPUT") return;
      const mine = page && page.contains(e.target);
      const first = Object.keys(window.sinklensPages)[0] === P;
      if (!(mine || (e.target === document.body && first))) return;
      if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
        const v = viewers[0];
        if (v) v.setStep(v.t + (e.key === "ArrowRight" ? 1 : -1), true);
      }
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
