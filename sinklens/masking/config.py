"""`MaskingConfig`: what the sink-masking hook blocks (options explained in `masking/policy.py`).

Its fields are declared with `param` (type, help, range or choices), so `EvalConfig` takes the
masking settings it shares from here (`param_like`) instead of writing them again, and both check
the same rules. Torch-free at import (the command line's --help builds the eval flags from it).
"""
from __future__ import annotations

import warnings
from dataclasses import InitVar, asdict, dataclass

from sinklens.params import MAX_SEED, check_fields, param
from sinklens.rule.spec import DEFAULT_EPS, DEFAULT_PROTOCOL, DEFAULT_UNITS, PROTOCOLS, UNITS


@dataclass
class MaskingConfig:
    mask_k: int = param(1, int, "K sinks blocked per (layer, head); 0 = no masking (capture only)", min=0)
    fraction: float | None = param(None, float, "K = ceil(fraction x visible keys) instead of mask_k", gt=0, max=1)
    threshold: float | None = param(None, float, "block keys with r_j >= this instead of top-K (in the score units)",
                                    min=0)
    sinks: str = param(DEFAULT_PROTOCOL, str, "; ".join(f"{k}: {v}" for k, v in PROTOCOLS.items()),
                       choices=tuple(PROTOCOLS))
    sink_eps: float = param(DEFAULT_EPS, float, "Eq. 3 margin eps in the score units (the eq3 protocol's gate; "
                                                "the random control never picks an Eq. 3 sink)")
    units: str = param(DEFAULT_UNITS, str, f"score units of the ranking and of Eq. 3 (default {DEFAULT_UNITS}: column "
                                           "sums scaled so the average visible key scores 1; docs/analysis.md)",
                       choices=tuple(UNITS))
    scope: str = param("all", str, "which positions may be blocked (default all)",
                       choices=("all", "prompt", "generated"))
    control: str = param("none", str, "random: beside every masked run, block as many random non-sink keys per "
                                      "head (seeded)", choices=("none", "random"))
    seed: int = param(0, int, "seed of the random control (the eval passes a per-sample seed to reset())", min=0,
                      max=MAX_SEED)
    ranking: str = param("per_head", str, "rank sinks per (layer, head), or over all heads of a layer together",
                         choices=("per_head", "global"))
    keep_self: bool = param(False, bool, "a blocked key still receives its own query's attention")
    step0: str = param("unmasked", str, "DLM step 0 has no attention yet: run it unmasked, or rank sinks by a "
                                        "probe pass first", choices=("unmasked", "probe"))
    arm_rule: str = param("newest", str, "ARM: rank sinks by the newest token's row, or by every prefix row",
                          choices=("newest", "prefix"))
    layers: tuple[int, ...] | None = None   # restrict blocking to these layers (None = all)
    # the names before the sampling `top_k` and Dream's schedule `eps` were told apart
    top_k: InitVar[int | None] = None
    eps: InitVar[float | None] = None

    def __post_init__(self, top_k=None, eps=None):
        for old, new, value in (("top_k", "mask_k", top_k), ("eps", "sink_eps", eps)):
            if value is not None:
                warnings.warn(f"MaskingConfig({old}=...) is deprecated: use {new}=", DeprecationWarning, stacklevel=3)
                setattr(self, new, value)
        check_fields(self)   # "mask_k must be an integer >= 0, got True", "units must be one of [...]"
        if self.threshold is not None and self.fraction is not None:
            raise ValueError("give K as top_k / fraction or a threshold, not both")
        if self.layers is not None:
            self.layers = tuple(int(l) for l in self.layers)

    @property
    def active(self) -> bool:
        return self.mask_k > 0 or self.fraction is not None or self.threshold is not None

    def describe(self, is_diffusion: bool = True) -> dict:
        d = asdict(self)
        d["ranking_source"] = "previous step's attention before blocking (received_unblocked)"
        if is_diffusion:
            d.pop("arm_rule")
        return d
