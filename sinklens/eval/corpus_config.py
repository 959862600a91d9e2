"""`CorpusConfig`: the settings of a corpus run (`sinklens trace --prompts`, sinklens/eval/corpus.py).

Its own module, torch-free at import: `sinklens trace --help` builds the corpus-only flags from
its `param` fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sinklens.eval.rundir import recorded_model_name
from sinklens.params import check_fields, param, param_like
from sinklens.report.options import ReportOptions
from sinklens.rule.spec import BASELINE_UNITS, DEFAULT_UNITS


@dataclass
class CorpusConfig:
    """A corpus run's settings. Its `param` fields are flags of `sinklens trace` that only a corpus
    run reads (`sinklens/cli/trace.py` builds them from the fields); the others come from the run
    flags it shares with a single trace (model, prompt source, sampler, load)."""

    model: str
    prompts: str                    # JSON Lines, one {"prompt": text} per line ("id" optional)
    out: str                        # the run folder (re-running resumes)
    keep_traces: int = param(0, int, "with --prompts: keep the full traces of this many prompts, chosen evenly over "
                                     "the file (the others keep only their totals)", min=0)
    raw: bool = False               # do not apply the chat template
    seed: int = 0                   # prompt i uses seed + i (the same on any rank)
    sampler: str | None = None                          # default: the model family's own (Family.pick_sampler)
    sampler_args: dict = field(default_factory=dict)   # sampler fields over the model's defaults
    # the totals' units and Eq. 3 threshold ε, declared as `sinklens report` declares them
    units: str = param_like(ReportOptions, "units", help="with --prompts: score units of the totals (default "
                            f"{DEFAULT_UNITS}; a causal model's totals are also kept in {BASELINE_UNITS})")
    sink_eps: float = param_like(ReportOptions, "sink_eps", help="with --prompts: Eq. 3 threshold eps of the "
                                 "totals, in their units", old_flags=())
    dtype: str | None = None
    device: str | None = None
    load_args: dict = field(default_factory=dict)      # load()'s device_map / max_memory / offload_folder / random_init
    capture: Any = None             # a CaptureOptions (None: the default capture)
    progress: bool = False

    def __post_init__(self):
        self.model = recorded_model_name(self.model)
        check_fields(self)
        if self.capture is None:
            from sinklens.samplers.capture import CaptureOptions
            self.capture = CaptureOptions()
