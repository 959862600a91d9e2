"""Fast-dLLM's decoding for LLaDA (NVlabs/Fast-dLLM `llada/generate.py`): `generate` with a
confidence threshold, `generate_with_prefix_cache` and `generate_with_dual_cache`, step for step.

Per block of `block_length` positions:
  cache="none"    every step is a forward of the whole canvas (as LLaDA's generate());
  cache="prefix"  step 0 is a forward of the whole canvas that also stores every position's
                  K/V; only the prefix [0, start) is kept. Later steps feed the rows [start, S)
                  (the block and all later, still masked, positions) and attend to the cached
                  prefix plus themselves;
  cache="dual"    step 0 as for prefix, but every position is kept; later steps feed only the
                  block [start, end) and attend to the cached prefix, their own fresh keys and
                  the cached suffix (sinklens/samplers/kvcache.py).
The cache is refreshed at the first step of each block, so the cached keys of a finished block
come from the forward that saw it finished; the cached suffix (dual) holds masks throughout.

Commits per step (`get_transfer_index`): candidates are the argmax of Gumbel-perturbed logits
(float64, as LLaDA); confidence is the candidate's float64 softmax probability (`low_confidence`)
or uniform noise (`random`), over the block's masked positions (step 0: every masked position up
to the block's end, as LLaDA). Without a threshold the block's fixed schedule is followed; with
one, the most confident position always commits and every other one whose confidence reaches
the threshold too, and a block runs until it has no [MASK] left.

Kept from the official code on purpose (they decide which tokens come out, or how many steps):
- after the refreshing step 0 at least one cached step runs, even when step 0 finished the
  block (with a threshold that step commits nothing; it is still a step in the trace);
- the prefix-cache steps draw the Gumbel noise twice when temperature > 0 (the official code
  computes an unused `x0` first), so the RNG stream matches;
- a batch of one prompt without padding (the official functions build a (1, S) canvas and
  their model ignores padding).
The official schedule overruns its end (IndexError) when a block still holds [MASK] after its
steps (a sampled token was the mask id itself); here that is a one-line ValueError.

`factor` (newer Fast-dLLM, `get_transfer_index_dynamic` of llada/generate.py at f6b35ec; the uncached
`generate` only, whose loop that version left as it was): instead of a threshold, the n most confident
masked positions of the block commit while the n-th reaches 1 - factor / (n + 1) (`factor_index`); the
block runs until it has no [MASK] left. Its cached loops changed in that version (no forward after a
refresh that finished the block), so factor with a cache is refused rather than mixed with this file's.

Trace: one record per forward. `tokens` is the whole canvas, which is also the keys every step
sees (cached or fresh, in position order); `query_positions` are the rows that were computed
(step 0: all; then the suffix or the block). Every key is visible to every query (bidirectional),
so the sink rule counts the cached keys as visible keys, and blocked keys stay blocked for the
computed rows whether they come from the cache or not (masking). `keep_self` masking with the
dual cache is refused: the attention function aligns a query with its own key from the end of
the keys, which the dual cache's block (mid-sequence) breaks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.kvcache import StepCache, fast_start
from sinklens.samplers.llada.config import LLaDAConfig
from sinklens.samplers.llada.gumbel import add_gumbel_noise
from sinklens.samplers.schedules import spread_masks
from sinklens.samplers.steps import GenerateOutput, attention_is_causal, steps
from sinklens.trace.layout import TraceLayout


def candidates(logits: torch.Tensor, temperature: float, remasking: str, mask_index: torch.Tensor,
               x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both of Fast-dLLM's transfer rules start alike: each fed position's candidate token (Gumbel
    argmax; x where not masked) and its confidence (its probability in float64, or a uniform draw for
    random remasking; -inf where not masked). Returns (x0 (B, L), confidence (B, L))."""
    x0 = add_gumbel_noise(logits, temperature).argmax(dim=-1)  # (B, L)
    if remasking == "low_confidence":
        p = F.softmax(logits.to(torch.float64), dim=-1)
        x0_p = torch.gather(p, -1, x0[..., None]).squeeze(-1)  # (B, L) float64
    else:  # random
        x0_p = torch.rand((x0.shape[0], x0.shape[1]), device=x0.device)
    x0 = torch.where(mask_index, x0, x)
    return x0, torch.where(mask_index, x0_p, torch.full_like(x0_p, -torch.inf))


def transfer_index(logits: torch.Tensor, temperature: float, remasking: str, mask_index: torch.Tensor,
                   x: torch.Tensor, quota: torch.Tensor | None, threshold: float | None):
    """Fast-dLLM's get_transfer_index over the fed rows: logits (B, L, V), mask_index / x (B, L);
    quota (B,) tokens to commit (None with a threshold). Returns (x0 (B, L), transfer (B, L) bool)."""
    x0, confidence = candidates(logits, temperature, remasking, mask_index, x)
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    k = mask_index.sum(dim=1) if threshold is not None else quota  # (B,)
    for j in range(confidence.shape[0]):
        values, idx = torch.topk(confidence[j], k=int(k[j]))
        transfer[j, idx] = True
        if threshold is not None:
            transfer[j, idx[1:][values[1:] < threshold]] = False  # the most confident always commits
    return x0, transfer


def factor_index(logits: torch.Tensor, temperature: float, remasking: str, mask_index: torch.Tensor,
                 x: torch.Tensor, factor: float):
    """Newer Fast-dLLM's get_transfer_index_dynamic: candidates and confidences as `transfer_index`; then
    with the row's N masked confidences sorted c_1 >= ... >= c_N, commit the top n, where n is the first
    position whose c_n falls below 1 - factor / (n + 1) (c_1 always passes), or all N if none does.
    Kept as the official: a first failure at the last position (n = N) commits all N too."""
    x0, confidence = candidates(logits, temperature, remasking, mask_index, x)
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    for j in range(confidence.shape[0]):
        ranked = confidence[j][mask_index[j]].sort(descending=True).values  # (N,) c_1 >= ... >= c_N
        bars = [-1.0] + [1 - factor / (n + 1) for n in range(2, len(ranked) + 1)]  # c_1 always passes
        # first failure (0-based); the comparison in the confidences' dtype, as the official's (float32 for random)
        n = next((i for i in range(1, len(ranked)) if bool(ranked[i] < bars[i])), len(ranked))
        n = len(ranked) if n == len(ranked) - 1 else n  # the official's last-position quirk
        transfer[j, torch.topk(confidence[j], k=n).indices] = True
    return x0, transfer


@torch.no_grad()
def sample_fast(model, input_ids, config: LLaDAConfig, attention_mask=None, *, trace=None, hook=None,
                capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """Fast-dLLM's LLaDA decoding (see the module docstring). input_ids (1, P), no padding."""
    c = config
    what = f"factor={c.factor!r}" if c.factor is not None else f"cache={c.cache!r} / threshold={c.threshold!r}"
    x, input_ids, mask_id, args, P, S = fast_start(
        model, input_ids, attention_mask, c, c.gen_length, what, one_prompt="batch 1, as Fast-dLLM's generate functions",
        padding_why="Fast-dLLM's LLaDA ignores the attention mask", needs_bidirectional=c.cache != "none")
    device = x.device
    bl, steps_per_block = c.block_length, c.steps // c.num_blocks

    layout = TraceLayout(causal=attention_is_causal(model), prompt_length=P,
                         block_length=bl if bl < c.gen_length else None,
                         query_rows="all" if c.cache == "none" else "block")

    real = torch.ones_like(x, dtype=torch.bool)
    with steps(model, capture, trace, hook, name="llada", args=args, input_ids=input_ids, seq_len=S, layout=layout,
               total=c.steps, progress=progress, layout_to_hooks=True) as run:
        for b in range(c.num_blocks):
            start, end = P + b * bl, P + (b + 1) * bl
            schedule = spread_masks(x[:, start:end] == mask_id, steps_per_block)  # (1, steps_per_block)
            cache = None if c.cache == "none" else StepCache()
            i = 0
            while True:
                if c.threshold is None and c.factor is None and i == steps_per_block:
                    raise ValueError(f"block {b} still holds [MASK] after {steps_per_block} steps (a sampled token "
                                     "was the mask id itself); Fast-dLLM's schedule fails here too (IndexError)")
                cached = cache is not None and i > 0
                r0 = start if cached else 0  # fed rows [r0, r1)
                r1 = end if cached and c.cache == "dual" else S
                rows = x[:, r0:r1]  # (1, L) a view: commits land in x
                mask_index = rows == mask_id
                mask_index[:, end - r0:] = False  # later blocks wait
                is_masked = x == mask_id  # (1, S) the canvas' mask state fed to the model
                hook_req = run.instructions(x, is_masked, real)
                if cached and c.cache == "dual" and hook_req is not None and hook_req.keep_self:
                    raise ValueError("keep_self masking cannot be combined with cache='dual' (the block's queries sit "
                                     "mid-sequence); use cache='prefix' or keep_self=False")
                req = run.record(hook_req, torch.ones_like(rows, dtype=torch.bool), rows == mask_id)  # (1, L) queries
                if cached:
                    cache.read_at(start)
                    logits = model.forward_cached(rows, None, torch.arange(r0, r1, device=device)[None], cache,
                                                  attention=req, first_row=r0).float()  # (1, L, V)
                    if c.cache == "prefix":
                        add_gumbel_noise(logits, c.temperature)  # the official unused x0: one more RNG draw
                elif cache is not None:  # the refreshing step 0: the whole canvas, every K/V stored
                    logits = model.forward_cached(x, None, torch.arange(S, device=device)[None], cache,
                                                  attention=req).float()  # (1, S, V)
                    if c.cache == "prefix":
                        cache.keep(start)
                else:
                    logits = model.forward_logits(x, attention=req)  # (1, S, V)
                if c.factor is not None:
                    x0, transfer = factor_index(logits, c.temperature, c.remasking, mask_index, rows, c.factor)
                else:
                    quota = None if c.threshold is not None else schedule[:, i]
                    x0, transfer = transfer_index(logits, c.temperature, c.remasking, mask_index, rows, quota,
                                                  c.threshold)
                rows[transfer] = x0[transfer]
                run.step(x, is_masked, logits, F.pad(transfer, (r0, S - r1)), after=x, block=(start, end),
                         attention_mask=real, query_positions=[torch.arange(r0, r1)])
                i += 1
                # the official loops test for a finished block after every step but the refreshing one
                if not (cache is not None and i == 1) and not bool((x[:, start:end] == mask_id).any()):
                    break
    return run.output(x)
