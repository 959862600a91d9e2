  // shared by viewer.js and corpus.js (sinklens/report/common.js, inlined where each has the marker)
  function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
  function fmt(v) {                   // 3 significant digits; integers as they are; no number: "—"
    if (typeof v !== "number") return v === null || v === undefined ? "—" : String(v);
    if (!isFinite(v)) return "—";
    if (Number.isInteger(v)) return String(v);
    return String(Number(v.toPrecision(3)));
  }
  function el(tag, attrs, parent, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
