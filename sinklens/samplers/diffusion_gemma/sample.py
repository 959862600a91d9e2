"""DiffusionGemma's block-diffusion sampler (transformers' DiffusionGemmaGenerationMixin.generate),
written out step by step so every denoising step can be traced and hooked.

Outer loop, one canvas of C = canvas_length tokens at a time (ceil(max_new_tokens / C) canvases):
  1. the causal encoder appends the uncached prefix (the prompt, then the last finished canvas)
     to the KV cache;
  2. the canvas starts as C uniformly random token ids (there is no mask token);
  3. denoising steps n = N .. 1 (N = max_denoising_steps), each:
       logits of the canvas from the bidirectional decoder (queries: the canvas; keys: the cache
       + the canvas), self-conditioned on the previous step's logits;
       temperature T_n = t_min + (t_max - t_min) * n / N (float32, as transformers computes it);
       a token sampled per position from softmax(logits / T_n); its argmax kept as the draft;
       accept the lowest-entropy positions while (their summed entropy - the largest one)
       <= entropy_bound; every position not accepted *this* step gets a fresh random token;
       stop the canvas early when its argmax held for `stability_threshold` steps and the mean
       entropy is below `confidence_threshold`;
  4. the canvas's argmax draft is appended; a row that produced EOS is finished (later tokens
     become pad); stop when every row has finished.
RNG draws, in transformers' order: one randint (B, C) per canvas, then per step one multinomial
(B*C draws) and one randint (B, C) for the renoising. Seeded, the tokens equal transformers'
`generate` (tests/test_diffusion_gemma.py).

Trace: one record per denoising step. The step's canvas is `tokens[P_k:]` (P_k = prefix length
so far); `is_masked` marks the canvas positions fed as noise (not accepted at the previous step:
"not yet accepted" plays the role of "masked"); `revealed` = accepted at this step; the queries
are the canvas rows, the keys every prefix and canvas position (a sliding-window layer sees only
the last window of the prefix: earlier keys receive 0 there).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sinklens.samplers.capture import CaptureOptions
from sinklens.samplers.diffusion_gemma.config import DiffusionGemmaSamplerConfig
from sinklens.samplers.steps import GenerateOutput, attention_is_causal, check_inputs, steps
from sinklens.trace.layout import TraceLayout


def resolve(config: DiffusionGemmaSamplerConfig, model, prompt_length: int) -> dict:
    """Every setting: the config's value, else the checkpoint's generation_config.json, else
    transformers' default (None stays None only for eos_token_id). A checkpoint that stores
    `max_length` (prompt + generation) gets it whenever max_new_tokens is transformers' default
    value, as `generate` reads it (even when that value was passed)."""
    gen = getattr(model.model, "generation_config", None)
    stored = {name: getattr(gen, name, None) for name in (*config.DEFAULTS, "eos_token_id", "pad_token_id")}
    stored["entropy_bound"] = getattr(getattr(gen, "sampler_config", None), "entropy_bound", None)
    out = {}
    for name, default in (*config.DEFAULTS.items(), ("eos_token_id", None), ("pad_token_id", None)):
        value = getattr(config, name)
        value = stored[name] if value is None else value
        out[name] = default if value is None else value
    max_length = getattr(gen, "max_length", None)
    if max_length and out["max_new_tokens"] == config.DEFAULTS["max_new_tokens"]:
        out["max_new_tokens"] = max_length - prompt_length
    return out


def temperature(t_min: float, t_max: float, step: int, steps: int) -> torch.Tensor:
    """Linear schedule; `step` counts down N..1. Computed on an int32 step tensor, as transformers
    does (a float64 Python expression would round differently)."""
    n = torch.tensor(step, dtype=torch.int32)
    return t_min + ((t_max - t_min) * (n / steps))


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """(B, C, V) -> (B, C) entropy of softmax(logits), as torch.distributions computes it."""
    return torch.distributions.Categorical(logits=logits).entropy()


def accept(logits: torch.Tensor, entropy_bound: float) -> torch.Tensor:
    """(B, C) bool: the k lowest-entropy positions with sum_{i<=k} H_i - max_{i<=k} H_i <= bound
    (an upper bound on their joint mutual information: approximately independent tokens)."""
    h = entropy(logits)  # (B, C)
    h_sorted, order = torch.sort(h, dim=-1, descending=False)
    ok = torch.cumsum(h_sorted, dim=-1) - h_sorted <= entropy_bound  # sorted ascending: the max is the last
    return torch.scatter(torch.zeros_like(ok), dim=-1, index=order, src=ok)


class StableAndConfident:
    """Per row: the argmax canvas equal for `threshold` steps and mean entropy < `confidence`."""

    def __init__(self, threshold: int, confidence: float):
        self.threshold, self.confidence, self.history = threshold, confidence, None

    def reset(self) -> None:  # a new canvas
        self.history = None

    def __call__(self, argmax: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        B = argmax.shape[0]
        if self.threshold == 0:
            stable = torch.ones(B, dtype=torch.bool, device=argmax.device)
        else:
            if self.history is None:  # (threshold, B, C) last argmax canvases, -1 = none yet
                self.history = torch.full((self.threshold, *argmax.shape), -1, dtype=argmax.dtype, device=argmax.device)
            stable = (self.history == argmax[None]).all(dim=-1).all(dim=0)
            self.history = torch.roll(self.history, shifts=-1, dims=0)
            self.history[-1] = argmax
        return stable & (entropy(logits).mean(dim=-1) < self.confidence)


@torch.no_grad()
def sample(model, input_ids, config: DiffusionGemmaSamplerConfig, attention_mask=None, *, trace=None, hook=None,
           capture: CaptureOptions | None = None, progress: bool = False) -> GenerateOutput:
    """DiffusionGemma generation. input_ids (B, P), left-padded with attention_mask (B, P)."""
    s = resolve(config, model, torch.as_tensor(input_ids).shape[-1])
    dg = model.family.ops  # the model's encoder / decoder passes (sinklens/models/diffusion_gemma.py)
    if dg is None or not hasattr(dg, "denoise"):
        raise ValueError(f"the diffusion_gemma sampler needs a DiffusionGemma checkpoint, got family {model.family.name!r}")
    C = model.model.config.canvas_length
    V = model.model.config.get_text_config().vocab_size
    N = s["max_denoising_steps"]
    n_canvases = max(math.ceil(s["max_new_tokens"] / C), 0)  # a stored max_length <= the prompt: none
    P0 = torch.as_tensor(input_ids).shape[-1]
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, P0 + n_canvases * C,
                                                  getattr(model, "max_length", None))
    B, device = input_ids.shape[0], input_ids.device
    eos = s["eos_token_id"]
    eos = None if eos is None else torch.tensor([eos] if isinstance(eos, int) else list(eos), device=device)
    pad = s["pad_token_id"]

    layout = TraceLayout(causal=attention_is_causal(model), prompt_length=P0, block_length=C, query_rows="block")

    real = torch.ones(B, P0, dtype=torch.bool, device=device) if attention_mask is None else attention_mask.bool()
    cache = dg.new_cache(model)
    seq = input_ids  # (B, P_k): prompt + finished canvases
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    new_tokens = seq  # the part of `seq` the encoder has not seen yet
    stopper = None
    if s["stability_threshold"] is not None and s["confidence_threshold"] is not None:
        stopper = StableAndConfident(s["stability_threshold"], s["confidence_threshold"])
    embed_dtype = model.model.model.decoder.embed_tokens.weight.dtype
    with steps(model, capture, trace, hook, name="diffusion_gemma", args={**config.to_dict(), **s}, input_ids=input_ids,
               seq_len=P0 + n_canvases * C, layout=layout, total=n_canvases * N, progress=progress) as run:
        for _ in range(n_canvases):
            Pk = seq.shape[1]
            enc_pos = torch.arange(Pk - new_tokens.shape[1], Pk, dtype=torch.int32, device=device)[None]
            dec_pos = torch.arange(Pk, Pk + C, dtype=torch.int32, device=device)[None]
            dg.encode_prefix(model, new_tokens, real, enc_pos, cache)
            key_real = F.pad(real, (0, C), value=True)  # (B, Pk + C): the canvas is real
            canvas = torch.randint(0, V, (B, C), device=device)  # noise: no mask token
            masks = dg.decoder_masks(model, canvas, cache, key_real)
            self_cond = None
            argmax = canvas
            noise = torch.ones(B, C, dtype=torch.bool, device=device)  # fed as noise (not yet accepted)
            done = torch.zeros(B, dtype=torch.bool, device=device)
            if stopper is not None:
                stopper.reset()
            for n in reversed(range(1, N + 1)):
                tokens = torch.cat([seq, canvas], dim=1)  # (B, Pk + C)
                is_masked = F.pad(noise, (Pk, 0), value=False)
                # every canvas row (B, C) is a query; the split: 0 noise, 1 accepted
                req = run.request(tokens, is_masked, key_real, queries=torch.ones_like(noise), queries_masked=noise)
                if req is not None:
                    req.num_keys = Pk + C  # sliding layers see only the last keys: right-align them
                logits = dg.denoise(model, canvas, self_cond, masks, cache, dec_pos, attention=req)  # (B, C, V)
                if s["t_min"] is not None and s["t_max"] is not None:
                    logits = logits / temperature(s["t_min"], s["t_max"], n, N)
                probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
                drawn = torch.multinomial(probs.view(-1, V), num_samples=1).view(B, C)
                new_argmax = logits.argmax(dim=-1)
                accepted = accept(logits, s["entropy_bound"])  # (B, C)
                # accepted positions take the drawn token; every other one is renoised
                new_canvas = torch.where(accepted, drawn, torch.randint(0, V, (B, C), device=device))
                if stopper is not None:
                    if done.any():  # a row that already stopped keeps its canvas and logits
                        new_argmax = torch.where(done[:, None], argmax, new_argmax)
                        new_canvas = torch.where(done[:, None], canvas, new_canvas)
                        logits = torch.where(done[:, None, None], self_cond, logits)
                    done = done | stopper(new_argmax, logits)
                # accepted positions commit the drawn token (new_canvas); the history keeps the argmax draft
                run.step(tokens, is_masked, logits, F.pad(accepted, (Pk, 0), value=False),
                         after=torch.cat([seq, new_argmax], dim=1), committed=F.pad(new_canvas, (Pk, 0)),
                         block=(Pk, Pk + C), attention_mask=key_real,
                         query_positions=[torch.arange(Pk, Pk + C) for _ in range(B)])
                noise = torch.where(done[:, None], noise, ~accepted) if stopper is not None else ~accepted
                self_cond = logits.to(embed_dtype)
                canvas, argmax = new_canvas, new_argmax
                if bool(done.all()):
                    break
            seq, finished = finish_canvas(torch.cat([seq, argmax], dim=1), finished, C, eos, pad)
            if bool(finished.all()):
                break
            new_tokens = seq[:, -C:]
            real = F.pad(real, (0, C), value=True)
    return run.output(seq)


def finish_canvas(seq: torch.Tensor, finished: torch.Tensor, C: int, eos: torch.Tensor | None, pad: int | None):
    """Rows that ended earlier get pad over the whole new canvas; a row whose new canvas holds EOS
    ends now, with pad after its first EOS."""
    now = torch.zeros_like(finished) if eos is None else torch.isin(seq[:, -C:], eos).any(dim=-1)
    before, finished = finished, finished | now
    if pad is not None and bool(finished.any()):
        seq[before, -C:] = pad
        if eos is not None and bool(now.any()):
            new = seq[:, -C:]
            is_eos = torch.isin(new, eos)
            count = is_eos.cumsum(dim=-1)
            new[(count > 0) & ~((count == 1) & is_eos)] = pad
    return seq, finished
