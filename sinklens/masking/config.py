"""`MaskingConfig`: what the sink-masking hook blocks (options explained in `masking/policy.py`).

Its fields are declared with `param` (type, help, range or choices), so `EvalConfig` takes the
masking settings it shares from here (`param_like`) instead of writing them again, and both check
the same rules. Torch-free at import (the command line's --help builds the eval flags from it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from sinklens.params import check_fields, param


@dataclass
class MaskingConfig:
    top_k: int = param(1, int, "K sinks blocked per (layer, head); 0 = no masking (capture only)", min=0)
    fraction: float | None = param(None, float, "K = ceil(fraction x real keys) instead of top_k", gt=0, max=1)
    threshold: float | None = param(None, float, "block keys with r_j >= this instead of top-K (in the score units)",
                                    min=0)
    sinks: str = param("eq3", str, "eq3 (default): top-K among keys that pass Eq. 3, a head without a sink blocks "
                                   "nothing; topk: top-K keys per head, sinks or not", choices=("eq3", "topk"))
    eps: float = param(3.0, float, "Eq. 3 margin in the score units (default 3)")
    units: str = param("scaled_sum", str, "score units for Eq. 3: scaled_sum (default; column sums scaled so the "
                                          "average key scores 1, i.e. the column sums for DLMs), uniform_ratio or sum",
                       choices=("scaled_sum", "uniform_ratio", "sum"))
    scope: str = param("all", str, "which positions may be blocked (default all)",
                       choices=("all", "prompt", "generated"))
    control: str = param("none", str, "random: beside every masked run, block as many random non-sink keys per "
                                      "head (seeded)", choices=("none", "random"))
    seed: int = param(0, int, "seed of the random control (the eval passes a per-sample seed to reset())")
    ranking: str = param("per_head", str, "rank sinks per (layer, head), or over all heads of a layer together",
                         choices=("per_head", "global"))
    keep_self: bool = param(False, bool, "a blocked key still receives its own query's attention")
    step0: str = param("unmasked", str, "DLM step 0 has no attention yet: run it unmasked, or rank sinks by a "
                                        "probe pass first", choices=("unmasked", "probe"))
    arm_rule: str = param("newest", str, "ARM: rank sinks by the newest token's row, or by every prefix row",
                          choices=("newest", "prefix"))
    layers: tuple[int, ...] | None = None   # restrict blocking to these layers (None = all)

    def __post_init__(self):
        check_fields(self)   # "top_k must be an integer >= 0, got True", "units must be one of [...]"
        if self.threshold is not None and self.fraction is not None:
            raise ValueError("give K as top_k / fraction or a threshold, not both")
        if self.layers is not None:
            self.layers = tuple(int(l) for l in self.layers)

    @property
    def active(self) -> bool:
        return self.top_k > 0 or self.fraction is not None or self.threshold is not None

    def describe(self, is_diffusion: bool = True) -> dict:
        d = asdict(self)
        d["ranking_source"] = "previous step's attention before blocking (received_unblocked)"
        if is_diffusion:
            d.pop("arm_rule")
        return d
