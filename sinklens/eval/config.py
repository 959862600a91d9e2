"""`EvalConfig`: the settings of one `sinklens eval` (paper Table 1) and the K values it masks.

Its `param` fields are the `sinklens eval` flags (`sinklens/cli/eval.py` builds one flag per
field with `sinklens/cli/fields.py`), so a new setting is one field here. Fields declared with
plain `field` are set by the caller (the sampler flags, --quiet). Field names are what a saved
run's config.json records, so they do not change. The masking settings are declared once, in
`MaskingConfig` (`param_like`). Torch-free at import (the command line's --help); the task table
is imported when a config is built.
"""
from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields

from sinklens.eval.rundir import recorded_model_name
from sinklens.masking.config import MaskingConfig
from sinklens.models.options import LoadOptions
from sinklens.params import MAX_SEED, check_value, flag_name, param, param_like
from sinklens.samplers.registry import SAMPLERS
from sinklens.sandbox import SandboxConfig, probe


def parse_k(k) -> int | str:
    """A K of --mask-topk: an integer count >= 0, or a share of the sequence written "N%"."""
    text = str(k).strip()
    if text.endswith("%"):
        k_spec(text)
        return text
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--mask-topk values must be integers >= 0 or shares like 1%, got {k!r}") from None
    if value < 0:
        raise ValueError(f"--mask-topk values must be integers >= 0 or shares like 1%, got {k!r}")
    return value


def k_spec(k) -> tuple[int, float | None]:
    """(count, fraction) of a parsed K: 5 -> (5, None); "2.5%" -> (0, 0.025)."""
    if isinstance(k, str) and k.endswith("%"):
        try:
            share = float(k[:-1]) / 100
        except ValueError:
            share = float("nan")
        if not 0 < share <= 1:
            raise ValueError(f"--mask-topk share must be in (0%, 100%], got {k!r}")
        return 0, share
    return int(k), None


def run_name(k, control: str) -> str:
    """Run directory name: k5, k2.5pct, k5-random."""
    name = f"k{str(k)[:-1]}pct" if isinstance(k, str) and k.endswith("%") else f"k{k}"
    return name if control == "none" else f"{name}-{control}"


@dataclass
class EvalConfig:
    model: str = param(MISSING, str, "alias, local folder, .gguf or hub id")
    task: str = param(MISSING, str,   # checked in __post_init__ (the task table is imported there)
                      "gsm8k | humaneval (paper Table 1) | arith (the tiny twins' held-out problems)")
    out: str = param(MISSING, str, "output directory (re-running resumes)")
    # K per (layer, head): a count, or "N%" of the sequence; 0 = unmasked. Not a `param` type:
    # cli/eval.py parses the comma list with parse_k (its flag is named after this field)
    mask_topk: tuple[int | str, ...] = (0,)
    limit: int | None = param(None, int, "first N samples only", min=1)
    data: str | None = param(None, str, "local JSONL (GSM8K test.jsonl / HumanEval problems; arith: a twin's "
                                        "training config)")
    shots: int = param(8, int, "GSM8K chain-of-thought exemplars (0 = zero-shot)", min=0, max=8)
    chat: str = param("auto", str, "use the chat template (auto: when the tokenizer has one)",
                      choices=("auto", "on", "off"))
    gen_length: int | None = param(None, int, "tokens to generate, any sampler (default: a sinklens twin's training "
                                              "length, else the task's, else the paper's for the task and family)",
                                   min=1)
    sampler: str | None = param(None, str, "the sampler to run (default: the model family's own; llada21: LLaDA2.1's "
                                           "editing sampler on an llada2_moe checkpoint)")
    sampler_args: dict = field(default_factory=dict)  # sampler fields over the task preset, e.g. {"steps": 64}
    seed: int = param(0, int, "sample i uses seed + i (the same on any rank)", min=0, max=MAX_SEED)
    dtype: str | None = param(None, str, "float32 | bfloat16 | float16 (default: as stored)")
    device: str | None = param(None, str, "e.g. cpu, cuda:0 (default: the launcher's device, else cpu)")
    random_init: int | None = param_like(LoadOptions, "random_init")   # the results go to OUT/<model>-random-init-<seed>/
    mode: str | None = param_like(LoadOptions, "mode")   # a dual checkpoint's mode: the results go to OUT/<model>-<mode>/
    # the masking settings, declared in MaskingConfig (type, choices, help, default); the run's
    # MaskingConfig is built from them in `masking()`. Every masking flag is --mask-*; the old
    # spellings still work with a deprecation note, but --threshold: it is the sampler's commit
    # threshold (LLaDA2, Fast-dLLM) here as in generate and trace
    mask_sinks: str = param_like(MaskingConfig, "sinks")
    sink_eps: float = param_like(MaskingConfig, "sink_eps", flag="--mask-eps", old_flags=("--sink-eps", "--eps"))
    mask_units: str = param_like(MaskingConfig, "units")
    mask_scope: str = param_like(MaskingConfig, "scope")
    mask_control: str = param_like(MaskingConfig, "control")
    ranking: str = param_like(MaskingConfig, "ranking", flag="--mask-ranking", old_flags=("--ranking",))
    threshold: float | None = param_like(MaskingConfig, "threshold", min=None, gt=0,   # 0 would block every key
                                         flag="--mask-threshold")
    keep_self: bool = param_like(MaskingConfig, "keep_self", flag="--mask-keep-self", old_flags=("--keep-self",))
    step0: str = param_like(MaskingConfig, "step0", flag="--mask-step0", old_flags=("--step0",))
    arm_rule: str = param_like(MaskingConfig, "arm_rule", flag="--mask-arm-rule", old_flags=("--arm-rule",))
    loglik: bool = param(True, bool, "score the reference answer's log-likelihood (--no-loglik: skip it)",
                         flag="--loglik")
    loglik_l2r: bool = param(False, bool, "also score it left to right, the same way for DLMs and ARMs "
                                          "(R forwards per sample, 2R masked; docs/evaluation.md)")
    sandbox_timeout: float = param(10.0, float, "seconds per HumanEval check", gt=0)
    sandbox: str = param("auto", str, "HumanEval's sandbox: auto = bubblewrap, refused without it; fallback = an "
                                      "audit hook, no security boundary, only by name (docs/evaluation.md)",
                         choices=("auto", "bwrap", "fallback"))
    attention_stats: bool = param(False, bool, "also trace every generation and keep per-(layer, head) sink totals "
                                               "per row in <row>/corpus/corpus.jsonl (docs/corpus.md)")
    keep_traces: int = param(0, int, "with --attention-stats: samples per row whose full trace is kept", min=0)
    progress: bool = True               # progress bars (the command line: off with --quiet)

    def sandbox_config(self) -> SandboxConfig:
        """The judge's settings; for a task that runs code, probes the sandbox first: raises
        SandboxUnavailable (one line: what to install, or to pass --sandbox fallback)."""
        from sinklens.eval.tasks import get_task

        config = SandboxConfig(timeout=self.sandbox_timeout, cpu_seconds=int(self.sandbox_timeout) + 1,
                               mode=self.sandbox)
        if get_task(self.task).sandboxed:
            probe(config.mode, config.network, config.tmpfs_bytes)
        return config

    def __post_init__(self):
        from sinklens.eval.tasks import get_task

        task = get_task(self.task)                            # unknown task -> clear error first
        self.model = recorded_model_name(self.model)
        # each K once (a K listed twice ran its row twice, the second refused by the first's lock), the
        # unmasked run first: the masked rows' outcome KL reads its log-probs ("n/a" when it ran later)
        ks = dict.fromkeys(parse_k(k) for k in self.mask_topk)
        self.mask_topk = tuple(sorted(ks, key=lambda k: k != 0))
        if not self.mask_topk:
            raise ValueError("--mask-topk must list at least one K (e.g. 0,1,5,10 or 1%)")
        # every `param` field against its type and range, named by its flag ("--limit must be a
        # positive integer, got 0"): 0 and negative values are errors, never "the default"
        for f in fields(self):
            if "type" in f.metadata:
                check_value(flag_name(f.name, f.metadata), getattr(self, f.name), f.metadata)
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise ValueError(f"--sampler must be one of {', '.join(sorted(SAMPLERS))}, got {self.sampler!r}")
        check_sampler_args(self.sampler_args)
        # a flag another task reads would be ignored here without a word: refused (its default, and
        # --shots 0, "no exemplars", hold for every task)
        default = {f.name: f.default for f in fields(self)}
        if self.shots not in (0, default["shots"]) and not task.takes_shots:
            raise ValueError(f"--shots {self.shots}: task {self.task} has no few-shot exemplars (--shots is GSM8K's)")
        if self.sandbox_timeout != default["sandbox_timeout"] and not task.sandboxed:
            raise ValueError(f"--sandbox-timeout {self.sandbox_timeout:g}: task {self.task} runs no code "
                             "(--sandbox-timeout is HumanEval's)")
        if self.sandbox != default["sandbox"] and not task.sandboxed:
            raise ValueError(f"--sandbox {self.sandbox}: task {self.task} runs no code (--sandbox is HumanEval's)")
        if self.mask_control != "none" and all(k == 0 for k in self.mask_topk):
            raise ValueError(f"--mask-control {self.mask_control} adds a control run beside each masked K, and "
                             "--mask-topk has none (only 0): add a K, e.g. --mask-topk 0,1")
        if self.keep_traces and not self.attention_stats:
            raise ValueError("--keep-traces keeps traces of --attention-stats runs: add --attention-stats")
        if self.loglik_l2r and not self.loglik:
            raise ValueError("--loglik-l2r scores the reference answer too: it cannot go with --no-loglik")
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise ValueError(f"--out {self.out!r} is a file; expected a directory")
        if self.data is not None and os.path.isdir(self.data) and not task.data_folder:
            raise ValueError(f"--data {self.data!r} is a folder; expected a JSONL file")
        if self.data is not None and not os.path.exists(self.data):
            raise FileNotFoundError(f"--data {self.data!r} does not exist (expected a JSONL file)")
        for k, control in self.runs():                        # validates every masking option
            self.masking(k, control)

    def runs(self) -> list[tuple[int | str, str]]:
        """(K, control) of every run: each masked K once with the sinks, and once with the random
        control beside it when --mask-control random."""
        out = []
        for k in self.mask_topk:
            out.append((k, "none"))
            if self.mask_control != "none" and k not in (0, "0"):
                out.append((k, self.mask_control))
        return out

    def masking(self, k: int | str, control: str = "none") -> MaskingConfig:
        """The MaskingConfig of the run (K, control)."""
        count, fraction = k_spec(k)
        active = count > 0 or fraction is not None
        return MaskingConfig(mask_k=count, fraction=fraction, threshold=self.threshold if active else None,
                             sinks=self.mask_sinks, sink_eps=self.sink_eps, units=self.mask_units, scope=self.mask_scope,
                             control=control, seed=self.seed, ranking=self.ranking, keep_self=self.keep_self,
                             step0=self.step0, arm_rule=self.arm_rule)


def check_sampler_args(args: dict) -> None:
    """Each name must be a field of some registered sampler and its value allowed there (which
    sampler runs is known only once the model is loaded; `sampler_settings` checks the rest)."""
    from sinklens.samplers.registry import SAMPLERS

    known: dict[str, list] = {}  # name -> that field in every sampler having it (ranges may differ)
    for cls in SAMPLERS.values():
        for f in fields(cls):
            known.setdefault(f.name, []).append(f)
    for name, value in args.items():
        if name not in known:
            raise ValueError(f"unknown sampler argument {name!r}; known: {sorted(known)}")
        errors = []
        for f in known[name]:  # allowed by one sampler is enough here
            try:
                check_value(name, value, f.metadata)
                break
            except ValueError as err:
                errors.append(err)
        else:
            raise errors[0]
