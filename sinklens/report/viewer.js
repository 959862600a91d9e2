// sinklens interactive viewer: reads the data embedded by sinklens/report/html.py (no network).
// Per trace: a JSON header plus one base64 element per stored step, decoded lazily on demand.
"use strict";
(function () {
  const CACHE_CHUNKS = 256;           // decoded (step, layer) chunks kept in memory (LRU)

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
  // viridis-like ramp, 256 entries, from 9 anchors
  const ANCHORS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142],
                   [31, 158, 137], [53, 183, 121], [109, 205, 89], [253, 231, 37]];
  const RAMP = [];
  for (let i = 0; i < 256; i++) {
    const x = i / 255 * (ANCHORS.length - 1), k = Math.min(Math.floor(x), ANCHORS.length - 2), f = x - k;
    RAMP.push(ANCHORS[k].map((c, j) => Math.round(c + f * (ANCHORS[k + 1][j] - c))));
  }
  function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
  function showToken(s) {
    return s.replace(/Ġ/g, "␣").replace(/Ċ/g, "↵").replace(/ĉ/g, "⇥").replace(/▁/g, "␣")
            .replace(/\n/g, "↵").replace(/ /g, "␣") || "∅";
  }
  function el(tag, attrs, parent, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  class TraceData {
    constructor(k) {
      this.k = k;
      const h = JSON.parse(document.getElementById("sl-head-" + k).textContent);
      Object.assign(this, h);
      this.tok = typed(h.tokens, Int32Array);
      this.mask = bytes(h.masked);
      this.largestArr = typed(h.largest, Int16Array);
      this.largestMean = typed(h.largest_mean, Int16Array);
      this.sinkOff = typed(h.sinks.off, Int32Array);
      this.sinkPos = typed(h.sinks.pos, Int32Array);
      this.headSet = new Set(h.head_steps);
      this.meanIndex = new Map();
      let i = 0;
      for (let t = 0; t < h.T; t++) if (!this.headSet.has(t)) this.meanIndex.set(t, i++);
      const x0 = h.xmax / h.log_range, lr = Math.log1p(h.log_range);
      this.lut = new Float32Array(256).map((_, q) => x0 * Math.expm1(q / 255 * lr));
      this.maskLo = new Int32Array(h.T).fill(-1);   // masked span per step (chart shading)
      this.maskHi = new Int32Array(h.T).fill(-1);
      for (let t = 0; t < h.T; t++) for (let j = 0; j < h.S; j++) if (this.mask[t * h.S + j]) {
        if (this.maskLo[t] < 0) this.maskLo[t] = j;
        this.maskHi[t] = j;
      }
      this.cache = new Map();
      this.S3 = h.S + ((3 - h.S % 3) % 3);
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
        const txt = document.getElementById("sl-" + this.k + "-" + t).textContent;
        const n = this.chunk_bytes / 3 * 4;
        return bytes(txt.substr(l * n, n));
      });
    }
    _meanRow(t, l) {              // S bytes of the mean over heads at a step without per-head bytes
      return this._cached("m" + t + ":" + l, () => {
        if (!this._meanText) this._meanText = document.getElementById("sl-" + this.k + "-mean").textContent;
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
    largestAt(t, l, head) {
      return head < 0 ? this.largestMean[t * this.L + l] : this.largestArr[(t * this.L + l) * this.H + head];
    }
    tokenAt(t, j) { const id = this.tok[t * this.S + j]; return id < 0 ? null : (this.vocab[id] ?? "<" + id + ">"); }
    isMasked(t, j) { return this.mask[t * this.S + j] === 1; }
    mapAt(t, l, head) { return this.maps.find(m => m.t === t && m.l === l && m.h === head) || null; }
  }

  const viewers = [];

  class Viewer {
    constructor(root, data) {
      this.d = data;
      this.t = 0; this.l = data.L - 1; this.h = -1; this.timer = null;
      const box = el("section", { class: "sl-viewer", "data-trace": data.label, "data-units": data.units }, root);
      el("h2", {}, box, data.label + (data.units === "sum" ? "" : "  [" + data.units + "]"));
      el("p", { class: "note" }, box, "units: " + data.units + " — " + data.units_label + "; sinks: Eq. 3 with ε = " +
         data.eps + (data.causal ? " (causal model: raw sums carry the H_S − H_j baseline)" : ""));
      const notes = (data.summary && data.summary.notes) || [];
      if (notes.length) el("p", { class: "note sl-warn" }, box, "⚠ " + notes.join(" · "));
      const c = el("div", { class: "sl-controls" }, box);
      this.play = el("button", { type: "button", class: "sl-play" }, c, "▶ play");
      this.slider = el("input", { type: "range", min: 0, max: data.T - 1, value: 0, step: 1, class: "sl-step",
                                  "aria-label": "denoising step" }, c);
      this.stepLabel = el("span", { class: "sl-steplabel" }, c);
      el("label", {}, c, " layer ");
      this.layerSel = el("select", { class: "sl-layer" }, c);
      for (let l = 0; l < data.L; l++) el("option", { value: l }, this.layerSel, String(l));
      this.layerSel.value = this.l;
      el("label", {}, c, " head ");
      this.headSel = el("select", { class: "sl-head" }, c);
      el("option", { value: -1 }, this.headSel, "mean over heads");
      for (let h = 0; h < data.H; h++) el("option", { value: h }, this.headSel, String(h));
      this.info = el("p", { class: "sl-info" }, box);
      this.strip = el("div", { class: "sl-strip" }, box);
      this.cells = [];
      for (let j = 0; j < data.S; j++) this.cells.push(el("span", { class: "sl-tok" }, this.strip));
      const legend = el("div", { class: "sl-legend" }, box);
      el("span", {}, legend, "low");
      const bar = el("canvas", { width: 256, height: 10 }, legend);
      const bctx = bar.getContext("2d");
      for (let i = 0; i < 256; i++) { bctx.fillStyle = rgb(RAMP[i]); bctx.fillRect(i, 0, 1, 10); }
      el("span", {}, legend, "high (log scale, " + data.units + "); outlined: Eq. 3 sink, thick: largest");
      el("h3", {}, box, "Largest sink position over steps");
      this.chart = el("canvas", { class: "sl-chart", width: 800, height: 200 }, box);
      el("h3", {}, box, "Attention map of the selected slice");
      this.mapNote = el("p", { class: "note sl-mapnote" }, box);
      this.mapCanvas = el("canvas", { class: "sl-map", width: 1, height: 1 }, box);
      this.summary(box);
      this.slider.addEventListener("input", () => this.setStep(+this.slider.value, true));
      this.layerSel.addEventListener("change", () => { this.l = +this.layerSel.value; this.update(); });
      this.headSel.addEventListener("change", () => { this.h = +this.headSel.value; this.update(); });
      this.play.addEventListener("click", () => this.toggle());
      this.chart.addEventListener("click", (e) => {
        const r = this.chart.getBoundingClientRect();
        const x = (e.clientX - r.left) / r.width * this.chart.width;
        this.setStep(Math.round((x - 40) / (this.chart.width - 50) * Math.max(data.T - 1, 1)), true);
      });
      this.update();
    }
    summary(box) {
      const s = this.d.summary;
      const det = el("details", { class: "sl-summary" }, box);
      el("summary", {}, det, "Summary (numbers with units; every number is in summary.json)");
      el("pre", {}, det, JSON.stringify(s, null, 1));
      const figs = this.d.figures || {};
      if (Object.keys(figs).length) {
        const fd = el("details", { class: "sl-figs" }, box);
        el("summary", {}, fd, "Figures (" + Object.keys(figs).length + ")");
        for (const name in figs) {
          const f = el("figure", {}, fd);
          el("img", { src: figs[name], alt: name, loading: "lazy" }, f);
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
      if (propagate && document.getElementById("sl-link").checked) {
        const frac = this.d.T > 1 ? t / (this.d.T - 1) : 0;
        for (const v of viewers) if (v !== this) v.setStep(Math.round(frac * (v.d.T - 1)), false);
      }
    }
    update() {
      const d = this.d, t = this.t, l = this.l, h = this.h;
      this.stepLabel.textContent = " step " + d.step_numbers[t] + " (" + (t + 1) + "/" + d.T + ")";
      const v = d.values(t, l, h);
      const sinks = new Set(d.sinkList(t, l, h));
      const big = d.largestAt(t, l, h);
      const n = d.seq_len[t];
      let note = "";
      if (v.note) note = v.note;
      else if (v.from !== t) note = "per-head data stored every " + d.head_stride + " steps (size cap): showing step " + d.step_numbers[v.from];
      this.info.textContent = (h < 0 ? "mean over heads" : "head " + h) + ", layer " + l + ": " +
        (sinks.size ? sinks.size + " sink(s), largest at position " + big : "no sink") +
        (h < 0 ? " (largest Eq. 3 sink of the head-averaged scores)" : "") + (note ? " — " + note : "");
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
        cell.className = "sl-tok" + (sinks.has(j) ? " sink" : "") + (j === big ? " largest" : "") + (d.isMasked(t, j) ? " masked" : "");
        cell.title = "position " + j + " · " + JSON.stringify(tokText) + " · score " +
          (v.q ? d.lut[q].toPrecision(3) : "n/a") + " (" + d.units + ")" + (d.isMasked(t, j) ? " · masked" : "") +
          (sinks.has(j) ? " · SINK" : "");
      }
      this.drawChart();
      this.drawMap();
    }
    drawChart() {
      const d = this.d, cv = this.chart, ctx = cv.getContext("2d");
      const cw = Math.round(cv.clientWidth || 800);
      if (cw > 0 && cv.width !== cw) cv.width = cw;     // draw at the displayed size (no stretched text)
      const W = cv.width, H = cv.height, x0 = 40, y0 = 10, w = W - 50, hh = H - 35;
      ctx.clearRect(0, 0, W, H);
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
      const X = t => x0 + (d.T > 1 ? t / (d.T - 1) : 0.5) * w, Y = p => y0 + p / Math.max(d.S - 1, 1) * hh;
      ctx.fillStyle = "#e4e4e4";                      // masked span per step
      for (let t = 0; t < d.T; t++) {
        const lo = d.maskLo[t], hi = d.maskHi[t];
        if (lo < 0) continue;
        const a = Math.max(x0, X(t) - w / d.T / 2), b = Math.min(x0 + w, X(t) + w / d.T / 2);
        ctx.fillRect(a, Y(lo), Math.max(b - a, 1), Y(hi) - Y(lo) + 1);
      }
      ctx.strokeStyle = "#888"; ctx.strokeRect(x0, y0, w, hh);
      ctx.fillStyle = "#333"; ctx.font = "11px sans-serif";
      ctx.fillText("0", 28, y0 + 8); ctx.fillText(String(d.S - 1), 10, y0 + hh);
      ctx.fillText("step →   (y: token position of the largest sink; grey: masked span; click to jump)", x0, H - 8);
      ctx.fillStyle = "#c0392b";
      let prev = null;
      ctx.strokeStyle = "#c0392b"; ctx.beginPath();
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
          : "This trace stores no full attention maps (request map slices when sampling).";
        cv.width = 1; cv.height = 1; cv.style.display = "none";
        return;
      }
      if (!m._q) m._q = bytes(m.data);
      this.mapNote.textContent = "A[i, j] (rows = queries i, columns = keys j), log colour, max " + m.max.toPrecision(3);
      cv.style.display = ""; cv.width = m.sk; cv.height = m.sq;
      const ctx = cv.getContext("2d"), img = ctx.createImageData(m.sk, m.sq);
      for (let i = 0; i < m.sq * m.sk; i++) {
        const c = RAMP[m._q[i]];
        img.data[4 * i] = c[0]; img.data[4 * i + 1] = c[1]; img.data[4 * i + 2] = c[2]; img.data[4 * i + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
    }
  }

  function start() {
    const root = document.getElementById("sl-viewers");
    for (let k = 0; document.getElementById("sl-head-" + k); k++) viewers.push(new Viewer(root, new TraceData(k)));
    window.sinklensViewers = viewers;
    document.addEventListener("keydown", (e) => {
      if (e.target.tagName === "SELECT") return;
      if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
        const v = viewers[0];
        if (v && e.target !== v.slider) v.setStep(v.t + (e.key === "ArrowRight" ? 1 : -1), true);
      }
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
