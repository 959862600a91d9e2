// sinklens corpus page: browse a corpus run's per-(layer, head) totals (sinklens/report/corpus.py).
// Each .sl-lh panel reads its JSON ({L, H, labels, metrics: {name: {what, runs: [L x H, L x H | null]}}})
// and draws the chosen metric as an L x H grid for the corpus and, beside it on the same colour scale,
// its control; the table lists every metric at the chosen (layer, head). No network.
"use strict";
(function () {
  const RAMP = JSON.parse(document.getElementById("sl-cmap").textContent);   // magma, as the trace page
  /*__SL_COMMON__*/

  class LayerHeadPanel {
    constructor(root) {
      const d = this.d = JSON.parse(root.querySelector("script").textContent);
      this.metric = Object.keys(d.metrics)[0];
      this.l = d.start[0]; this.h = d.start[1];
      const c = el("div", { class: "sl-controls sl-pickers" }, root);
      this.metricSel = el("select", { class: "sl-metric" }, el("label", { class: "sl-pick" }, c, "quantity "));
      for (const m in d.metrics) el("option", { value: m }, this.metricSel, m);
      this.layerSel = el("select", { class: "sl-layer" }, el("label", { class: "sl-pick" }, c, "layer "));
      for (let l = 0; l < d.L; l++) el("option", { value: l }, this.layerSel, String(l));
      this.headSel = el("select", { class: "sl-head" }, el("label", { class: "sl-pick" }, c, "head "));
      for (let h = 0; h < d.H; h++) el("option", { value: h }, this.headSel, String(h));
      this.what = el("p", { class: "note" }, root);
      const grids = el("div", { class: "sl-lh-grids" }, root);
      this.canvases = d.labels.map((label, k) => {
        const f = el("figure", { class: "sl-lh-grid" }, grids);
        el("figcaption", {}, f, label);
        const cv = el("canvas", { width: 10, height: 10 }, f);
        cv.addEventListener("click", (e) => this.pick(cv, e));
        return cv;
      });
      this.bar = el("canvas", { class: "sl-lh-bar", width: 300, height: 34 }, root);
      this.table = el("table", { class: "sl-table num" }, root);
      this.metricSel.addEventListener("change", () => { this.metric = this.metricSel.value; this.draw(); });
      this.layerSel.addEventListener("change", () => { this.l = +this.layerSel.value; this.draw(); });
      this.headSel.addEventListener("change", () => { this.h = +this.headSel.value; this.draw(); });
      this.draw();
    }
    geom() {                        // cell size: the grid fits its half of the panel, cells at least 4 px
      const room = Math.max(160, (this.canvases[0].parentNode.parentNode.clientWidth || 600) / this.canvases.length - 70);
      const cw = Math.max(4, Math.min(40, Math.floor(room / this.d.H)));
      return { left: 34, top: 4, cw: cw, ch: Math.max(4, Math.min(24, cw, Math.floor(420 / this.d.L))), bottom: 30 };
    }
    pick(cv, e) {
      const g = this.geom(), r = cv.getBoundingClientRect();
      const x = (e.clientX - r.left) * cv.width / r.width - g.left, y = (e.clientY - r.top) * cv.height / r.height - g.top;
      const h = Math.floor(x / g.cw), l = Math.floor(y / g.ch);
      if (h >= 0 && h < this.d.H && l >= 0 && l < this.d.L) { this.l = l; this.h = h; this.draw(); }
    }
    scale() {                       // one linear scale for the corpus and its control: 0 (or the min) .. max
      let lo = Infinity, hi = -Infinity;
      for (const run of this.d.metrics[this.metric].runs) if (run) for (const row of run) for (const v of row)
        if (v !== null && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      if (!isFinite(hi)) return [0, 1];
      lo = Math.min(lo, 0);
      return [lo, hi > lo ? hi : lo + 1];   // an all-zero field: zero is the lowest colour, not mid-scale
    }
    draw() {
      const d = this.d, m = d.metrics[this.metric], g = this.geom(), [lo, hi] = this.scale();
      this.metricSel.value = this.metric; this.layerSel.value = this.l; this.headSel.value = this.h;
      this.what.textContent = m.what;
      this.drawn = [];              // what each grid shows (read by the browser test)
      m.runs.forEach((run, k) => {
        const cv = this.canvases[k], ctx = cv.getContext("2d");
        cv.width = g.left + d.H * g.cw + 4; cv.height = g.top + d.L * g.ch + g.bottom;
        ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, cv.width, cv.height);
        const colours = [];
        for (let l = 0; l < d.L; l++) for (let h = 0; h < d.H; h++) {
          const v = run ? run[l][h] : null;
          const q = v === null || !isFinite(v) ? -1 : Math.round(255 * (v - lo) / (hi - lo));
          ctx.fillStyle = q < 0 ? "#ddd" : rgb(RAMP[q]);
          ctx.fillRect(g.left + h * g.cw, g.top + l * g.ch, g.cw, g.ch);
          colours.push(q);
        }
        this.drawn.push(colours);
        ctx.strokeStyle = "#00e5ff"; ctx.lineWidth = 2;
        ctx.strokeRect(g.left + this.h * g.cw + 1, g.top + this.l * g.ch + 1, g.cw - 2, g.ch - 2);
        ctx.fillStyle = "#333"; ctx.font = "10px sans-serif"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
        const ls = Math.max(1, Math.ceil(12 / g.ch)), hs = Math.max(1, Math.ceil(18 / g.cw));
        for (let l = 0; l < d.L; l += ls) ctx.fillText(String(l), g.left - 4, g.top + (l + 0.5) * g.ch);
        ctx.textAlign = "center"; ctx.textBaseline = "top";
        for (let h = 0; h < d.H; h += hs) ctx.fillText(String(h), g.left + (h + 0.5) * g.cw, g.top + d.L * g.ch + 2);
        ctx.fillText("head", g.left + d.H * g.cw / 2, g.top + d.L * g.ch + 15);
        ctx.save(); ctx.translate(9, g.top + d.L * g.ch / 2); ctx.rotate(-Math.PI / 2); ctx.fillText("layer", 0, 0);
        ctx.restore();
        if (!run) { ctx.fillStyle = "#555"; ctx.textAlign = "left"; ctx.fillText("(not recorded)", g.left + 4, g.top + 4); }
      });
      const bc = this.bar.getContext("2d");
      bc.clearRect(0, 0, this.bar.width, this.bar.height);
      for (let i = 0; i < 256; i++) { bc.fillStyle = rgb(RAMP[i]); bc.fillRect(10 + i, 2, 1, 12); }
      bc.fillStyle = "#333"; bc.font = "10px sans-serif"; bc.textBaseline = "top"; bc.textAlign = "center";
      const at = [0, 0.25, 0.5, 0.75, 1];
      this.barNumbers = at.map(f => lo + (hi - lo) * f);
      this.barNumbers.forEach((v, i) => bc.fillText(fmt(v), 10 + 255 * at[i], 18));
      this.table.textContent = "";
      const hr = el("tr", {}, this.table);
      el("th", {}, hr, "layer " + this.l + ", head " + this.h);
      for (const label of d.labels) el("th", {}, hr, label);
      for (const name in d.metrics) {
        const tr = el("tr", name === this.metric ? { class: "sl-current" } : {}, this.table);
        el("td", { title: d.metrics[name].what }, tr, name);
        for (const run of d.metrics[name].runs) el("td", {}, tr, run ? fmt(run[this.l][this.h]) : "—");
      }
    }
  }

  function start() {
    window.sinklensCorpus = Array.from(document.querySelectorAll(".sl-lh")).map(p => new LayerHeadPanel(p));
    const units = document.getElementById("sl-units");
    if (units) {
      const show = () => document.querySelectorAll("[data-units]").forEach(
        s => { s.style.display = s.getAttribute("data-units") === units.value ? "" : "none"; });
      units.addEventListener("change", () => { show(); window.sinklensCorpus.forEach(p => p.draw()); });
      show();
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
