"""Log-likelihood of the reference answer, unmasked and with the sinks masked.

Measurable even when a model is too weak to get answers right. One rule for every model
(recorded in each result as `loglik.rule`):
- the input is prompt + reference; for a DLM the reference positions are all mask tokens
  (a one-step, fully-masked pseudo log-likelihood: log p(ref_i | prompt, masks));
- one unmasked forward with capture ranks the sinks with the masking policy's own rule
  (Eq. 3 / top-K, units, scope, control), over the column sums of all query rows;
- a second forward blocks them for every query; both passes score the reference tokens.
"""
from __future__ import annotations

import torch

from sinklens.attention.request import AttentionRequest
from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy

RULE = ("probe: one unmasked pass over prompt+reference (DLM: reference masked), sinks chosen by the masking "
        "config over the column sums of all rows, blocked for all queries")


def _score(m, logits: torch.Tensor, ref: torch.Tensor, p: int) -> tuple[float, bool]:
    """(sum of log p(reference), reference == argmax everywhere) from logits (1, S, V);
    families with shifted logits (ARMs, Dream) predict position i at i - 1."""
    r = ref.shape[0]
    rows = logits[0, p - 1:p + r - 1] if m.family.shifted_logits else logits[0, p:p + r]           # (R, V)
    logp = torch.log_softmax(rows.float(), dim=-1)
    return float(logp.gather(-1, ref[:, None]).sum()), bool((logp.argmax(-1) == ref).all())


@torch.no_grad()
def reference_loglik(m, prompt_ids: list[int], ref_ids: list[int], config: MaskingConfig) -> dict:
    if not ref_ids:
        raise ValueError("reference answer is empty after tokenisation")
    p = len(prompt_ids)
    ref = torch.tensor(ref_ids, dtype=torch.long)
    fill = [m.mask_id] * len(ref_ids) if m.is_diffusion else ref_ids
    x = torch.tensor([prompt_ids + fill], dtype=torch.long)                          # (1, S)
    probe = AttentionRequest(capture=True)
    out = {"tokens": len(ref_ids), "rule": RULE, "units": "nats (sum over reference tokens)"}
    out["unmasked"], out["greedy_unmasked"] = _score(m, m.forward_logits(x, attention=probe), ref, p)
    if config.active:
        policy = SinkMaskingPolicy(config, num_layers=m.num_layers, is_diffusion=m.is_diffusion, model=m)
        every_row = torch.ones(x.shape, dtype=torch.bool)                            # the probe summed all rows
        prompt = torch.arange(x.shape[1])[None] < p
        blocked = policy.rank(probe.received, queries=every_row, prompt=prompt).blocked
        req = AttentionRequest(blocked=blocked, keep_self=config.keep_self)
        out["masked"], out["greedy_masked"] = _score(m, m.forward_logits(x, attention=req), ref, p)
    else:
        out["masked"], out["greedy_masked"] = out["unmasked"], out["greedy_unmasked"]
    return out
