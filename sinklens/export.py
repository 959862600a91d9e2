"""Stored attention maps of a trace as inputs for bertviz and circuitsvis.

A trace keeps full maps only for the (step, layer, head) slices asked for when sampling
(`capture=CaptureSpec(maps=...)`, `sinklens trace --maps`); this module hands those slices to the
two viewers people already use:

    from sinklens import export
    from bertviz import head_view
    head_view(**export.head_view_inputs("run.arrow", step=3))             # layers/heads stored at step 3
    import circuitsvis as cv
    cv.attention.attention_patterns(**export.attention_patterns_inputs("run.arrow", step=3, layer=1))
    export.write("run.arrow", "out/", steps=[0, 3])                       # JSON (+ HTML when installed)

`step` is a step *index* (0 .. num_steps−1, as in `sinklens.analyze`), not the sampler's step number.
Maps are square (S, S) with one row per query position. An ARM decoding step stores the newest
token's row only; its other rows are zero, so a viewer shows what that step computed and nothing
invented. Heads that were not stored are zero in bertviz's per-layer tensors and left out of
circuitsvis' list; `heads` / `include_layers` name the stored ones.

For a forward pass of your own there is no export step: `m.model(ids, output_attentions=True)`
returns the maps, exactly as transformers' eager attention (sinklens.attention.weights).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sinklens.analysis.source import AnalysisInputError, Source, as_source


@dataclass
class StepMaps:
    """The stored maps of one step: square (S, S) per (layer, head), and the tokens on both axes."""

    step_index: int
    step: int                                     # the sampler's step number
    tokens: list[str]                             # (S,) decoded token strings
    maps: dict[tuple[int, int], np.ndarray]       # (layer, head) -> (S, S) float32, rows = queries

    @property
    def names(self) -> list[str]:
        return [f"L{l}H{h}" for l, h in self.maps]


def step_maps(trace, step: int, layer_heads=None, *, row: int = 0) -> StepMaps:
    """The stored maps of step index `step` (all stored slices, or the chosen (layer, head) pairs)."""
    src = as_source(trace, row=row)
    src.check_index(step)
    stored = [(l, h) for t, l, h in src.map_slices() if t == step]
    if not src.map_slices():
        raise AnalysisInputError(src.no_maps_message())
    if layer_heads is None:
        if not stored:
            have = sorted({t for t, _, _ in src.map_slices()})
            raise AnalysisInputError(f"step: no maps stored at step index {step}; steps with maps: {have[:20]}")
        layer_heads = stored
    d = src.step_data(step)
    s = d.tokens.shape[0]
    maps = {}
    for l, h in layer_heads:
        src.check_layer_head(int(l), int(h))
        if (int(l), int(h)) not in stored:
            raise AnalysisInputError(src.missing_map_message(step, int(l), int(h)))
        maps[(int(l), int(h))] = _square(src.map(step, int(l), int(h)), d.query_positions, s)
    return StepMaps(step, int(d.step), _tokens(src, d.tokens), maps)


def _square(m: np.ndarray, query_positions: np.ndarray, s: int) -> np.ndarray:
    """(S_q, S_k) map -> (S, S): each stored row at its query position, other rows zero."""
    m = np.asarray(m, np.float32)
    if m.shape == (s, s):
        return m
    rows = query_positions if len(query_positions) == m.shape[0] else np.arange(s - m.shape[0], s)
    out = np.zeros((s, s), np.float32)
    out[rows, : m.shape[1]] = m
    return out


def _tokens(src: Source, ids: np.ndarray) -> list[str]:
    ids = [int(i) for i in ids]
    try:
        return [str(t) for t in src.decode(ids)]
    except Exception:                 # a trace without a vocabulary: show the ids
        return [str(i) for i in ids]


def head_view_inputs(trace, step: int, layer_heads=None, *, row: int = 0) -> dict:
    """Keyword arguments for `bertviz.head_view`: attention (L tensors (1, H, S, S)), tokens,
    include_layers (layers with a stored head) and heads (the stored heads, initially selected)."""
    import torch

    sm = step_maps(trace, step, layer_heads, row=row)
    src = as_source(trace, row=row)
    s = len(sm.tokens)
    att = [torch.zeros(1, src.num_heads, s, s) for _ in range(src.num_layers)]
    for (l, h), m in sm.maps.items():
        att[l][0, h] = torch.from_numpy(m)
    return {"attention": tuple(att), "tokens": sm.tokens,
            "include_layers": sorted({l for l, _ in sm.maps}), "heads": sorted({h for _, h in sm.maps})}


def attention_patterns_inputs(trace, step: int, layer: int | None = None, heads=None, *, row: int = 0) -> dict:
    """Keyword arguments for `circuitsvis.attention.attention_patterns`: tokens and attention
    (N, S, S) — the stored heads of `layer` (or every stored slice of the step when layer is None),
    in the order of `step_maps(...).names` (pass those as `attention_head_names` to `attention_heads`)."""
    lh = None
    if layer is not None:
        src = as_source(trace, row=row)
        src.check_layer_head(layer, None)
        stored = [h for t, l, h in src.map_slices() if t == step and l == layer]
        lh = [(layer, h) for h in (stored if heads is None else heads)]
        if not lh:
            raise AnalysisInputError(f"layer: no maps stored for layer {layer} at step index {step}")
    sm = step_maps(trace, step, lh, row=row)
    return {"tokens": sm.tokens, "attention": np.stack(list(sm.maps.values()))}


VIEWERS = {"bertviz": "bertviz", "circuitsvis": "circuitsvis"}   # PyPI name -> module


def write(trace, out: str | os.PathLike, steps=None, layer_heads=None, *, row: int = 0) -> list[Path]:
    """For each step index (default: every step with stored maps) write `step{t}_attention.json`
    ({tokens, head_names, attention (N, S, S)} — the inputs of both viewers) and, when the packages
    are installed, `step{t}_head_view.html` (bertviz) and `step{t}_attention_patterns.html`
    (circuitsvis, its JavaScript inlined: works offline); a missing package is named in one line
    on stderr with how to install it. Returns the written paths."""
    src = as_source(trace, row=row)
    if not src.map_slices():
        raise AnalysisInputError(src.no_maps_message())
    steps = sorted({t for t, _, _ in src.map_slices()}) if steps is None else [int(t) for t in steps]
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AnalysisInputError(f"out: {out} is a file; expected a folder")
    out.mkdir(parents=True, exist_ok=True)
    missing = [name for name, module in VIEWERS.items() if importlib.util.find_spec(module) is None]
    if missing:   # one line, not an error: the JSON is written either way
        print(f"sinklens.export: {' and '.join(missing)} not installed, so only the step*_attention.json files "
              f"are written (pip install {' '.join(missing)}, or pip install 'sinklens[viewers]')", file=sys.stderr)
    written = []
    for t in steps:
        sm = step_maps(src, t, layer_heads, row=row)
        doc = {"step_index": t, "step": sm.step, "tokens": sm.tokens, "head_names": sm.names,
               "attention": [np.round(m, 6).tolist() for m in sm.maps.values()]}
        p = out / f"step{t}_attention.json"
        p.write_text(json.dumps(doc), encoding="utf-8")
        written.append(p)
        written += _viewer_html(src, sm, out / f"step{t}")
    return written


def _viewer_html(src: Source, sm: StepMaps, stem: Path) -> list[Path]:
    written = []
    try:
        from bertviz import head_view
    except ImportError:
        head_view = None
    if head_view is not None:
        page = head_view(**head_view_inputs(src, sm.step_index, list(sm.maps)),
                         html_action="return")
        p = stem.with_name(stem.name + "_head_view.html")
        p.write_text(page.data, encoding="utf-8")
        written.append(p)
    try:
        from circuitsvis.attention import attention_heads
    except ImportError:
        return written
    page = attention_heads(attention=np.stack(list(sm.maps.values())), tokens=sm.tokens, attention_head_names=sm.names)
    p = stem.with_name(stem.name + "_attention_patterns.html")
    p.write_text(page.local_src, encoding="utf-8")
    written.append(p)
    return written
