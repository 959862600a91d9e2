"""Sink masking as a sampler hook (paper §4.3; SPEC §4).

The sinks of step t are taken from the attention captured at step t − 1 and blocked at step t:
their scores become `finfo(dtype).min` for every query (the attention function does this and
never leaves a query row with nothing to attend to, e.g. query 0 of a causal model).

Ranking (documented defaults; every result records `MaskingConfig.describe()`):
- `ranking="per_head"` (default, the paper's reading): per (layer, head) the top-K keys by
  received attention r_j (column sums, SPEC §2) are blocked for that head only.
- `ranking="global"`: keys ranked by r_j summed over all layers and heads; the top-K positions
  are blocked in every layer and head.
- `threshold=x` instead of K: per (layer, head), every key with r_j >= x is blocked.
- `step0="unmasked"` (default): step 0 has no previous map, so it runs unmasked (and captured);
  `step0="probe"`: an extra unmasked forward of step 0's input gives the map, and step 0 is
  already masked with its sinks.
- `keep_self`: a blocked key still receives attention from its own query row.
- ARM rule (`arm_rule`): `"newest"` (default, the paper's): sinks from the newest token's row
  of the previous step — the decode step's only query row, and at the prefill the last prompt
  row; `"prefix"`: column sums over all prefix rows (the sampler must re-capture the prefix,
  `capture_prefix=True`). The rule changes results a lot (SPEC §4), so it is recorded.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import torch

from sinklens.attention.request import AttentionRequest


@dataclass
class MaskingConfig:
    top_k: int = 1                      # K sinks blocked per (layer, head); 0 = no masking (capture only)
    threshold: float | None = None      # instead of K: block keys with r_j >= threshold (column-sum units)
    ranking: str = "per_head"           # "per_head" | "global"
    keep_self: bool = False
    step0: str = "unmasked"             # "unmasked" | "probe"
    arm_rule: str = "newest"            # ARM only: "newest" | "prefix"
    layers: tuple[int, ...] | None = None   # restrict blocking to these layers (None = all)

    def __post_init__(self):
        if self.top_k < 0:
            raise ValueError(f"top_k (--mask-topk) must be >= 0, got {self.top_k}")
        if self.ranking not in ("per_head", "global"):
            raise ValueError(f"ranking must be 'per_head' or 'global', got {self.ranking!r}")
        if self.step0 not in ("unmasked", "probe"):
            raise ValueError(f"step0 must be 'unmasked' or 'probe', got {self.step0!r}")
        if self.arm_rule not in ("newest", "prefix"):
            raise ValueError(f"arm_rule must be 'newest' or 'prefix', got {self.arm_rule!r}")
        if self.threshold is not None and self.ranking == "global":
            raise ValueError("threshold works per (layer, head); it cannot be combined with ranking='global'")
        if self.layers is not None:
            self.layers = tuple(int(l) for l in self.layers)

    @property
    def active(self) -> bool:
        return self.top_k > 0 or self.threshold is not None

    def describe(self, is_diffusion: bool = True) -> dict:
        d = asdict(self)
        d["units"] = "column_sum"
        if is_diffusion:
            d.pop("arm_rule")
        return d


class SinkMaskingPolicy:
    """Hook: `before_step` blocks last step's sinks, `after_step` ranks this step's."""

    wants_attention = True      # tells the sampler to capture attention at every step

    def __init__(self, config: MaskingConfig, *, num_layers: int, is_diffusion: bool = True, model=None):
        if config.step0 == "probe" and model is None:
            raise ValueError("step0='probe' needs the model (SinkMaskingPolicy(..., model=m)) for the probe pass")
        if config.layers is not None and any(not 0 <= l < num_layers for l in config.layers):
            raise ValueError(f"layers {config.layers} out of range for a model with {num_layers} layers")
        self.config, self.num_layers, self.is_diffusion, self.model = config, num_layers, is_diffusion, model
        self.reset()

    def reset(self) -> None:
        """Forget the previous step (call between generations)."""
        self._next: torch.Tensor | None = None     # (L, B, H, S_prev) bool, for the next step
        self.history: list[tuple[int, torch.Tensor]] = []   # (step, (N, 4) [layer, row, head, pos])

    # --- ranking ------------------------------------------------------------------------
    def check_num_keys(self, num_keys: int) -> None:
        """Raise before compute when K cannot be satisfied (K larger than the sequence)."""
        k = self.config.top_k
        if self.config.threshold is None and k > num_keys:
            raise ValueError(f"mask top-K = {k} is larger than the sequence ({num_keys} keys): choose K <= {num_keys}")

    def rank(self, received: torch.Tensor) -> torch.Tensor:
        """(L, B, H, S) received attention -> (L, B, H, S) bool keys to block."""
        cfg = self.config
        L, B, H, S = received.shape
        if cfg.threshold is not None:
            blocked = received >= cfg.threshold
        else:
            self.check_num_keys(S)
            blocked = torch.zeros(L, B, H, S, dtype=torch.bool, device=received.device)
            if cfg.ranking == "per_head":
                idx = received.topk(cfg.top_k, dim=-1).indices              # (L, B, H, K)
                blocked.scatter_(-1, idx, True)
            else:
                total = received.sum(dim=(0, 2))                             # (B, S)
                idx = total.topk(cfg.top_k, dim=-1).indices                  # (B, K)
                blocked[:, torch.arange(B)[:, None], :, idx] = True          # every layer and head
        if cfg.layers is not None:
            keep = torch.zeros(L, dtype=torch.bool, device=received.device)
            keep[list(cfg.layers)] = True
            blocked &= keep[:, None, None, None]
        return blocked

    # --- hook ---------------------------------------------------------------------------
    def before_step(self, step: int, tokens: torch.Tensor, is_masked: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> AttentionRequest:
        B, S = tokens.shape
        req = AttentionRequest(capture=True, keep_self=self.config.keep_self)
        if not self.is_diffusion and self.config.arm_rule == "newest" and step == 0:
            # Prefill: rank by the newest (last prompt) token's row only.
            req.query_mask = torch.zeros(B, S, dtype=torch.bool, device=tokens.device)
            req.query_mask[:, -1] = True
        if not self.config.active:
            return req
        if self._next is None and step == 0 and self.config.step0 == "probe":
            qmask = req.query_mask if req.query_mask is not None else attention_mask
            probe = AttentionRequest(capture=True, query_mask=qmask)
            self.model.forward_logits(tokens, attention_mask=attention_mask, attention=probe)
            self._next = self.rank(probe.received)
        if self._next is not None:
            blocked = self._next
            if blocked.shape[-1] < S:      # ARM: the newest key did not exist at the previous step
                pad = torch.zeros(*blocked.shape[:-1], S - blocked.shape[-1], dtype=torch.bool,
                                  device=blocked.device)
                blocked = torch.cat([blocked, pad], dim=-1)
            elif blocked.shape[-1] > S:
                raise ValueError(f"step {step} has {S} positions but the previous step had {blocked.shape[-1]}")
            req.blocked = blocked.to(tokens.device)
            self.history.append((step, req.blocked.nonzero().cpu()))
        return req

    def after_step(self, event) -> None:
        req = event.attention
        if not self.config.active:
            return
        if req is None or not req._received:
            raise RuntimeError("the masking policy needs the step's captured attention; the sampler "
                               "did not pass the request returned by before_step to the forward")
        self._next = self.rank(req.received)

    # --- what was masked ------------------------------------------------------------------
    def summary(self, row: int = 0, top: int = 10) -> dict:
        """Per generation: how many steps were masked, and the most often blocked positions."""
        counts, n = Counter(), 0
        for _, idx in self.history:
            sel = idx[idx[:, 1] == row]
            n += len(sel)
            counts.update(sel[:, 3].tolist())
        return {"steps_masked": len(self.history), "blocked_entries": n,
                "top_positions": [[p, c] for p, c in counts.most_common(top)]}
