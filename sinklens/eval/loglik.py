"""Log-likelihood of the reference answer, unmasked and with the sinks masked.

Measurable even when a model is too weak to get answers right. Two probes, each recorded with
its rule (`loglik.rule`, `loglik_l2r.rule`):

`reference_loglik` (the probe of two forwards): the input is prompt + reference; for a DLM the
reference positions are all mask tokens (log p(ref_i | prompt, masks)), for an ARM they are the
reference itself (teacher-forced, log p(ref_i | prompt, ref_<i)). Cheap, but the two model types
condition on different things, so its values cannot be compared across them.

`reference_loglik_l2r` (left to right, the same quantity for both): log p(ref_i | prompt, ref_<i)
summed over i, i.e. the likelihood of the reference under left-to-right decoding. Pass i feeds
prompt + ref_<i (a DLM: followed by mask tokens up to the reference's length, its state when it
decodes one token at a time; an ARM: nothing, its causal attention would not see them) and scores
position i. An ARM could do it in one pass; it runs the same R passes so that the sinks, too, are
chosen from the same input. R passes unmasked, 2R masked.

Masked, in both: one unmasked forward with capture ranks the sinks with the masking policy's own
rule (Eq. 3 / top-K, units, scope, control) over the column sums of all query rows; a second
forward blocks them for every query.
"""
from __future__ import annotations

import torch

from sinklens.attention.request import AttentionRequest
from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy

RULE_L2R = ("left to right: pass i = prompt + ref_<i (DLM: + masks to the reference's length), scores ref_i; "
            "sinks chosen per pass over the column sums of all rows of an unmasked pass, blocked for all queries")
RULE = ("probe: one unmasked pass over prompt+reference (DLM: reference masked), sinks chosen by the masking "
        "config over the column sums of all rows, blocked for all queries")


def _score(m, logits: torch.Tensor, ref: torch.Tensor, p: int) -> tuple[float, bool]:
    """(sum of log p(reference), reference == argmax everywhere) from logits (1, S, V);
    families with shifted logits (ARMs, Dream) predict position i at i - 1."""
    r = ref.shape[0]
    rows = logits[0, p - 1:p + r - 1] if m.family.shifted_logits else logits[0, p:p + r]           # (R, V)
    logp = torch.log_softmax(rows.float(), dim=-1)
    return float(logp.gather(-1, ref[:, None]).sum()), bool((logp.argmax(-1) == ref).all())


def _passes(m, x: torch.Tensor, p: int, config: MaskingConfig):
    """(unmasked logits, masked logits or None) of input x (1, S): the unmasked pass captures the
    attention the sinks are ranked by; the masked pass blocks them for every query."""
    probe = AttentionRequest(capture=True)
    unmasked = m.forward_logits(x, attention=probe)
    if not config.active:
        return unmasked, None
    policy = SinkMaskingPolicy(config, num_layers=m.num_layers, is_diffusion=m.is_diffusion, model=m)
    every_row = torch.ones(x.shape, dtype=torch.bool)                            # the probe summed all rows
    prompt = torch.arange(x.shape[1])[None] < p
    blocked = policy.rank(probe.received, queries=every_row, prompt=prompt).blocked
    return unmasked, m.forward_logits(x, attention=AttentionRequest(blocked=blocked, keep_self=config.keep_self))


@torch.no_grad()
def reference_loglik(m, prompt_ids: list[int], ref_ids: list[int], config: MaskingConfig) -> dict:
    if not ref_ids:
        raise ValueError("reference answer is empty after tokenisation")
    p = len(prompt_ids)
    ref = torch.tensor(ref_ids, dtype=torch.long)
    fill = [m.mask_id] * len(ref_ids) if m.is_diffusion else ref_ids
    x = torch.tensor([prompt_ids + fill], dtype=torch.long)                          # (1, S)
    out = {"tokens": len(ref_ids), "rule": RULE, "units": "nats (sum over reference tokens)"}
    unmasked, masked = _passes(m, x, p, config)
    out["unmasked"], out["greedy_unmasked"] = _score(m, unmasked, ref, p)
    if masked is not None:
        out["masked"], out["greedy_masked"] = _score(m, masked, ref, p)
    else:
        out["masked"], out["greedy_masked"] = out["unmasked"], out["greedy_unmasked"]
    return out


@torch.no_grad()
def reference_loglik_l2r(m, prompt_ids: list[int], ref_ids: list[int], config: MaskingConfig) -> dict:
    """sum_i log p(ref_i | prompt, ref_<i), unmasked and masked, the same definition for a DLM and an ARM."""
    if not ref_ids:
        raise ValueError("reference answer is empty after tokenisation")
    p, r = len(prompt_ids), len(ref_ids)
    total = {"unmasked": 0.0, "masked": 0.0}
    for i in range(r):
        # a DLM scores the mask at p + i; an ARM (shifted logits) reads ref_i off its last row, p + i - 1
        tail = [m.mask_id] * (r - i) if m.is_diffusion else []
        x = torch.tensor([prompt_ids + ref_ids[:i] + tail], dtype=torch.long)        # (1, p + i + len(tail))
        target = torch.tensor([ref_ids[i]], dtype=torch.long)
        unmasked, masked = _passes(m, x, p, config)
        total["unmasked"] += _score(m, unmasked, target, p + i)[0]
        total["masked"] += _score(m, masked if masked is not None else unmasked, target, p + i)[0]
    return {"tokens": r, "rule": RULE_L2R, "units": "nats (sum over reference tokens)", **total}
