"""One self-contained interactive HTML page for one or several traces (no network, no CDN).

Layout of the embedded data (per trace k):

- `<script type="application/json" id="sl-head-k">`: a small header — shape, units, step numbers,
  tokens (T, S) int32, mask states, vocab strings, the largest Eq. 3 sink per (step, layer, head)
  and per (step, layer) for the mean over heads, the exact sink lists (offset-indexed), the
  summary, stored attention maps (quantised), quantisation parameters;
- `<script type="application/octet-stream" id="sl-k-t">`, one per stored step t: the base64 of L
  fixed-size chunks, one per layer, each `(H + 1) × S` uint8 — every head's scores followed by the
  mean over heads. The page decodes a chunk only when the slider / pickers ask for it and keeps
  the last `CACHE_CHUNKS` decoded chunks (LRU), so opening the page parses only the header.

Quantisation (size/precision trade-off, see docs/analysis.md): scores are stored as
`q = round(255 · ln(1 + x/x0) / ln(1 + xmax/x0))` with xmax = the trace's largest score and
x0 = xmax · 1e-4. One byte per value; values above x0 come back within ±1.8 % (relative), values
below x0 within ±x0·0.02 (absolute). Sinks are never derived from these bytes: they are the exact
Eq. 3 results computed in Python.

Size cap: the per-head bytes of a trace are T·L·(H+1)·S (×4/3 for base64): 512 steps × 32 layers ×
33 × 600 tokens ≈ 324 MB raw, ≈ 432 MB in the page. `max_mb` (default 150) caps the page: the
mean-over-heads bytes (T·L·S) are always kept, and the per-head bytes are kept for every k-th step
(k the smallest stride that fits); the page then shows per-head data of the nearest stored step
and says so. `max_mb=None` stores everything; `layers=[...]` keeps per-head data for chosen layers only.
"""
from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path

import numpy as np

from sinklens.analysis.analyze import Analysis
from sinklens.analysis.blocks import block_dynamics, blocks, edited_sinks
from sinklens.analysis.sinks import near_threshold
from sinklens.report.options import PageOptions

HERE = Path(__file__).parent
LOG_RANGE = 1e4          # xmax / x0
MAX_MAPS = 32            # attention maps embedded per trace (each S_q × S_k bytes)


def quantise(x: np.ndarray, xmax: float) -> np.ndarray:
    """Log-scale uint8 (rule in the module docstring); NaN / negative -> 0."""
    x0 = xmax / LOG_RANGE
    x = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0).clip(0, xmax)
    return np.round(255 * np.log1p(x / x0) / math.log1p(LOG_RANGE)).astype(np.uint8)


def script(name: str) -> str:
    """A page script with the helpers both pages share (common.js) inlined at its marker."""
    common = (HERE / "common.js").read_text(encoding="utf-8")
    return (HERE / name).read_text(encoding="utf-8").replace("/*__SL_COMMON__*/", common)


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _chunk_bytes(H: int, S: int) -> int:
    n = (H + 1) * S
    return n + (-n) % 3    # multiple of 3: every chunk is a whole number of base64 quads


def plan_steps(a: Analysis, opts: PageOptions) -> tuple[list[int], int]:
    """Step indices whose per-head bytes go in the page, and the stride used."""
    T, L, H, S = a.num_steps, a.num_layers, a.num_heads, a.tokens.shape[1]
    n_layers = len(opts.layers) if opts.layers is not None else L
    per_step = n_layers * _chunk_bytes(H, S) * 4 / 3
    if opts.max_mb is None:
        return list(range(T)), 1
    budget = opts.max_mb * 1e6 - T * L * S * 4 / 3 - 4e6   # mean-over-heads always, plus header slack
    stride = max(1, math.ceil(T * per_step / max(budget, per_step)))
    return list(range(0, T, stride)), stride


def _sink_index(a: Analysis) -> dict:
    """Exact Eq. 3 sinks, offset-indexed by (step, layer, head): positions[off[k]:off[k+1]]."""
    s = a.sinks
    T, L, H = a.num_steps, a.num_layers, a.num_heads
    key = (s["step"].astype(np.int64) * L + s["layer"]) * H + s["head"]
    order = np.lexsort((s["pos"], key)) if key.size else np.zeros(0, np.int64)
    off = np.zeros(T * L * H + 1, np.int32)
    np.add.at(off, key[order] + 1, 1) if key.size else None
    # float16 traces: the sinks whose verdict the storage's rounding could flip, one byte each
    near = (near_threshold(s["score"], s["margin"], a.config.sink_eps) if a.near_threshold is not None
            else np.zeros(key.size, bool))
    return {"off": _b64(np.cumsum(off).astype(np.int32)), "pos": _b64(s["pos"][order].astype(np.int32)),
            "near": _b64(near[order].astype(np.uint8))}


def _header(a: Analysis, steps_with_heads: list[int], stride: int, layers, xmax: float, figures: dict) -> dict:
    T, L, H, S = a.num_steps, a.num_layers, a.num_heads, a.tokens.shape[1]
    ids = np.unique(a.tokens[a.tokens >= 0])
    summary = a.to_dict()
    maps = []
    for t, l, h in a.source.map_slices()[:MAX_MAPS]:
        m = a.source.map(t, l, h)
        maps.append({"t": t, "l": l, "h": h, "sq": int(m.shape[0]), "sk": int(m.shape[1]),
                     "max": float(m.max()), "data": _b64(quantise(m, float(m.max()) or 1.0))})
    mean_pos = a.mean_head["largest_pos"]
    b, dyn, ed = blocks(a.source.layout), block_dynamics(a), edited_sinks(a)
    return {
        "label": a.source.label, "units": a.units, "units_label": a.units_short, "sink_eps": a.config.sink_eps,
        "causal": a.source.causal, "mask_id": a.source.mask_id, "T": T, "L": L, "H": H, "S": S,
        "step_numbers": list(map(int, a.step_numbers)), "seq_len": a.seq_len.tolist(),
        "xmax": xmax, "log_range": LOG_RANGE, "chunk_bytes": _chunk_bytes(H, S),
        # query rows summed at the step of the largest score: at a one-row step every units view agrees
        "xmax_rows": int(a.n_queries[int(np.nanargmax(np.nanmax(a.top_score, axis=(1, 2))))]) if a.top_score.size else 0,
        "head_steps": steps_with_heads, "head_stride": stride,
        "head_layers": list(range(L)) if layers is None else list(layers),
        "tokens": _b64(a.tokens.astype(np.int32)), "masked": _b64(a.is_masked.astype(np.uint8)),
        "vocab": {str(int(i)): s for i, s in zip(ids, a.source.decode(ids.tolist()))} if ids.size else {},
        "largest": _b64(a.largest_pos.astype(np.int16)), "largest_mean": _b64(mean_pos.astype(np.int16)),
        "sinks": _sink_index(a), "maps": maps, "figures": figures,
        "strongest": list(a.strongest_sink_head()), "has_sinks": bool((a.largest_pos >= 0).any()),
        "prompt_length": a.source.prompt_length,
        # block diffusion: where blocks start and what carries over; editing: which tokens were rewritten
        "blocks": None if b is None else {"starts": b.starts(S), "size": b.size, "attention": b.causal_attention,
                                          "dynamics": dyn.to_dict()},
        "edited": None if ed is None else {"at": _b64(ed.edited_at.astype(np.uint8)), "positions": ed.positions,
                                           "on_edited": ed.on_edited.tolist()},
        "summary": {k: summary[k] for k in ("units", "units_meaning", "notes", "sink_eps", "sink_rule", "causal", "shape",
                                            "sinks_total", "fraction_heads_steps_with_sink", "track_kinds",
                                            "head_classes", "drift")}
                   | {"rows": a.summary_rows(), "splits": summary["masked_unmasked_splits"]["count"],
                      "sink_token_categories": (summary["sink_tokens"] or {}).get("categories")},
    }


def _step_chunks(a: Analysis, t: int, layers, xmax: float) -> str:
    """Base64 of the step's L chunks: per layer (H + 1, S) uint8 (heads, then mean over heads)."""
    L, H, S = a.num_layers, a.num_heads, a.tokens.shape[1]
    cb = _chunk_bytes(H, S)
    sc = a.step_scores(t)                                                 # (L, H, S_t)
    out = np.zeros((L, cb), np.uint8)
    full = np.zeros((L, H + 1, S), np.float32)
    full[:, :H, : sc.shape[2]] = sc
    full[:, H, : sc.shape[2]] = sc.mean(axis=1)
    q = quantise(full, xmax).reshape(L, -1)
    keep = np.ones(L, bool) if layers is None else np.isin(np.arange(L), layers)
    out[:, : q.shape[1]] = np.where(keep[:, None], q, 0)
    return _b64(out)


def _mean_chunks(a: Analysis, xmax: float, skip: set[int]) -> str:
    """Mean over heads for the steps without per-head bytes: (T', L, S3) uint8 in step order over the
    steps not in `skip`; S3 = S rounded up to a multiple of 3, so every (step, layer) row is a whole
    number of base64 quads the page can cut out without decoding the rest."""
    S = a.tokens.shape[1]
    S3 = S + (-S) % 3
    parts = []
    for t in range(a.num_steps):
        if t in skip:
            continue
        m = quantise(a.step_scores(t).mean(axis=1), xmax)                  # (L, S_t)
        parts.append(np.pad(m, ((0, 0), (0, S3 - m.shape[1]))))
    return _b64(np.stack(parts)) if parts else ""


def _groups(analyses) -> list[list[Analysis]]:
    """[[a], [b, b_uniform_ratio], ...]: one group (one page column) per trace, its alternative
    unit views inside it. A flat list of analyses gives one group each."""
    return [list(g) if isinstance(g, (list, tuple)) else [g] for g in analyses]


def colormap() -> list[list[int]]:
    """The figures' colormap (magma, Fig. 1 / Fig. 4) as 256 RGB triplets for the page."""
    import matplotlib

    rgba = matplotlib.colormaps["magma"](np.linspace(0.0, 1.0, 256))
    return np.round(rgba[:, :3] * 255).astype(int).tolist()


def render_page(analyses, out: str | Path, opts: PageOptions | None = None, figures: list[dict] | None = None) -> Path:
    """Write the standalone page. `analyses`: one item per trace — an Analysis, or a list of
    Analyses of the same trace in different units (the page shows one column per trace with a
    units toggle); `figures[k]` = {name: png bytes} embedded as data URIs for trace k.
    Written piece by piece, so peak memory holds one step's bytes, not the whole page."""
    opts = opts or PageOptions()
    out = Path(out)
    _check(analyses, opts)
    css = (HERE / "viewer.css").read_text(encoding="utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(opts.title)}</title><link rel="icon" href="data:,"><style>{css}</style></head>
<body style="margin:0; background:#fafafa">
""")
        write_fragment(f, analyses, opts, figures)
        f.write("</body></html>\n")
    return out


def _check(analyses, opts: PageOptions) -> None:
    for group in _groups(analyses):          # bad options fail before anything is written
        for a in group:
            for l in opts.layers or []:
                a.source.check_layer_head(l, None)
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", opts.element_prefix):
        raise ValueError(f"element_prefix must be letters, digits, '_' or '-' (starting with a letter), "
                         f"got {opts.element_prefix!r}")


def write_fragment(f, analyses, opts: PageOptions, figures: list[dict] | None = None, css: str | None = None) -> None:
    """The page body (viewers, data, script) into the text stream `f`. Every element id starts with
    `opts.element_prefix`, so several fragments can share one document (a notebook)."""
    _check(analyses, opts)
    P = opts.element_prefix
    groups = _groups(analyses)
    js = script("viewer.js").replace("__SL_PREFIX__", P)
    if css is not None:
        f.write(f"<style>{css}</style>\n")
    f.write(f"""<div class="sl-page" id="{P}-page"><header><h1>{html.escape(opts.title)}</h1>
<p class="note">Self-contained (no network). Scores are in the units named on each panel; sinks are the
exact paper Eq. 3 results (score − mean of the other tokens ≥ ε); colours come from 8-bit log-quantised
scores (±1.8 % relative). <label><input type="checkbox" id="{P}-link" checked> link steps across traces</label></p>
</header>
<main class="sl-viewers" id="{P}-viewers" style="--n:{len(groups)}"></main>
<script type="application/json" id="{P}-cmap">{json.dumps(colormap(), separators=(",", ":"))}</script>
""")
    k = 0
    for g, group in enumerate(groups):
        for i, a in enumerate(group):
            xmax = float(np.nanmax(a.top_score)) if a.top_score.size else 1.0
            xmax = xmax if xmax > 0 else 1.0
            steps, stride = plan_steps(a, opts)
            pngs = ((figures or [{}] * len(groups))[g] or {}) if i == 0 else {}   # figures go with the first view
            figs = {name: "data:image/png;base64," + base64.b64encode(png).decode("ascii") for name, png in pngs.items()}
            head = _header(a, steps, stride, opts.layers, xmax, figs) | {"group": g, "alt": i}
            # "<" only occurs inside JSON strings: escaping it keeps "</script>" / "<!--" in token text harmless
            head_json = json.dumps(head, separators=(",", ":")).replace("<", "\\u003c")
            f.write(f'<script type="application/json" id="{P}-head-{k}">{head_json}</script>\n')
            walk = steps
            if opts.progress:
                from tqdm.auto import tqdm

                walk = tqdm(steps, desc=f"page {a.source.label}", unit="step")
            for t in walk:
                f.write(f'<script type="application/octet-stream" id="{P}-{k}-{t}">'
                        f'{_step_chunks(a, t, opts.layers, xmax)}</script>\n')
            f.write(f'<script type="application/octet-stream" id="{P}-{k}-mean">{_mean_chunks(a, xmax, set(steps))}'
                    f'</script>\n')
            k += 1
    f.write(f"<script>{js}</script></div>\n")
