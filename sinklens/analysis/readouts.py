"""The mechanism readouts of a trace (sinklens/trace/readouts.py), each read against the sinks.

One accumulator per readout; each does nothing on a trace that did not record its columns (its
part of `to_dict()` is then None). Sources and definitions: docs/analysis.md, "Mechanism readouts".

- SinkVectors: value norm (One Token Is Enough, arXiv 2601.19657), key norm and cos(q, k)
  (Attention Floating, arXiv 2601.07894) at the Eq. 3 sinks against the other visible keys;
- MassiveActivations: the largest residual-stream channel per layer and step (arXiv 2605.06366,
  2605.06611), and the residual norm at the step's strongest sink against the median position;
- DiagonalHeads: the diagonal share Σ_i A[i, i] / Q per head beside its absorption rate (arXiv 2605.08453);
- DistanceProfile: received attention by distance |i − j|, beside what uniform attention gives;
- LogitLens: what the lens reads at the lens positions (the paper's future work);
- MaskQueryRanking: the keys ranked by attention from masked queries only (MaskKV, arXiv 2510.09309)
  beside the ranking by every query row.
"""
from __future__ import annotations

import warnings

import numpy as np

from sinklens.analysis.absorption import absorption
from sinklens.analysis.accumulate import Accumulator, CorpusStream, Step, StepFold, rounded, step_sum
from sinklens.rule import np_rule

# A head is called diagonal (self) when at least this share of its summed rows' attention stays on
# the query's own key, and a sink head when its Eq. 3 sinks absorb at least this share: "more than
# half" is the plainest cut, and both shares are 0..1 so one threshold reads the same on both axes.
HEAD_SHARE = 0.5
RANK_TOP = 10   # MaskQueryRanking: the ranking's top keys compared
SCORE_BINS = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, np.inf])  # value norm by score (analysis units)


def nanmean(x, axis=None):
    with warnings.catch_warnings():                  # all-NaN slices (a head never a sink) stay NaN quietly
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.asarray(x, float), axis=axis)


class SinkVectors(Accumulator):
    """Per (step, layer, head): mean value norm, key norm and cos(q, k) at the Eq. 3 sinks and at the
    other visible keys; value norm binned by score."""

    name = "sink_vectors"
    COLUMNS = ("value_norm", "key_norm", "qk_cos")

    def __init__(self, source, config):
        shape = (source.num_steps, source.num_layers, source.num_heads)
        self.sink = {c: np.full(shape, np.nan) for c in self.COLUMNS}
        self.other = {c: np.full(shape, np.nan) for c in self.COLUMNS}
        self.bin_sum = np.zeros(len(SCORE_BINS) - 1)
        self.bin_count = np.zeros(len(SCORE_BINS) - 1)
        self.units = config.units
        self.seen: set[str] = set()

    def add(self, step: Step) -> None:
        vis = np.broadcast_to(step.visible[:, None, :], step.flagged.shape)
        sink, other = step.flagged, vis & ~step.flagged
        for c in self.COLUMNS:
            x = step.data.readouts.get(c)
            if x is None:
                continue
            self.seen.add(c)
            with np.errstate(all="ignore"):
                self.sink[c][step.index] = np.where(sink, x, 0).sum(-1) / np.where(sink.any(-1), sink.sum(-1), np.nan)
                self.other[c][step.index] = np.where(other, x, 0).sum(-1) / np.where(other.any(-1), other.sum(-1), np.nan)
            if c == "value_norm":
                b = np.digitize(step.scores[vis], SCORE_BINS) - 1
                self.bin_sum += np.bincount(b, weights=x[vis], minlength=len(self.bin_sum))[: len(self.bin_sum)]
                self.bin_count += np.bincount(b, minlength=len(self.bin_sum))[: len(self.bin_sum)]

    def ratio(self, column: str = "value_norm") -> np.ndarray:
        """(T, L, H) sink / other mean of `column` (value or key norm); NaN where the head has no sink."""
        with np.errstate(all="ignore"):
            return self.sink[column] / self.other[column]

    def result(self) -> dict:
        return {"sink_vectors": self if self.seen else None}

    def corpus(self, num_steps: int) -> dict:
        """(L, H) means at sinks and at other keys and their ratio, summed over steps (NaN skipped: heads
        without a sink); the value norm's sum and count per score bin."""
        if not self.seen:
            return {}
        out = {f"{c}_{where}": step_sum(d[c]) for c in sorted(self.seen)
               for where, d in (("sink", self.sink), ("other", self.other))}
        out.update({f"{c}_ratio": step_sum(self.ratio(c)) for c in sorted(self.seen - {"qk_cos"})})
        if "value_norm" in self.seen:        # value norm by score: a sum and a count per bin, as in the trace
            out["value_norm_by_score"] = {"sum": self.bin_sum.copy(), "count": self.bin_count.copy()}
        return {"sink_vectors": out}

    def to_dict(self) -> dict:
        if not self.seen:
            return {"sink_vectors": None}
        out = {"units": "norms: L2 of the vectors the layer used (after RoPE for q, k); ratio = mean at the Eq. 3 "
                        "sinks / mean at the other visible keys; cos: mean over summed query rows of cos(q_i, k_j)"}
        for c in sorted(self.seen):
            out[c] = {"sink_mean": _round(nanmean(self.sink[c])), "other_mean": _round(nanmean(self.other[c])),
                      "layer_head_sink_mean": rounded(nanmean(self.sink[c], axis=0)),
                      "layer_head_other_mean": rounded(nanmean(self.other[c], axis=0))}
            if c != "qk_cos":
                out[c]["ratio_mean"] = _round(nanmean(self.ratio(c)))
        if "value_norm" in self.seen:
            with np.errstate(all="ignore"):
                out["value_norm_by_score"] = {"score_bins": [float(x) for x in SCORE_BINS[:-1]], "units": self.units,
                                              "mean": rounded(self.bin_sum / np.where(self.bin_count, self.bin_count,
                                                                                      np.nan)),
                                              "count": self.bin_count.astype(int).tolist()}
        return {"sink_vectors": out}


class MassiveActivations(Accumulator):
    """Per (step, layer): the largest |h_c| over positions, where (position, channel) it sits, its
    ratio to the median position's largest |h_c| (`ratio`) and to the median magnitude of all
    activations (`ratio_all`, Sun et al. 2024's; traces with the hidden_median_abs column); the
    residual norm at the step's strongest sink (the key flagged in most heads of the layer) over
    the median norm."""

    name = "massive_activations"
    not_streamed = "the largest channel's position and index per step (positions and channel ids do not add)"

    def __init__(self, source, config):
        shape = (source.num_steps, source.num_layers)
        self.value = np.full(shape, np.nan)
        self.position = np.full(shape, -1, np.int64)
        self.channel = np.full(shape, -1, np.int64)
        self.ratio = np.full(shape, np.nan)
        self.ratio_all = np.full(shape, np.nan)      # NaN on traces written before hidden_median_abs
        self.sink_norm_ratio = np.full(shape, np.nan)
        self.seen = False

    def add(self, step: Step) -> None:
        ro = step.data.readouts
        if "hidden_norm" not in ro:
            return
        self.seen = True
        norm, ch, val = ro["hidden_norm"], ro["hidden_top_channels"], ro["hidden_top_values"]   # (L, R), (L, R, k)
        S, rows = step.scores.shape[-1], norm.shape[1]
        first = S - rows                               # a cached step computes only its last rows
        top = np.abs(val[..., 0])                      # (L, R) each position's largest |h_c|
        at = top.argmax(-1)                            # (L,)
        layers = np.arange(top.shape[0])
        self.value[step.index] = val[layers, at, 0]
        self.position[step.index] = at + first
        self.channel[step.index] = ch[layers, at, 0]
        with np.errstate(all="ignore"):
            self.ratio[step.index] = top[layers, at] / np.median(top, axis=-1)
            if "hidden_median_abs" in ro:
                self.ratio_all[step.index] = top[layers, at] / ro["hidden_median_abs"]
            count = step.flagged.sum(axis=1)[:, first:]                   # (L, R) heads flagging each key
            strongest = count.argmax(-1)
            has = count.max(-1) > 0
            self.sink_norm_ratio[step.index] = np.where(has, norm[layers, strongest] / np.median(norm, axis=-1), np.nan)

    def result(self) -> dict:
        return {"massive_activations": self if self.seen else None}

    def corpus(self, num_steps: int) -> dict:
        """(L,) ratios summed over steps; |largest channel| too (positions and channels do not add)."""
        if not self.seen:
            return {}
        return {"massive_activations": {"ratio": step_sum(self.ratio), "ratio_all": step_sum(self.ratio_all),
                                        "sink_norm_ratio": step_sum(self.sink_norm_ratio),
                                        "abs_value": step_sum(np.abs(self.value))}}

    def to_dict(self) -> dict:
        if not self.seen:
            return {"massive_activations": None}
        return {"massive_activations": {
            "units": "value: the signed largest channel of the layer's output; ratio: its |value| / the median "
                     "position's largest |h_c|; ratio_all: its |value| / the median |h_c| over every (position, "
                     "channel), Sun et al. 2024's ratio (NaN: the trace predates it); sink_norm_ratio: ||h|| at the "
                     "strongest sink / median ||h||",
            "value": rounded(self.value), "position": self.position.tolist(), "channel": self.channel.tolist(),
            "ratio": rounded(self.ratio), "ratio_all": rounded(self.ratio_all),
            "sink_norm_ratio": rounded(self.sink_norm_ratio),
            "layer_max_ratio": rounded(np.where(np.isfinite(self.ratio), self.ratio, -np.inf).max(axis=0))}}


class DiagonalHeads(Accumulator):
    """(T, L, H) diagonal share and absorption rate; per head: diagonal, sink, both or neither."""

    name = "diagonal_heads"

    def __init__(self, source, config):
        shape = (source.num_steps, source.num_layers, source.num_heads)
        self.diagonal = np.full(shape, np.nan)
        self.absorption = np.zeros(shape)
        self.seen = False

    def add(self, step: Step) -> None:
        self.absorption[step.index] = absorption(step)
        d = step.data.readouts.get("diagonal")
        if d is not None:
            self.diagonal[step.index] = d
            self.seen = True

    def classes(self) -> np.ndarray:
        """(L, H) str: 'diagonal', 'sink', 'both' or 'neither' by the mean shares over steps (HEAD_SHARE)."""
        diag = nanmean(self.diagonal, axis=0) >= HEAD_SHARE
        sink = self.absorption.mean(axis=0) >= HEAD_SHARE
        return np.where(diag & sink, "both", np.where(diag, "diagonal", np.where(sink, "sink", "neither")))

    def result(self) -> dict:
        return {"diagonal_heads": self if self.seen else None}

    def corpus(self, num_steps: int) -> dict:
        """(L, H) diagonal share and absorption summed over steps (head classes: from the corpus means)."""
        if not self.seen:
            return {}
        return {"diagonal_heads": {"diagonal": step_sum(self.diagonal), "absorption": step_sum(self.absorption)}}

    @classmethod
    def corpus_stream(cls, one_step_source, config) -> "DiagonalSums":
        return DiagonalSums()


    def to_dict(self) -> dict:
        if not self.seen:
            return {"diagonal_heads": None}
        cls = self.classes()
        kinds, counts = np.unique(cls, return_counts=True)
        return {"diagonal_heads": {
            "units": "diagonal share Σ_i A[i, i] / Q (0..1); absorption Σ_{j ∈ sinks} r_j / Σ r_j (0..1); "
                     f"a head is 'diagonal' / 'sink' when its mean share over steps is ≥ {HEAD_SHARE}",
            "diagonal_mean": rounded(nanmean(self.diagonal, axis=0)),
            "absorption_mean": rounded(self.absorption.mean(axis=0)),
            "per_step_diagonal_mean": rounded(nanmean(self.diagonal.reshape(len(self.diagonal), -1), axis=1)),
            "classes": cls.tolist(), "class_counts": {str(k): int(v) for k, v in zip(kinds, counts)}}}


class DiagonalSums(CorpusStream):
    """DiagonalHeads' part folded step by step: the absorption of every step counts once the run has
    the diagonal at some step, as in the trace (not only that of the steps that have it)."""

    def __init__(self):
        self.fold, self.seen = StepFold(), False

    def add(self, step: Step) -> None:
        d = step.data.readouts.get("diagonal")
        self.seen = self.seen or d is not None
        rate = absorption(step)                                                     # (L, H)
        diagonal = np.full(rate.shape, np.nan) if d is None else np.asarray(d, np.float64)
        self.fold.add({"diagonal_heads": {"diagonal": step_sum(diagonal[None]), "absorption": step_sum(rate[None])}})

    def part(self) -> dict:
        return self.fold.value() if self.seen else {}


class DistanceProfile(Accumulator):
    """Per layer: attention by distance |i − j| per summed query row (mean over heads and steps), and
    the same under uniform attention over the keys each query sees, per layer under the rule's
    visibility of the trace (causal, blocks, sliding windows: np_rule.distance_expectation)."""

    name = "distance_profile"

    def __init__(self, source, config):
        self.visibilities = source.layout.visibilities(source.num_layers)
        self.L = source.num_layers
        self.total = None          # (L, D) Σ over steps of mass per query row
        self.uniform = None        # (L, D) Σ over steps of the uniform expectation per query row
        self.steps = 0

    def _grow(self, n: int) -> None:
        if self.total is None:
            self.total, self.uniform = np.zeros((self.L, n)), np.zeros((self.L, n))
        elif n > self.total.shape[1]:
            self.total = np.pad(self.total, ((0, 0), (0, n - self.total.shape[1])))
            self.uniform = np.pad(self.uniform, ((0, 0), (0, n - self.uniform.shape[1])))

    def add(self, step: Step) -> None:
        d = step.data.readouts.get("distance")
        if d is None:
            return
        q = np.asarray(step.data.query_positions, np.int64)
        Q = max(len(q), 1)
        self._grow(d.shape[-1])
        self.total[:, : d.shape[-1]] += d.mean(axis=1) / Q                          # (L, S)
        self.uniform[:, : d.shape[-1]] += np_rule.distance_expectation(q, step.data.key_mask,
                                                                        self.visibilities)[:, : d.shape[-1]]
        self.steps += 1

    def result(self) -> dict:
        return {"distance_profile": self if self.steps else None}

    def corpus(self, num_steps: int) -> dict:
        """The sums behind `profile()`: (L, D) attention and uniform, and the steps. D is the prompt's
        length; a shorter prompt has no attention at the longer distances, so its sums are zero-padded
        when prompts are added (sinklens/analysis/corpus.py `add`) and the corpus profile is
        Σ attention / Σ steps, as if every prompt's steps were one trace's."""
        if not self.steps:
            return {}
        return {"distance_profile": {"attention": self.total.copy(), "uniform": self.uniform.copy(),
                                     "steps": self.steps}}

    def profile(self) -> tuple[np.ndarray, np.ndarray]:
        """((L, D) attention per query row at each distance, (L, D) the uniform expectation), means over steps."""
        return self.total / self.steps, self.uniform / self.steps

    def to_dict(self) -> dict:
        if not self.steps:
            return {"distance_profile": None}
        prof, uni = self.profile()
        return {"distance_profile": {
            "units": "attention per summed query row at distance d = |i − j| (Σ over d = 1), mean over heads and "
                     "steps; uniform: the same under uniform attention over the keys each query sees",
            "per_layer": rounded(prof), "uniform": rounded(uni)}}


class LogitLens(Accumulator):
    """Rows (step, position, the token there, lens layer, top tokens and probabilities)."""

    name = "logit_lens"
    not_streamed = "the lens rows (tokens and their probabilities do not add over prompts)"

    def __init__(self, source, config):
        self.source = source
        self.layers = list((source.meta.get("readouts") or {}).get("lens_layers") or [])
        self.rows: list[dict] = []

    def add(self, step: Step) -> None:
        ro = step.data.readouts
        if "lens_tokens" not in ro:
            return
        pos, tok, prob = ro["lens_positions"], ro["lens_tokens"], ro["lens_probs"]    # (P,), (N, P, k), (N, P, k)
        layers = self.layers or list(range(tok.shape[0]))
        for p_i, p in enumerate(pos):
            if p < 0:
                continue
            here = self.source.decode([step.data.tokens[p]])[0]
            for n, layer in enumerate(layers):
                self.rows.append({"step": int(step.data.step), "position": int(p), "token": here, "layer": int(layer),
                                  "top": self.source.decode(tok[n, p_i]),
                                  "probs": [round(float(x), 4) for x in prob[n, p_i]]})

    def result(self) -> dict:
        return {"logit_lens": self.rows or None}

    def corpus(self, num_steps: int) -> dict:
        return {}

    def to_dict(self) -> dict:
        if not self.rows:
            return {"logit_lens": None}
        return {"logit_lens": {"units": "probabilities of the lens' softmax (final norm + LM head on the layer's "
                                        "output)", "layers": self.layers, "rows": self.rows[:5000],
                               "rows_truncated": len(self.rows) > 5000}}


class MaskQueryRanking(Accumulator):
    """Per step: the RANK_TOP keys ranked by attention from masked query rows only (summed over layers
    and heads) and by every summed row; their overlap (0..1)."""

    name = "mask_query_ranking"

    def __init__(self, source, config):
        names = list(source.group_names)
        self.group = names.index("masked") if "masked" in names else None
        self.steps: list[dict] = []

    def add(self, step: Step) -> None:
        g = step.data.received_groups
        if self.group is None or g is None:
            return
        masked = g[self.group].sum(axis=(0, 1))                          # (S,)
        if masked.sum() <= 0:                                            # no masked query row at this step
            return
        every = step.data.received.sum(axis=(0, 1))
        k = min(RANK_TOP, len(masked))
        top_m = np.argsort(-masked, kind="stable")[:k]
        top_a = np.argsort(-every, kind="stable")[:k]
        self.steps.append({"step": int(step.data.step), "masked_top": top_m.tolist(), "all_top": top_a.tolist(),
                           "overlap": round(len(set(top_m) & set(top_a)) / k, 4)})

    def result(self) -> dict:
        return {"mask_query_ranking": self.steps or None}

    def corpus(self, num_steps: int) -> dict:
        """The top-key overlap summed over the steps that had a masked query row."""
        if not self.steps:
            return {}
        return {"mask_query_ranking": {"overlap": step_sum([s["overlap"] for s in self.steps])}}

    def to_dict(self) -> dict:
        if not self.steps:
            return {"mask_query_ranking": None}
        return {"mask_query_ranking": {
            "units": f"positions; overlap = shared keys among the top {RANK_TOP} of both rankings / {RANK_TOP}",
            "top": RANK_TOP, "mean_overlap": round(float(np.mean([s["overlap"] for s in self.steps])), 4),
            "per_step": self.steps}}


def _round(x) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 4)


READOUT_ACCUMULATORS = [SinkVectors, MassiveActivations, DiagonalHeads, DistanceProfile, LogitLens, MaskQueryRanking]
