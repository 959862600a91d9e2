"""Does a sink that stays a sink stay blocked? Persistence of the masking rule on the twins.

For one masking config, two numbers over held-out problems:
- `blocked`: of the keys blocked at step t − 1, the share blocked again at step t (masked run);
- `unmasked`: the same rule applied to an *unmasked* run's attention, without blocking anything:
  of the keys it would select at t − 1, the share it selects again at t (for K = 1 top-K, this is
  the stability of each head's top-1 key).
A faithful protocol keeps `blocked` close to `unmasked` (the bar tests/test_masking_protocol.py holds: ≥ 0.8 ×). Ranking on
the blocked step's own attention gave 0.00 for K = 1 on the DLM twin: the blocked sink read ~0
and the runner-up was blocked next.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy
from sinklens.masking.stats import MaskingStats
from sinklens.samplers.capture import CaptureOptions


class _DryRun:
    """A hook that applies the masking rule to each step's attention but blocks nothing."""

    wants_attention = True

    def __init__(self, policy: SinkMaskingPolicy):
        self.policy, self.stats = policy, MaskingStats()

    def before_step(self, step, tokens, is_masked, attention_mask=None):
        real = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if self.policy._prompt is None:
            self.policy._prompt = (real & ~is_masked.bool()).cpu().numpy()
        self._tokens, self._masked, self._real = tokens.cpu().clone(), is_masked.bool().cpu().clone(), real.cpu().clone()
        return None

    def after_step(self, event) -> None:
        sel = self.policy.rank(event.attention.received, real=self._real,
                               queries=self.policy._queries(*self._tokens.shape, self._real.numpy(), event.query_positions))
        B, S = self._tokens.shape
        self.stats.add(sel, self._tokens.numpy(), self._masked.numpy(), self.policy._prompt_mask(B, S), self._real.numpy())


def persistence(model, prompts: list[list[int]], config: MaskingConfig, sampler_kwargs: dict) -> dict:
    """{"blocked", "unmasked", "ratio", pairs...} for `config` over `prompts` (token id lists)."""
    masked, dry = MaskingStats(), MaskingStats()
    capture = CaptureOptions(query_groups=False)
    for i, ids in enumerate(prompts):
        x = torch.tensor([ids])
        policy = SinkMaskingPolicy(config, num_layers=model.num_layers, is_diffusion=model.is_diffusion, model=model)
        policy.reset(seed=i)
        model.generate(x, hook=policy, capture=capture, **sampler_kwargs)
        _merge(masked, policy.stats)
        probe = SinkMaskingPolicy(replace(config, control="none"), num_layers=model.num_layers,
                                  is_diffusion=model.is_diffusion, model=model)
        hook = _DryRun(probe)
        model.generate(x, hook=hook, capture=capture, **sampler_kwargs)
        _merge(dry, hook.stats)
    b = masked.kept / masked.prev_total if masked.prev_total else None
    u = dry.kept / dry.prev_total if dry.prev_total else None
    return {"blocked": b, "unmasked": u, "ratio": (b / u) if b is not None and u else None,
            "blocked_pairs": masked.prev_total, "unmasked_pairs": dry.prev_total,
            "blocked_share_of_keys": masked.entries / masked.key_slots if masked.key_slots else None,
            "eq3_sink_share": masked.sinks / masked.entries if masked.entries else None}


def _merge(into: MaskingStats, part: MaskingStats) -> None:
    part.flush()
    for name in ("entries", "key_slots", "sinks", "kept", "prev_total"):
        setattr(into, name, getattr(into, name) + getattr(part, name))


def twins_persistence(n: int = 3, configs: dict[str, MaskingConfig] | None = None, progress: bool = False,
                      models: list | None = None) -> list[dict]:
    """Persistence on the shipped twins (default: tiny-dlm and tiny-arm; `models`: DemoModels), `n`
    held-out problems, their own samplers and settings."""
    from sinklens.models.loader import load
    from sinklens.eval.arith import heldout_problems
    from sinklens.experiments.demo_model import DemoModel
    from sinklens.experiments.twins import LOAD, arm_sampler, dlm_sampler

    configs = configs or {"topk K=1": MaskingConfig(sinks="topk", mask_k=1), "eq3 K=1": MaskingConfig(sinks="eq3", mask_k=1),
                          "topk K=5": MaskingConfig(sinks="topk", mask_k=5)}
    rows = []
    models = models or [DemoModel("tiny-dlm", "tiny-dlm", dlm_sampler(), dict(LOAD)),
                        DemoModel("tiny-arm", "tiny-arm", arm_sampler(), dict(LOAD))]
    for dm in models:
        m, name, sampler = load(dm.name, **dm.load_kwargs), dm.label, dm.sampler_kwargs
        prompts = [m.apply_chat_template(p.question) for p in heldout_problems(n)]
        for label, cfg in configs.items():
            r = persistence(m, prompts, cfg, sampler)
            rows.append({"model": name, "rule": label, **r})
            if progress:
                said = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
                print(f"{name} {label}: blocked persistence {said(r['blocked'])}, unmasked {said(r['unmasked'])}")
    return rows
