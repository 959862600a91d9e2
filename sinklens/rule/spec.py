"""The paper's sink rule, declared once: Eq. 3, its default ε, the units it is applied in, and
which keys a query could see. No numpy, no torch: `--help`, the report, the masking and the
lm-eval adapter all read these declarations; `rule/np_rule.py` computes them — for the analysis of
saved traces, sink masking at run time and the logit lens' sink positions alike — and
`tests/test_rule_parity.py` holds it against a brute-force reference.

Eq. 3 (paper): key j is a sink when

    score_j − mean_{k ≠ j, k visible} score_k ≥ ε,     ε = DEFAULT_EPS = 3,

per (step, layer, head), where score_j is the received attention r_j = Σ_i A[i, j] (a column
sum over the summed query rows i) in one of the UNITS below, and "visible" means: a real key
that at least one summed query row could see. Keys a query cannot see — outside a sliding
window, in a future block, not in the KV window, padding — receive 0 by construction; counted
in the mean they would lower it and manufacture sinks, so they are never in the mean and never
sinks.

Why ε = 3 is applied to sums and not to the paper's written mean r_j / S: the mean is ≤ 1 by
construction, so ε = 3 could never fire on it, while the paper's "filters ≥ 96 % of tokens on a
64-token sequence" and its histograms (x-axis to ~50) only make sense on column sums, where
uniform attention gives every key 1.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_EPS = 3.0            # the paper's ε, in the units of the scores it is applied to
DEFAULT_UNITS = "scaled_sum"


@dataclass(frozen=True)
class Unit:
    name: str
    meaning: str     # one sentence: what score_j is
    label: str       # short axis label for figures
    uniform: str     # what uniform attention gives every visible key (or key j)
    # what a reader must know (the analysis turns these into notes on a trace):
    ceiling: str | None = None        # "queries": score_j ≤ Q; "one": score_j ≤ 1 (ε ≥ 1 never fires)
    causal_baseline: bool = True      # keeps the causal baseline H_S − H_j (early keys score high under uniform attention)
    per_key: bool = False             # divided per key: noisy where few summed queries see the key
    scales_single_rows: bool = True   # a step of one query row is scaled up: any key with a large share passes


# Q = number of summed query rows, K = number of visible keys (real, and seen by at least one
# summed query), seen_j = summed queries that see key j, E_j = r_j under uniform attention.
UNITS: dict[str, Unit] = {u.name: u for u in (
    Unit("scaled_sum", "column sum scaled so the average visible key scores 1: r_j · K / Q (= r_j wherever every "
         "visible key is also a summed query: a DLM step, an ARM prefix)",
         "r_j · K / Q (multiples of the average key)", "1 on average; exactly 1 when every query sees every key"),
    Unit("sum", "column sum r_j = Σ_i A[i,j] over the summed query rows (Σ_j r_j = Q)",
         "r_j = Σ_i A[i,j] (column sum)", "Q / K on average", ceiling="queries", scales_single_rows=False),
    Unit("mean", "mean received attention r_j / Q (the paper's written Eq. 2; ≤ 1, so ε = 3 never fires on it)",
         "r_j / Q (mean received)", "1 / K on average", ceiling="one", scales_single_rows=False),
    Unit("gu", "r_j / seen_j, the number of summed queries that could see key j (Gu et al.'s normalisation)",
         "r_j / #queries seeing j (Gu)", "1 / (keys the query sees), e.g. 1 / K bidirectional",
         causal_baseline=False, per_key=True),
    Unit("uniform_ratio", "r_j / E_j, E_j = Σ over summed queries i that see j of 1 / |keys i sees| (removes the "
         "causal, window and block baselines)", "r_j / uniform expectation", "exactly 1 for every visible key",
         causal_baseline=False, per_key=True),
)}
STORED_UNITS = "sum"               # what a trace stores (received attention); every other unit derives from it
BASELINE_UNITS = "uniform_ratio"   # the second view of a causal run: its scores with the causal baseline removed

# How sink masking picks K keys per (layer, head) (masking/config.py). The paper (§4.3): "masking
# attention scores directed toward the top-K attention sinks identified by our metric (Equation
# 3). We vary the threshold parameter ε, where smaller values result in masking a larger
# proportion of sinks. Specifically, we select ε0, ε1 and ε2 to mask the top 1, 5 and 10 sinks".
# Within a head the Eq. 3 margin grows with score_j, so lowering ε until K keys pass selects the
# head's top-K keys: that is the default. The first sentence alone reads as a gate at ε = 3.
PROTOCOLS: dict[str, str] = {
    "topk": "the top-K keys per (layer, head) by score: ε lowered until K keys pass Eq. 3 (the paper's 'we select "
            "ε0, ε1 and ε2 to mask the top 1, 5 and 10 sinks')",
    "eq3": "stricter: the top-K among the keys that pass Eq. 3 at the fixed ε; a head without a sink blocks nothing",
}
DEFAULT_PROTOCOL = "topk"


# The mean + k·σ rule (Sink-Aware Pruning, arXiv 2602.17664), beside Eq. 3: per step, each key's
# attention mass summed over layers (here: the mean over heads of its score in the analysis units,
# summed over layers) is a sink when mass_j ≥ mean(mass) + k · σ(mass), mean and σ (population)
# over the visible keys. k = 2 is the official code's default (`sink_std`); it thresholds a
# sigmoid(α (mass − threshold)), whose 0.5 level is this hard rule.
DEFAULT_K_SIGMA = 2.0
K_SIGMA_RULE = ("mass_j = Σ_layers mean_heads score_j; sink when mass_j ≥ mean + k·σ over the visible keys "
                "(σ: population; Sink-Aware Pruning, arXiv 2602.17664)")


def check_units(units: str) -> str:
    if units not in UNITS:
        raise ValueError(f"units must be one of {sorted(UNITS)}, got {units!r}")
    return units


WINDOW_KINDS = ("causal", "symmetric", "cache")


@dataclass(frozen=True)
class Visibility:
    """Which keys the query at absolute position i could see in one layer (padding aside).

    causal   keys j ≤ i only (else every key up to the end of the sequence)
    block    block-causal attention: j < (i // block + 1) · block, blocks counted from position 0
             (the prompt included), bidirectional inside a block
    window   a sliding window of this many positions; `window_kind` says which keys it keeps:
             "causal"    i − window < j              (transformers' sliding window on a causal layer)
             "symmetric" |i − j| ≤ window            (a bidirectional encoder's local attention,
                                                      transformers' `sliding_window`, half the local width)
             "cache"     j > q0 − window, q0 the first summed query (a sliding KV cache that keeps
                         the last window − 1 keys before the block being denoised: DiffusionGemma's decoder)
    """

    causal: bool = False
    block: int | None = None
    window: int | None = None
    window_kind: str = "causal"

    def __post_init__(self):
        for name in ("block", "window"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int or None, got {v!r}")
        if self.window_kind not in WINDOW_KINDS:
            raise ValueError(f"window_kind must be one of {WINDOW_KINDS}, got {self.window_kind!r}")

    def describe(self) -> str:
        parts = ["causal" if self.causal else "bidirectional"]
        if self.block:
            parts.append(f"block-causal (blocks of {self.block})")
        if self.window:
            parts.append(f"{self.window_kind} window {self.window}")
        return ", ".join(parts)


def layer_visibilities(num_layers: int, *, causal: bool = False, attention_block: int | None = None,
                       windows=None, window_kind: str | None = None) -> list[Visibility]:
    """One Visibility per layer from a run's layout facts (`windows`: per layer, None = full)."""
    if windows is not None and len(windows) != num_layers:
        raise ValueError(f"windows must give one entry per layer ({num_layers}), got {len(windows)}")
    kind = window_kind or ("causal" if causal else "symmetric")
    ws = list(windows) if windows is not None else [None] * num_layers
    return [Visibility(causal=bool(causal), block=attention_block, window=None if w is None else int(w),
                       window_kind=kind) for w in ws]
