"""Sink masking as a sampler hook (paper §4.3; docs/evaluation.md "The masking protocol").

The sinks of step t are taken from the attention of step t − 1 and blocked at step t: their
scores become `finfo(dtype).min` for every query (the attention function does this and never
leaves a query row with nothing to attend to, e.g. query 0 of a causal model).

The ranking source is what the keys *would* have received at step t − 1: the softmax over the
allowed keys before blocking, which the capture pass reduces alongside the real one
(`AttentionRequest.received_unblocked`). Ranking on the blocked step's own attention would see
the blocked sink at ~0, block the runner-up next, and free the real sink every other step.

Options (`MaskingConfig`, `masking/config.py`; every result records `MaskingConfig.describe()`).
The sink rule itself — Eq. 3, ε, the units, which keys each query could see — is the one of
sinklens/rule/, the same the report applies, so the report's sinks and the masking's Eq. 3 sinks
are one set on one step's attention (tests/test_rule_agreement.py):
- protocol `sinks="topk"` (default; the paper's "we select ε0, ε1 and ε2 to mask the top 1, 5
  and 10 sinks": ε lowered until K keys pass, i.e. the top-K keys of the head) or `sinks="eq3"`
  (stricter: the top-K among keys that pass Eq. 3 at `sink_eps`; a head without a sink blocks
  nothing).
- `units` (default `scaled_sum`, column sums scaled so the average visible key scores 1: the
  column sums r_j themselves wherever every visible key is a query, a DLM step or the ARM
  prefix rule; r_j × visible keys for an ARM's single newest row).
- `mask_k` K as a count, or `fraction`: K = ceil(fraction × visible keys); `threshold` instead
  of K: every candidate with score ≥ threshold.
- `scope`: "all" | "prompt" | "generated" (prompt = the positions that are real and unmasked
  at the first step).
- `control="random"`: block as many random non-sink keys per head instead (seeded; a random
  priority fixed for the generation), so "sinks matter" is told apart from "any masking hurts".
- `ranking`: "per_head" (default) or "global" (K positions by the mean over layers and heads,
  blocked in every layer and head); `layers`: restrict blocking to these layers.
- `step0`: "unmasked" (default; step 0 has no previous map) or "probe" (an extra unmasked
  forward ranks step 0's own sinks). `keep_self`: a blocked key still gets its own query's
  attention. `arm_rule` (ARM): "newest" (the newest token's row, the paper's) or "prefix"
  (every prefix row; the sampler must re-capture the prefix, `capture_prefix=True`).
"""
from __future__ import annotations

from dataclasses import astuple

import numpy as np
import torch

from sinklens.attention.request import AttentionRequest
from sinklens.masking.config import MaskingConfig  # re-exported: `from sinklens.masking.policy import MaskingConfig`
from sinklens.masking.select import Selection, select
from sinklens.masking.stats import MaskingStats
from sinklens.rule import np_rule
from sinklens.rule.spec import layer_visibilities

# The rule's coverage is a pure function of (summed rows, real keys, layout): remembered for every
# policy of the process (an eval makes one per sample; an ARM's recurs with each prefix length).
COVERAGE_CACHE = 1024
_coverages: dict = {}


def _np(x) -> np.ndarray:
    """A numpy view (CPU) of a tensor or array (bfloat16, which numpy lacks, as float32)."""
    if not isinstance(x, torch.Tensor):
        return np.asarray(x)
    if not x.is_cpu or x.requires_grad or x.dtype == torch.bfloat16:   # (is_cpu: device.type builds a string)
        x = x.detach().cpu()
        x = x.float() if x.dtype == torch.bfloat16 else x
    return x.numpy()


class SinkMaskingPolicy:
    """Hook: `before_step` blocks last step's sinks, `after_step` ranks this step's."""

    wants_attention = True      # tells the sampler to capture attention at every step
    wants_query_groups = False  # ranks on all summed rows: the masked / unmasked split is not needed
    wants_commit_prob = False   # nor the probabilities of committed tokens

    def __init__(self, config: MaskingConfig, *, num_layers: int, is_diffusion: bool = True, model=None):
        if config.step0 == "probe" and model is None:
            raise ValueError("step0='probe' needs the model (SinkMaskingPolicy(..., model=m)) for the probe pass")
        if config.layers is not None and any(not 0 <= l < num_layers for l in config.layers):
            raise ValueError(f"layers {config.layers} out of range for a model with {num_layers} layers")
        self.config, self.num_layers, self.is_diffusion, self.model = config, num_layers, is_diffusion, model
        # which keys each layer's queries could see: the model's own facts (windows, the causal
        # mask), as the trace records them for the report
        facts = getattr(model, "attention_layout", None) or {"causal": not is_diffusion}
        self.visibilities = layer_visibilities(num_layers, **facts)
        # the coverage cache's key for them, as plain values: hashed per step without a Python call per layer
        self._visibilities_key = tuple(astuple(v) for v in self.visibilities)
        self._layout = None   # (the last step's TraceLayout, its visibilities): _layout_visibilities
        self.reset()

    def reset(self, seed: int | None = None) -> None:
        """Forget the previous generation (call between generations); `seed` for the random control."""
        self._next: Selection | None = None     # what to block at the next step
        self._prompt: np.ndarray | None = None  # (B, >= S0) bool prompt positions, False past them
        self._priority: torch.Tensor | None = None   # (L, B, H, S) random control priorities
        self._gen = torch.Generator().manual_seed(self.config.seed if seed is None else int(seed))
        self.stats = MaskingStats()

    # --- ranking ------------------------------------------------------------------------
    def check_num_keys(self, num_keys: int) -> None:
        """Raise before compute when K is larger than the sequence (a typo, or use a share: 100%)."""
        cfg = self.config
        if cfg.threshold is None and cfg.fraction is None and cfg.mask_k > num_keys:
            raise ValueError(f"mask top-K = {cfg.mask_k} is larger than the sequence ({num_keys} keys): "
                             f"choose K <= {num_keys}")

    def _queries(self, B: int, S: int, real, query_positions=None) -> np.ndarray:
        """(B, S) bool rows whose attention was summed into the ranking source (real ones only)."""
        real = _np(real).astype(bool, copy=False)
        if query_positions is not None:
            q = np.zeros((B, S), bool)
            for b, pos in enumerate(query_positions):
                pos = _np(pos)
                if pos.size == 1:   # an ARM's decoding row: a plain index (numpy's fancy indexing cost its step ~30 us)
                    q[b, int(pos[0])] = True
                else:
                    q[b, pos.astype(np.int64, copy=False)] = True
            return q & real
        if not self.is_diffusion and self.config.arm_rule == "newest":
            q = np.zeros((B, S), bool)
            q[:, -1] = real[:, -1]
            return q
        return real

    def _priorities(self, L: int, B: int, H: int, S: int) -> np.ndarray:
        """Fixed random priorities per (layer, row, head, key), grown as an ARM's prefix grows."""
        have = 0 if self._priority is None else self._priority.shape[-1]
        if have < S:
            more = torch.rand(L, B, H, S - have, generator=self._gen)
            self._priority = more if self._priority is None else torch.cat([self._priority, more], dim=-1)
        return self._priority.numpy()

    def rank(self, received: torch.Tensor, *, real=None, queries=None, prompt=None, visibilities=None) -> Selection:
        """(L, B, H, S) ranking source -> Selection (blocked keys + Eq. 3 sinks) for the next step.

        real: (B, S) bool real keys (default all); queries: (B, S) bool summed query rows (default:
        the family's rule); prompt: (B, S) bool prompt positions (default: this generation's);
        visibilities: per layer, which keys a query could see (default: the model's facts).
        Tensors or arrays; the ranking itself runs in numpy (masking/select.py)."""
        L, B, H, S = received.shape
        real = np.ones((B, S), bool) if real is None else _np(real).astype(bool, copy=False)
        queries = self._queries(B, S, real) if queries is None else _np(queries).astype(bool, copy=False) & real
        prompt = None if prompt is None else _np(prompt).astype(bool, copy=False)
        return self._rank(_np(received).astype(np.float32, copy=False), real, queries, prompt, visibilities)

    def _rank(self, received: np.ndarray, real: np.ndarray, queries: np.ndarray, prompt: np.ndarray | None,
              visibilities) -> Selection:
        """`rank` on numpy arrays as it converts them (every step's `rank_event` has them so already);
        `queries` are real rows."""
        L, B, H, S = received.shape
        prompt = self._prompt_mask(B, S) if prompt is None else prompt
        scope = real if self.config.scope == "all" else (prompt if self.config.scope == "prompt" else ~prompt) & real
        visibilities = self.visibilities if visibilities is None else visibilities
        covs = [self._coverage(queries[b], real[b], visibilities) for b in range(B)]
        if self.config.sinks == "topk" and self.config.threshold is None and self.config.fraction is None \
                and self.config.mask_k > 1:   # every row has a real key: K = 1 always fits
            self.check_num_keys(int(real.sum(-1).min()))
        prio = self._priorities(L, B, H, S) if self.config.control == "random" else None
        # an ARM's next step has one key more (room for it: no pad at that step)
        return select(received, covs, scope, self.config, prio, room=0 if self.is_diffusion else 1)

    def _coverage(self, queries: np.ndarray, real: np.ndarray, visibilities) -> np_rule.Coverage:
        """The rule's coverage of one batch row (S,) bool summed rows / real keys, remembered: it is the
        same at every step of a DLM, and an ARM's recurs with each prefix length (making it anew was a
        third of the ranking's time)."""
        vis = self._visibilities_key if visibilities is self.visibilities else tuple(visibilities)
        key = (queries.tobytes(), real.tobytes(), queries.shape[0], vis)
        cov = _coverages.get(key)
        if cov is None:
            if len(_coverages) >= COVERAGE_CACHE:
                _coverages.clear()
            cov = _coverages[key] = np_rule.coverage(np.flatnonzero(queries), real, visibilities)
            for a in (cov.n_queries, cov.seen, cov.expected, cov.visible):
                a.flags.writeable = False   # shared by every later step with the same key
        return cov

    def _prompt_mask(self, B: int, S: int) -> np.ndarray:
        """(B, S) bool prompt positions of this generation (all True before its first step), read-only: a
        view of the prompt padded with False past it, grown by doubling as an ARM's canvas grows (a
        concatenation per step was a tenth of the ranking's time on a tiny model)."""
        if self._prompt is None:
            return np.ones((B, S), bool)
        if self._prompt.shape[-1] < S:
            grown = np.zeros((B, 2 * S), bool)
            grown[:, :self._prompt.shape[-1]] = self._prompt
            grown.flags.writeable = False   # a step's record holds its view: never changed
            self._prompt = grown
        return self._prompt[:, :S]

    # --- hook ---------------------------------------------------------------------------
    def before_step(self, step: int, tokens: torch.Tensor, is_masked: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> AttentionRequest:
        B, S = tokens.shape
        real = np.ones((B, S), bool) if attention_mask is None else _np(attention_mask).astype(bool)
        if self._prompt is None:       # the first step: the prompt is what is real and not masked
            self._prompt = real & ~_np(is_masked).astype(bool)
            self._prompt.flags.writeable = False
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
            self._next = self.rank(probe.received, real=real)
        if self._next is None:
            self.stats.skip()
            return req
        if self._next.blocked.shape[-1] > S:
            raise ValueError(f"step {step} has {S} positions but the previous step had {self._next.blocked.shape[-1]}")
        blocked = self._next.blocked_keys(S)   # ARM: the newest key did not exist at the previous step
        # copies: the sampler edits its canvas in place, and the record is made later (stats.py)
        self.stats.add(self._next, np.array(_np(tokens)), np.array(_np(is_masked), dtype=bool),
                       self._prompt_mask(B, S), real)
        req.blocked = blocked if tokens.is_cpu else blocked.to(tokens.device)
        return req

    def after_step(self, event) -> None:
        if self.config.active:
            self._next = self.rank_event(event)

    def rank_event(self, event) -> Selection:
        """The Selection for the step after `event` (a StepEvent whose request captured attention)."""
        req = event.attention
        if req is None or not req.has_received:
            raise RuntimeError("the masking policy needs the step's captured attention; the sampler "
                               "did not pass the request returned by before_step to the forward")
        source = _np(req.received_unblocked).astype(np.float32, copy=False)  # (L, B, H, S): what the keys would have received
        _, B, _, S = source.shape
        mask = getattr(event, "attention_mask", None)
        real = np.ones((B, S), bool) if mask is None else _np(mask).astype(bool, copy=False)
        queries = self._queries(B, S, real, getattr(event, "query_positions", None))
        # the step's own layout when the sampler states it (SDAR: blocks of its block_length, the
        # active block's rows), so masking and the report see the same keys; else the model's facts
        layout = getattr(event, "layout", None)
        visibilities = None if layout is None else self._layout_visibilities(layout)
        return self._rank(source, real, queries, None, visibilities)

    def _layout_visibilities(self, layout) -> list:
        """`layout.visibilities(num_layers)`, made once per layout object (a sampler hands the same one
        at every step): the policy's own list where they agree, whose coverage key is made already."""
        if self._layout is None or self._layout[0] is not layout:
            vis = layout.visibilities(self.num_layers)
            self._layout = (layout, self.visibilities if vis == self.visibilities else vis)
        return self._layout[1]

    # --- what was masked ------------------------------------------------------------------
    def summary(self, categorize=None, top: int = 10) -> dict:
        """Per generation: what was blocked (see sinklens.masking.stats); `categorize(token_id)`
        adds the share per token category."""
        return self.stats.summary(categorize, top)
