"""What a report draws and how big its page may be: `ReportOptions` and `PageOptions`.

Their `param` fields are the `sinklens report` flags (`sinklens/cli/report.py` builds one flag
per field; PageOptions' as `--html-*`), so a new option is one field here. Fields declared with
plain `field` are set by the caller, not by a flag. Torch- and numpy-free, for a fast --help.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sinklens.params import check_fields, param
from sinklens.rule.spec import DEFAULT_EPS, DEFAULT_UNITS, UNITS


@dataclass
class PageOptions:
    max_mb: float | None = param(150.0, float, "cap on the HTML page size in MB; per-head data is then kept every "
                                               "k-th step (0 = no cap)", min=0)   # None or 0: no cap
    layers: list[int] | None = param(None, "indices", "keep per-head data in the page for these layers only "
                                                      "(default: all)")
    title: str = param("sinklens report", str, "title of the HTML page", flag="--title")
    progress: bool = False          # tqdm bar while the per-step bytes are written
    element_prefix: str = "sl"      # every element id starts with it (unique per page in a notebook)

    def __post_init__(self):
        check_fields(self)
        if self.max_mb == 0:
            self.max_mb = None


@dataclass
class ReportOptions:
    units: str = param(DEFAULT_UNITS, str, f"score units (default {DEFAULT_UNITS}: column sums scaled so the average "
                                           "key scores 1, where the paper's eps applies; docs/analysis.md)",
                       choices=tuple(UNITS))
    sink_eps: float = param(DEFAULT_EPS, float, "Eq. 3 threshold eps in the score units", gt=0, old_flags=("--eps",))
    heads: list[tuple[int, int]] | None = param(None, "pairs", "Fig. 7 heads as LAYER:HEAD,... (default: the most "
                                                               "dynamic ones)")
    map_steps: list[int] | None = param(None, "indices", "Fig. 4 step indices (default: up to 3 stored ones)")
    row: int = param(0, int, "batch row to analyse in every trace", min=0)
    figures: bool = param(True, bool, "draw the figures (--no-figures: only summary.md/json and the page, faster)")
    control: str | None = param(None, str, "the random-init control of the same shape (`sinklens trace ... "
                                           "--random-init SEED`), drawn beside each mechanism-readout figure: its "
                                           "trace for a trace report, its corpus.jsonl for a corpus report")
    page: PageOptions = field(default_factory=PageOptions)
    progress: bool = True
    log: Callable[[str], None] | None = None   # where --verbose lines go: what was read, timings, figures left out

    def __post_init__(self):
        check_fields(self)
