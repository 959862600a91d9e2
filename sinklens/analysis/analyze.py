"""One pass over a trace (step by step) that computes everything the figures and reports need.

Each analysis is an accumulator (sinklens/analysis/accumulate.py: `add(step)`, `result()`,
`to_dict()`) in `ACCUMULATORS`; `analyze()` computes each step's scores and Eq. 3 margins once
and hands the step to every one of them. Tracks and drift are derived from the sinks afterwards.

    from sinklens.analysis import analyze
    a = analyze("run.arrow")                     # or a Trace, or an ArraySource
    a.largest_pos[:, layer, head]                # Fig. 7 series (−1 = no sink)
    a.tracks, a.drift, a.splits, a.token_table   # dynamics, Table 2
    a.to_dict()                                  # every number, with units

Memory: per step only that step's (L, H, S) scores are alive; kept are (T, L, H) summaries, the
sparse list of sinks (a few per head and step) and (T, S) tokens / mask states.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from sinklens.analysis.absorption import Absorption
from sinklens.analysis.accumulate import Accumulator, Step, rounded
from sinklens.analysis.commits import CommitConfidence
from sinklens.analysis.k_sigma import KSigma
from sinklens.analysis.readouts import READOUT_ACCUMULATORS
from sinklens.analysis.learned_sink import LearnedSink, learned_sink_line
from sinklens.analysis.dynamics import (DriftEvent, SinkTrack, SplitEvent, drift_events, drift_line, drift_summary,
                                        head_class, largest_sink_changes, largest_sink_moves, track_sinks)
from sinklens.analysis.sinks import EpsSweep, EpsSweepAccumulator
from sinklens.analysis.source import Source, as_source
from sinklens.analysis.step_stats import (HIST_EDGES, QUANTILES, Eq3Sinks, MarginDistribution, NearThreshold,  # noqa: F401
                                          MeanOverHeads, ScoreDistribution, SinkTokens, Splits, StepArrays, TopKey)
from sinklens.analysis.tokens import SinkTokenTable
from sinklens.rule import np_rule
from sinklens.rule.spec import BASELINE_UNITS, DEFAULT_EPS, DEFAULT_UNITS, UNITS, check_units

DEFAULT_EPS_VALUES = np.round(np.arange(0.0, 10.01, 0.25), 2)

# Every per-step analysis, in the order they see each step. A new one: a file + an entry here.
ACCUMULATORS: list[type[Accumulator]] = [StepArrays, TopKey, Eq3Sinks, MeanOverHeads, ScoreDistribution,
                                         MarginDistribution, NearThreshold, EpsSweepAccumulator, Splits, SinkTokens,
                                         LearnedSink, KSigma, Absorption, CommitConfidence, *READOUT_ACCUMULATORS]


@dataclass
class AnalysisConfig:
    units: str = DEFAULT_UNITS      # see sinklens/rule/spec.py UNITS
    sink_eps: float = DEFAULT_EPS   # Eq. 3 threshold ε, in `units`
    eps_values: tuple = tuple(DEFAULT_EPS_VALUES)  # ε sweep grid (Fig. 10)
    static_fraction: float = 0.5    # track classification (dynamics.py)
    max_move: int | None = None     # tracks: longest jump still linked as a move (None: any)
    progress: bool = False


@dataclass
class Analysis:
    source: Source
    config: AnalysisConfig
    step_numbers: list[int]
    seq_len: np.ndarray             # (T,) positions per step (padding included)
    n_real: np.ndarray              # (T,) real keys per step
    n_queries: np.ndarray           # (T,) query rows summed per step
    tokens: np.ndarray              # (T, S_max) int, −1 beyond the step's length
    is_masked: np.ndarray           # (T, S_max) bool
    key_mask: np.ndarray            # (T, S_max) bool
    edited: np.ndarray | None       # (T, S_max) bool tokens rewritten at each step (LLaDA2.1's editing); None: never
    top_pos: np.ndarray             # (T, L, H) argmax key (sink or not)
    top_score: np.ndarray           # (T, L, H) its score
    largest_pos: np.ndarray         # (T, L, H) largest Eq. 3 sink, −1 none
    largest_score: np.ndarray       # (T, L, H) its score, NaN none
    sink_count: np.ndarray          # (T, L, H) sinks per head and step
    sinks: dict[str, np.ndarray]    # sparse sinks: step, layer, head, pos, score, margin (N,)
    hist: np.ndarray                # (T, B) counts of real (layer, head, key) scores per bin
    quantiles: np.ndarray           # (T, len(QUANTILES)) score quantiles per step
    margin_hist: np.ndarray         # (T, B) Fig. 3 counts of Eq. 3 margins per bin (margins < 1e-3 in bin 0)
    margin_quantiles: np.ndarray    # (T, len(QUANTILES)) Eq. 3 margin quantiles per step
    mean_head: dict[str, np.ndarray] = field(default_factory=dict)  # mean over heads: largest_pos (T, L), ...
    eps_sweep: EpsSweep | None = None
    tracks: list[SinkTrack] = field(default_factory=list)
    drift: list[DriftEvent] = field(default_factory=list)
    splits: list[SplitEvent] = field(default_factory=list)
    token_table: SinkTokenTable | None = None
    # (T, L, H) share of the summed query rows' attention the learned sink logits took (gpt-oss;
    # sinklens/analysis/learned_sink.py), NaN at steps without it; None: the model has none
    learned_sink_share: np.ndarray | None = None
    # mechanism analyses (docs/analysis.md, "Mechanism readouts"); those of a readout are None on a trace
    # that did not record it: the k·σ rule, absorption / sink-position variance, the vectors at sinks,
    # massive activations, diagonal heads, distance profile, logit-lens rows, mask-query ranking rows
    k_sigma: object | None = None
    absorption: object | None = None
    sink_vectors: object | None = None
    massive_activations: object | None = None
    diagonal_heads: object | None = None
    distance_profile: object | None = None
    logit_lens: list | None = None
    mask_query_ranking: list | None = None
    near_threshold: object | None = None    # float16 traces: Eq. 3 cells within the storage's rounding of ε
    commit_confidence: object | None = None  # diffusion samplers: per step, mean probability of the committed tokens
    extra: dict = field(default_factory=dict)              # results of accumulators beyond the built-in ones
    accumulators: list = field(default_factory=list, repr=False)   # their to_dict() parts
    _dict: dict | None = field(default=None, repr=False)   # to_dict() cache (an Analysis is final once built)
    _changes: tuple | None = field(default=None, repr=False)   # largest_changes() cache

    # ---- shape ----------------------------------------------------------------------------
    @property
    def units(self) -> str:
        return self.config.units

    @property
    def units_short(self) -> str:
        return UNITS[self.units].label

    @property
    def num_steps(self) -> int:
        return self.top_pos.shape[0]

    @property
    def num_layers(self) -> int:
        return self.top_pos.shape[1]

    @property
    def num_heads(self) -> int:
        return self.top_pos.shape[2]

    # ---- re-reading the source ---------------------------------------------------------------
    def step_scores(self, index: int) -> np.ndarray:
        """(L, H, S) scores of step index `index` in this analysis' units (re-read from the source)."""
        d = self.source.step_data(index)
        return step_scores(d, self.units, self.source.layout.visibilities(self.num_layers))[0]

    def score_slice(self, layer: int, head: int | None = None) -> np.ndarray:
        """(T, S_max) scores of one (layer, head) over all steps — head None: mean over heads —
        NaN where a position is padding or did not exist yet at that step."""
        self.source.check_layer_head(layer, head)
        out = np.full(self.tokens.shape, np.nan, np.float32)
        for t in range(self.num_steps):
            sc = self.step_scores(t)[layer]                                  # (H, S)
            row = sc[head] if head is not None else sc.mean(axis=0)
            out[t, : row.shape[0]] = np.where(self.key_mask[t, : row.shape[0]], row, np.nan)
        return out

    # ---- per layer × head (Fig. 5) -----------------------------------------------------------
    def layer_head_stats(self) -> dict[str, np.ndarray]:
        """(L, H) arrays: mean sinks per step, mean top-1 score over steps, mean score of the
        largest sink over the steps that have one (NaN: never a sink), fraction of steps with a sink."""
        has = self.largest_pos >= 0
        n = has.sum(axis=0)                                              # (L, H)
        total = np.where(has, self.largest_score, 0.0).sum(axis=0)
        sink_mean = np.full(n.shape, np.nan)
        np.divide(total, n, out=sink_mean, where=n > 0)
        return {"sink_count_mean": self.sink_count.mean(axis=0), "top_score_mean": self.top_score.mean(axis=0),
                "largest_sink_score_mean": sink_mean, "fraction_steps_with_sink": has.mean(axis=0)}

    def head_summaries(self) -> list[dict]:
        by_head: dict[tuple[int, int], list[SinkTrack]] = {}
        for tr in self.tracks:
            by_head.setdefault((tr.layer, tr.head), []).append(tr)
        split_steps: dict[tuple[int, int], int] = {}
        for e in self.splits:
            split_steps[(e.layer, e.head)] = split_steps.get((e.layer, e.head), 0) + 1
        out = []
        moved, swapped = self.largest_changes()
        for l in range(self.num_layers):
            for h in range(self.num_heads):
                trs = by_head.get((l, h), [])
                d = {"layer": l, "head": h, "class": head_class(trs), "tracks": len(trs),
                     "births": sum(tr.start > 0 for tr in trs),
                     "deaths": sum(tr.end < self.num_steps - 1 for tr in trs),
                     "mean_lifetime_steps": float(np.mean([tr.lifetime for tr in trs])) if trs else 0.0,
                     "masked_unmasked_split_steps": split_steps.get((l, h), 0)}
                d.update({f"largest_{k}": v for k, v in largest_sink_moves(self.largest_pos[:, l, h], moved[:, l, h],
                                                                             swapped[:, l, h]).items()})
                out.append(d)
        return out

    def largest_changes(self) -> tuple[np.ndarray, np.ndarray]:
        """(moved, swapped) (T − 1, L, H): the largest sink moved to a new position, or standing
        sinks swapped rank (dynamics.largest_sink_changes)."""
        if self._changes is None:
            self._changes = largest_sink_changes(self.largest_pos, self.sinks)
        return self._changes

    def pick_heads(self, n: int = 3) -> list[tuple[int, int]]:
        """Heads worth a Fig. 7 panel: most largest-sink moves, then most steps with a sink."""
        has = (self.largest_pos >= 0)
        moves = self.largest_changes()[0].sum(axis=0)              # (L, H)
        key = moves * (self.num_steps + 1) + has.sum(axis=0)
        order = np.argsort(-key, axis=None, kind="stable")[:n]
        return [tuple(int(x) for x in np.unravel_index(i, key.shape)) for i in order if key.flat[i] > 0] or [(0, 0)]

    def strongest_sink_head(self) -> tuple[int, int]:
        """(layer, head) whose largest Eq. 3 sink scores highest, averaged over all steps (a step
        without a sink counts 0): the head a first figure or page view should show."""
        mean = np.where(self.largest_pos >= 0, np.nan_to_num(self.largest_score), 0.0).mean(axis=0)   # (L, H)
        if not (mean > 0).any():
            return 0, 0
        l, h = np.unravel_index(int(np.argmax(mean)), mean.shape)
        return int(l), int(h)

    def notes(self) -> list[str]:
        """Warnings about what the chosen units can and cannot show on this trace."""
        out, eps, u = [], self.config.sink_eps, self.units
        if self.source.truncated:
            out.append(f"the trace is truncated (the run was interrupted): {self.num_steps} finished steps analysed")
        unit = UNITS[u]
        if unit.ceiling == "queries":
            few = int((self.n_queries <= eps).sum())
            if few:
                out.append(f"{few} of {self.num_steps} steps sum ≤ ε = {eps:g} query rows (e.g. ARM decoding: the "
                           f"newest token's row only), so their scores are ≤ {eps:g} and Eq. 3 cannot fire "
                           f"there; use units {DEFAULT_UNITS} or {BASELINE_UNITS} to see sinks at those steps")
        if unit.ceiling == "one" and eps >= 1:
            out.append(f"units '{u}' are ≤ 1 by construction: Eq. 3 with ε = {eps:g} never fires (the units trap)")
        if self.source.causal and unit.per_key and (self.n_queries > 1).any():
            out.append("causal model: the last positions of a multi-query step are seen by few queries (the last key "
                       "by one), so their ratio is noisy — one query giving it 30 % of its attention makes it ≈ 0.3·S "
                       "times its expectation; read late-position sinks at such steps with care")
        if unit.scales_single_rows and (self.n_queries == 1).any():
            out.append(f"{int((self.n_queries == 1).sum())} steps sum one query row: Eq. 3 there flags any key taking a "
                       "large share of that query's attention (previous-token heads too), not only sinks")
        if self.source.causal and unit.causal_baseline:
            out.append("causal model: even uniform attention gives key j a column sum H_S − H_j (≈ ln S + 0.58 at "
                       f"position 0), so these units favour early positions; compare with units {BASELINE_UNITS}")
        return out

    # ---- notebook display ---------------------------------------------------------------------
    def summary_rows(self) -> list[tuple[str, str]]:
        """The headline numbers as (name, text) rows, 3 significant digits (the page's Summary table)."""
        d = self.to_dict()
        sh = d["shape"]
        kv = lambda o: ", ".join(f"{k} {_fmt(v)}" for k, v in o.items())   # noqa: E731
        l, h = self.strongest_sink_head()
        rows = [("trace", self.source.label),
                ("shape", f"{sh['steps']} steps × {sh['layers']} layers × {sh['heads']} heads, up to "
                          f"{sh['max_seq_len']} tokens; {'causal (ARM)' if d['causal'] else 'bidirectional'}"),
                ("units", f"{d['units']} — {d['units_meaning']}"),
                ("sink rule", f"{d['sink_rule']}, ε = {_fmt(d['sink_eps'])}"),
                ("sinks", f"{d['sinks_total']} (step, layer, head, position) occurrences"),
                ("heads × steps with a sink", f"{_fmt(100 * d['fraction_heads_steps_with_sink'])} %"),
                ("strongest-sink head", f"layer {l}, head {h}"),
                ("sink tracks", kv(d["track_kinds"])),
                ("head classes", kv(d["head_classes"])),
                ("drift", drift_line(d["drift"])),
                ("masked / unmasked splits", f"{d['masked_unmasked_splits']['count']} (step, layer, head)")]
        if d["learned_sink"] is not None:
            rows.append(("learned sink", learned_sink_line(d["learned_sink"])))
        cats = (d["sink_tokens"] or {}).get("categories")
        if cats:
            rows.append(("sink tokens by category",
                         ", ".join(f"{k} {_fmt(v['fraction'])} ({v['count']})" for k, v in cats.items())))
        cc = d.get("commit_confidence")
        if cc:
            rows.append(("commit confidence (§5.2)", f"mean probability {_fmt(cc['mean'])} over {cc['commits']} "
                                                     "committed tokens; per step in summary.json"))
        near = d.get("near_threshold")
        if near:
            rows.append(("near ε (float16)", f"{near['cells']} (layer, head, key) cells within float16 rounding of ε, "
                                             f"{near['sinks']} of them sinks: their verdict could differ with "
                                             "float32 storage (trace --float32)"))
        rows += [("note", n) for n in d["notes"]]
        return rows

    def __repr__(self) -> str:
        l, h = self.strongest_sink_head()
        return (f"Analysis(trace={self.source.label!r}, units={self.units!r}, eps={_fmt(self.config.sink_eps)}, "
                f"{self.num_steps} steps × {self.num_layers} layers × {self.num_heads} heads, "
                f"{int(self.sink_count.sum())} sinks, strongest head L{l}H{h})")

    def _repr_html_(self) -> str:
        import html

        cells = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                        f"{html.escape(v)}</td></tr>" for k, v in self.summary_rows())
        return (f"<table>{cells}</table><p style='font-size:smaller'>Every number: <code>.to_dict()</code>; tables: "
                "<code>.sinks_frame()</code>, <code>.heads_frame()</code>, <code>.token_table.to_dataframe()</code>; "
                "the interactive page: <code>sinklens.show(a)</code>.</p>")

    def sinks_frame(self):
        """pandas DataFrame, one row per Eq. 3 sink occurrence (sinklens.analysis.frames)."""
        from sinklens.analysis.frames import sinks_frame

        return sinks_frame(self)

    def heads_frame(self):
        """pandas DataFrame, one row per (layer, head) (sinklens.analysis.frames)."""
        from sinklens.analysis.frames import heads_frame

        return heads_frame(self)

    # ---- output ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Every number behind the figures, with units (JSON-serialisable). Computed once."""
        if self._dict is None:
            self._dict = self._build_dict()
        return self._dict

    def _build_dict(self) -> dict:
        parts = {k: v for acc in self.accumulators for k, v in acc.to_dict().items()}   # each analysis' own part
        c = self.config
        counts = {k: 0 for k in ("static", "moving", "vanishing", "transient")}
        for tr in self.tracks:
            counts[tr.kind] += 1
        stats = self.layer_head_stats()
        heads = self.head_summaries()
        head_classes = {}
        for h in heads:
            head_classes[h["class"]] = head_classes.get(h["class"], 0) + 1
        d = {
            "trace": self.source.label,
            "units": c.units, "units_meaning": UNITS[c.units].meaning,
            "sink_eps": c.sink_eps,
            "sink_rule": "score_j − mean of the other visible keys' scores ≥ eps (paper Eq. 3); visible = real keys "
                         "some summed query could see",
            "visibility": [v.describe() for v in self.source.layout.visibilities(self.num_layers)],
            "causal": self.source.causal, "notes": self.notes(),
            "shape": {"steps": self.num_steps, "layers": self.num_layers, "heads": self.num_heads,
                      "max_seq_len": int(self.seq_len.max())},
            **{k: parts.pop(k) for k in ("step_numbers", "n_real_keys_per_step", "n_queries_per_step", "edited_per_step",
                                         "sinks_total", "fraction_heads_steps_with_sink")},
            "track_kinds": counts, "track_rule": "see sinklens/analysis/dynamics.py and docs/analysis.md",
            "head_classes": head_classes,
            "static_fraction": c.static_fraction,
            "drift": drift_summary(self.drift),
            "masked_unmasked_splits": parts.pop("masked_unmasked_splits"),
            "layer_head": {"units": c.units, **{k: rounded(v) for k, v in stats.items()}},
            **{k: parts.pop(k) for k in ("largest_sink_position", "largest_sink_score", "score_distribution",
                                         "margin_distribution")},
            "strongest_sink_head": list(self.strongest_sink_head()),
            "eps_sweep": parts.pop("eps_sweep"),
            "sink_tokens": parts.pop("sink_tokens"),
            "learned_sink": parts.pop("learned_sink"),
            "heads": heads,
            "tracks": [tr.to_dict(self.num_steps) for tr in self.tracks[:2000]],
            "tracks_truncated": len(self.tracks) > 2000,
            "drift_events": [e.to_dict() for e in self.drift[:2000]],
        }
        d.update(parts)                 # accumulators beyond the built-in ones, under their own keys
        return d


def analyze(source, config: AnalysisConfig | None = None, *, row: int = 0, label: str | None = None,
            extra: tuple = (), **overrides) -> Analysis:
    """Analyse a trace (path, Trace or Source) step by step. Keyword overrides set config fields.
    extra: accumulator classes of your own, run after the built-in ones (results in `a.extra`)."""
    config = config or AnalysisConfig()
    unknown = sorted(set(overrides) - set(config.__dict__) - {"eps"})
    if unknown:
        raise TypeError(f"analyze() got unknown option(s) {unknown}; options: {sorted(config.__dict__)}")
    if "eps" in overrides:                                  # the name before Dream's schedule `eps` was told apart
        warnings.warn("analyze(eps=...) is deprecated: use sink_eps=", DeprecationWarning, stacklevel=2)
        overrides["sink_eps"] = overrides.pop("eps")
    config = dataclasses.replace(config, **overrides)       # never mutate the caller's config
    check_units(config.units)
    eps = config.sink_eps
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not np.isfinite(eps) or eps <= 0:
        raise ValueError(f"sink_eps must be a number > 0 (Eq. 3's ε, in units {config.units}), got {eps!r}")
    src = as_source(source, row=row, label=label)
    L, H = src.num_layers, src.num_heads
    accumulators = [acc.for_analysis(src, config) for acc in accumulator_classes(extra)]
    it = range(src.num_steps)
    if config.progress:
        it = tqdm(it, desc=f"analyse {src.label}", unit="step")
    visibilities = src.layout.visibilities(L)                       # which keys each layer's queries see
    for t in it:
        step = make_step(t, src.step_data(t), config, visibilities, (L, H))
        for acc in accumulators:
            acc.add(step)

    results = {k: v for acc in accumulators for k, v in acc.result().items()}
    known = {f.name for f in dataclasses.fields(Analysis)}
    a = Analysis(source=src, config=config, accumulators=accumulators,
                 extra={k: v for k, v in results.items() if k not in known},
                 **{k: v for k, v in results.items() if k in known})
    a.tracks = _all_tracks(a)
    a.drift = drift_events(a.tracks, a.is_masked, block_length=src.block_length, prompt_length=src.prompt_length)
    return a


def accumulator_classes(extra: tuple = ()) -> list[type[Accumulator]]:
    """The analyses every step is handed to: ACCUMULATORS (read when called), then `extra`."""
    return [*ACCUMULATORS, *extra]


def make_step(index: int, d, config: AnalysisConfig, visibilities, shape: tuple[int, int]) -> Step:
    """Step `index` as every accumulator sees it: its scores and Eq. 3 margins, computed once.
    d: its StepData; visibilities: the layout's, per layer; shape: the run's (L, H)."""
    if d.received.shape[:2] != shape:
        raise ValueError(f"step {d.step}: received has (L, H) = {d.received.shape[:2]}, expected {shape}")
    sc, visible = step_scores(d, config.units, visibilities)     # (L, H, S), (L, S)
    margin = np_rule.sink_margin(sc, visible[:, None, :])         # (L, H, S)
    return Step(index=index, data=d, scores=sc, margin=margin, flagged=margin >= config.sink_eps,   # Eq. 3
                visible=visible)


def step_scores(d, units: str, visibilities) -> tuple[np.ndarray, np.ndarray]:
    """(scores (L, H, S), visible (L, S)) of one step: the rule's coverage of its summed query
    rows under each layer's visibility, then the units."""
    cov = np_rule.coverage(d.query_positions, d.key_mask, visibilities)
    return np_rule.to_scores(d.received, units, cov), cov.visible


def _fmt(v) -> str:
    """3 significant digits for floats, integers as they are."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return str(v)
    if isinstance(v, (int, np.integer)) or float(v).is_integer():
        return str(int(v))
    return f"{float(v):.3g}"


def _all_tracks(a: Analysis) -> list[SinkTrack]:
    """Tracks of every head from the sparse sink list."""
    s = a.sinks
    order = np.lexsort((s["pos"], s["step"], s["head"], s["layer"])) if s["step"].size else np.zeros(0, int)
    step, layer, head = s["step"][order], s["layer"][order], s["head"][order]
    pos, score = s["pos"][order], s["score"][order]
    tracks: list[SinkTrack] = []
    key = layer.astype(np.int64) * a.num_heads + head
    bounds = np.flatnonzero(np.diff(key)) + 1
    for chunk in np.split(np.arange(key.size), bounds) if key.size else []:
        per_step = [(np.zeros(0, int), np.zeros(0))] * a.num_steps
        st = step[chunk]
        for t in np.unique(st):
            sel = chunk[st == t]
            per_step[int(t)] = (pos[sel], score[sel])
        tracks += track_sinks(per_step, int(layer[chunk[0]]), int(head[chunk[0]]), max_move=a.config.max_move,
                              static_fraction=a.config.static_fraction)
    return tracks
