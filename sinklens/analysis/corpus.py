"""Corpus runs: one trace's analysis reduced to numbers that add over prompts, and the corpus file.

A corpus run (`sinklens trace --prompts FILE.jsonl`, sinklens/eval/corpus.py) analyses each
prompt's run like a trace and keeps only its `part`: every accumulator's `corpus()` (sinklens/
analysis/accumulate.py) plus the dynamics counts, per (layer, head) — O(L·H + bins) numbers per
prompt, whatever the number of steps or tokens. Every number in a part is a count or a sum, so
the corpus total is their sum and a rate is a total over a total (`Corpus.to_dict()`).

The corpus file is JSON Lines: a header line (`{"sinklens_corpus": 1, ...}`: model, sampler
settings, units, ε, the bin edges and ε grid, what was skipped), then one line per prompt in
prompt order (`{"index", "id", "line", "steps", "parts": {units: part}}`). Totals are summed in
prompt order when the file is read, so a file written by N processes reads exactly like one
written by one.

    from sinklens.analysis.corpus import open_corpus
    c = open_corpus("corpus.jsonl")
    c.layer_head()["sink_rate"]          # (L, H) fraction of (prompt, step) pairs with an Eq. 3 sink
    c.to_dict()                          # every total and rate, with units
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from sinklens.analysis.accumulate import padded_sum
from sinklens.analysis.dynamics import MOVE_KEYS, TRACK_KINDS, largest_sink_moves
from sinklens.rule.spec import UNITS

FORMAT = 1                                   # the header's "sinklens_corpus" value


# The parts the corpus view and report read by name; every other part is an accumulator's own
# (a readout's, or a new analysis'): summary.json's "other", and a section each in the report.
CORE_PARTS = ("steps", "top_key", "sinks", "mean_head", "score_distribution", "margin_distribution", "eps_sweep",
              "splits", "sink_tokens", "dynamics", "per_trace_only")


class CorpusFormatError(ValueError):
    """A file that is not a corpus file, or a corpus file this version cannot read."""


def prompt_part(a) -> dict:
    """One analysed prompt (an `Analysis`) reduced to counts and sums (module docstring)."""
    part: dict = {}
    for acc in a.accumulators:
        join_part(part, acc, acc.corpus(a.num_steps), bool(acc.not_streamed) and acc.has_result())
    part["dynamics"] = dynamics_part(a)
    return part


def join_part(part: dict, acc, corpus_part: dict, left_out: bool) -> None:
    """Add one analysis' corpus part to a prompt's part; left_out: the prompt had something of it
    that the part leaves out (its `not_streamed`), counted under per_trace_only."""
    part.update(corpus_part)
    if left_out:          # what this prompt had that its part leaves out: prompts counted, the reason kept once
        part.setdefault("per_trace_only", {})[acc.name] = {"prompts": 1, "what": acc.not_streamed}


def dynamics_part(a) -> dict:
    """Per (layer, head): sink tracks by kind, births, deaths and the largest sink's moves;
    head classes counted over heads."""
    L, H = a.num_layers, a.num_heads
    out = {f"tracks_{k}": np.zeros((L, H), np.int64) for k in TRACK_KINDS}
    out.update({k: np.zeros((L, H), np.int64) for k in ("births", "deaths", *(f"largest_{m}" for m in MOVE_KEYS))})
    for tr in a.tracks:
        out[f"tracks_{tr.kind}"][tr.layer, tr.head] += 1
        out["births"][tr.layer, tr.head] += tr.start > 0
        out["deaths"][tr.layer, tr.head] += tr.end < a.num_steps - 1
    moved, swapped = a.largest_changes()                                           # (T − 1, L, H)
    for l in range(L):
        for h in range(H):
            ev = largest_sink_moves(a.largest_pos[:, l, h], moved[:, l, h], swapped[:, l, h])
            for m in MOVE_KEYS:
                out[f"largest_{m}"][l, h] = ev[m]
    out["head_classes"] = {}
    for h in a.head_summaries():
        out["head_classes"][h["class"]] = out["head_classes"].get(h["class"], 0) + 1
    return out


def to_json(x):
    """Numpy arrays and scalars as JSON lists and numbers (exact: floats keep every digit)."""
    if isinstance(x, dict):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.integer, np.bool_)):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return x


def add(total, part):
    """total + part, recursively: dicts by key, lists and numbers elementwise, strings keep the first.
    Arrays whose length is the prompt's (a distance profile) are zero-padded to the longer one: a part
    holds sums, and a prompt has nothing beyond its own length."""
    if total is None:
        return _as_arrays(part)
    if isinstance(part, dict):
        out = dict(total)
        for k, v in part.items():
            out[k] = add(out.get(k), v)
        return out
    if isinstance(part, str) or part is None:
        return total
    return padded_sum(total, _as_arrays(part))


def _as_arrays(x):
    if isinstance(x, dict):
        return {k: _as_arrays(v) for k, v in x.items()}
    if isinstance(x, list):
        return np.asarray(x)
    return x


@dataclass
class Corpus:
    """A corpus file read back: its header, one small record per prompt, and the totals."""

    path: str
    meta: dict                                   # the header line
    records: list[dict]                          # per prompt: index, id, line, steps, ... (parts dropped)
    totals: dict = field(default_factory=dict)   # units -> summed parts

    @property
    def units(self) -> str:
        return self.meta["units"]

    @property
    def num_prompts(self) -> int:
        return len(self.records)

    def layer_head(self, units: str | None = None) -> dict[str, np.ndarray]:
        """(L, H) rates over every (prompt, step): sink_rate (share of pairs with an Eq. 3 sink),
        sinks_per_step, largest_sink_score_mean (over the pairs with a sink; NaN: never), top_score_mean."""
        t = self.totals[units or self.units]
        steps = max(int(t["steps"]["steps"]), 1)
        s = t["sinks"]
        with np.errstate(invalid="ignore", divide="ignore"):
            largest = np.where(s["steps_with_sink"] > 0, s["largest_score_sum"] / s["steps_with_sink"], np.nan)
        return {"sink_rate": s["steps_with_sink"] / steps, "sinks_per_step": s["sink_count"] / steps,
                "largest_sink_score_mean": largest, "top_score_mean": t["top_key"]["score_sum"] / steps}

    def to_dict(self) -> dict:
        """Every total and rate, with units (summary.json of `sinklens report CORPUS`)."""
        out = {"corpus": self.path, "num_prompts": self.num_prompts,
               **{k: self.meta.get(k) for k in ("model", "family", "sampler", "settings", "causal", "num_layers",
                                                "num_heads", "sink_eps", "prompts_file", "kept_traces")},
               "skipped": self.meta.get("skipped", []), "views": {}}
        for units, t in self.totals.items():
            out["views"][units] = self._view(units, t)
        return out

    def _view(self, units: str, t: dict) -> dict:
        lh = self.layer_head(units)
        st = t["steps"]
        sweep, toks, dyn = t["eps_sweep"], t["sink_tokens"], t["dynamics"]
        total_sinks = int(sum(toks["category_counts"].values()))
        order = sorted(toks["token_counts"], key=lambda k: (-int(toks["token_counts"][k]), int(k)))
        extra = {k: _mean_of(v) for k, v in t.items() if k not in CORE_PARTS}
        return {
            "units": units, "units_meaning": UNITS[units].meaning if units in UNITS else None,
            "prompts": int(st["prompts"]), "steps": int(st["steps"]),
            "fraction_heads_steps_with_sink": float(t["sinks"]["steps_with_sink"].sum()
                                                    / max(int(st["steps"]) * lh["sink_rate"].size, 1)),
            "sinks_total": int(t["sinks"]["sink_count"].sum()),
            "layer_head": {k: _rounded(v) for k, v in lh.items()},
            "mean_head_sink_rate_per_layer": _rounded(t["mean_head"]["steps_with_sink"] / max(int(st["steps"]), 1)),
            "eps_sweep": {"eps": list(self.meta["eps_values"]), "keys": int(sweep["keys"]),
                          "fraction_flagged": _rounded(sweep["flagged"] / max(int(sweep["keys"]), 1), 6)},
            "score_distribution": {"bin_edges": list(self.meta["hist_edges"]),
                                   "counts": t["score_distribution"]["counts"].tolist()},
            "margin_distribution": {"bin_edges": list(self.meta["hist_edges"]),
                                    "counts": t["margin_distribution"]["counts"].tolist()},
            "sink_tokens": {"units": "fraction of all Eq. 3 sink occurrences (prompt, step, layer, head, position)",
                            "total_sink_occurrences": total_sinks,
                            "categories": {c: {"count": int(n), "fraction": int(n) / max(total_sinks, 1)}
                                           for c, n in toks["category_counts"].items()},
                            "tokens": [{"token": toks["token_strings"][k], "token_id": int(k),
                                        "category": toks["token_categories"][k], "count": int(toks["token_counts"][k]),
                                        "fraction": int(toks["token_counts"][k]) / max(total_sinks, 1)}
                                       for k in order[:50]]},
            "dynamics": {"track_kinds": {k: int(dyn[f"tracks_{k}"].sum()) for k in TRACK_KINDS},
                         "head_classes": {k: int(v) for k, v in dyn["head_classes"].items()},
                         **{f"largest_{m}": int(dyn[f"largest_{m}"].sum()) for m in MOVE_KEYS},
                         "births": int(dyn["births"].sum()), "deaths": int(dyn["deaths"].sum()),
                         "per_layer_head": {k: v.tolist() for k, v in dyn.items() if isinstance(v, np.ndarray)}},
            "masked_unmasked_split_steps": int(t["splits"]["steps"].sum()),
            "other": extra,
            "per_trace_only": {k: {"prompts": int(v["prompts"]), "what": v["what"]}
                               for k, v in t.get("per_trace_only", {}).items()},
        }


def _mean_of(x):
    """An accumulator's default corpus part ({"sum", "n"}) as its mean; anything else as JSON."""
    if isinstance(x, dict) and set(x) == {"sum", "n"}:
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"mean": _rounded(np.where(x["n"] > 0, x["sum"] / np.maximum(x["n"], 1), np.nan))}
    if isinstance(x, dict):
        return {k: _mean_of(v) for k, v in x.items()}
    return to_json(x)


def _rounded(x, nd: int = 4):
    x = np.asarray(x, dtype=float)
    if x.ndim == 0:
        return None if not np.isfinite(x) else round(float(x), nd)
    return [_rounded(v, nd) for v in x]


def is_corpus_file(path) -> bool:
    """True when the file's first line is a corpus header (cheap: reads one line)."""
    try:
        with open(path, "rb") as f:
            head = json.loads(f.readline() or b"null")
    except (OSError, ValueError):
        return False
    return isinstance(head, dict) and "sinklens_corpus" in head


def open_corpus(path) -> Corpus:
    """Read a corpus file; the totals are summed in prompt order."""
    records, totals = [], {}
    with open(path, encoding="utf-8") as f:             # line by line: the parts are summed, never all kept
        try:
            meta = json.loads(f.readline() or "null")
        except ValueError:
            meta = None
        if not isinstance(meta, dict) or "sinklens_corpus" not in meta:
            raise CorpusFormatError(f"{path} is not a sinklens corpus file (its first line is no corpus header; "
                                    "write one with `sinklens trace --prompts FILE.jsonl --out DIR`)")
        if meta["sinklens_corpus"] != FORMAT:
            raise CorpusFormatError(f"{path}: corpus format {meta['sinklens_corpus']}, this sinklens reads {FORMAT}")
        for n, line in enumerate(f, start=2):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                parts = rec.pop("parts")
            except (ValueError, KeyError, AttributeError) as e:
                raise CorpusFormatError(f"{path}:{n}: not a corpus prompt line ({e})") from None
            for units, part in parts.items():
                totals[units] = add(totals.get(units), part)
            records.append(rec)
    if not records:
        raise CorpusFormatError(f"{path} holds no prompt: nothing to report")
    return Corpus(path=str(path), meta=meta, records=records, totals=totals)
