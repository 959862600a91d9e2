"""Dream sampler settings (torch-free: the command line reads them for its flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, cache_param, param, register


@register("dream")
@dataclass
class DreamConfig(SamplerConfig):
    """Dream `diffusion_generate()`; defaults as the official function runs them. Left out,
    `max_new_tokens` is 20 there (its default `max_length=20` counts the new tokens when neither is
    given), and `temperature` / `top_k` are 1.0 / 50 there, not the 0.0 / None that Dream's
    DreamGenerationConfig and README give: without a generation_config argument the function builds
    one from the *model* config, and under transformers 4 (which the official code needs) that
    config carries transformers' legacy generation defaults (temperature 1.0, top_k 50, top_p 1.0).
    `time_eps` is Dream's `eps` (the end of the time schedule), renamed so that it is not read as
    Eq. 3's margin; `eps=` / `--eps` still work, with a deprecation note."""

    steps_field: ClassVar[str] = "steps"
    TASK_LENGTHS: ClassVar[dict] = {"gsm8k": 256, "humaneval": 768}
    # Dream's evaluation (its eval.py passes top_k=None)
    PAPER: ClassVar[dict] = dict(temperature=0.1, top_p=0.9, top_k=None, alg="entropy", alg_temp=0.0)
    # the dlm-shift twins' scoring
    TRAINED: ClassVar[dict] = dict(temperature=0.0, top_k=None, alg="maskgit_plus", alg_temp=0.0)
    RENAMED: ClassVar[dict] = {"eps": "time_eps"}

    steps: int = param(512, int, "denoising steps", min=1)
    max_new_tokens: int = param(20, int, "tokens to generate (official default 20)", min=1)
    time_eps: float = param(1e-3, float, "final time of the schedule linspace(1, time_eps, steps + 1) (Dream's eps)",
                            gt=0, lt=1)
    alg: str = param("origin", str, "which masked positions are revealed",
                     choices=("origin", "maskgit_plus", "topk_margin", "entropy"))
    alg_temp: float | None = param(None, float, "temperature of the position sampling (None/0 = top-k)", min=0)
    temperature: float = param(1.0, float, "token sampling temperature (0 = greedy; official default 1.0, not the "
                               "0.0 of Dream's README: its generate() left without a generation config)",
                               min=0)
    top_p: float | None = param(None, float, "nucleus sampling mass (None = 1 = off)", gt=0, max=1)
    top_k: int | None = param(50, int, "sample among the top-k tokens (official default 50, not the None of "
                              "Dream's README, as temperature; None or at least the vocabulary size = off)", min=1)
    mask_id: int | None = param(None, int, "mask token id (default: the model's)", min=0)
    # Fast-dLLM (NVlabs/Fast-dLLM dream/model/generation_utils_block.py): cached block decoding
    cache: str = cache_param()
    block_length: int | None = param(None, int, "Fast-dLLM cached decoding: block length (default with a cache: "
                                     "32, Fast-dLLM's)", min=1)
    threshold: float | None = param(None, float, "Fast-dLLM parallel decoding (its alg='confidence_threshold'): "
                                    "commit every masked position of the block (no cache: of the step's quota) "
                                    "whose confidence reaches this (the most confident always)", gt=0, max=1)

    def check(self) -> None:
        if self.cache == "none":
            if self.block_length is not None:
                raise ValueError(f"block_length={self.block_length!r} needs cache='prefix' or 'dual' (Fast-dLLM's "
                                 "cached block decoding; without a cache the answer is one block)")
            return
        if self.max_new_tokens % self.cached_block_length:
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) must be a multiple of block_length "
                             f"({self.cached_block_length})")
        if self.steps % self.num_blocks:
            raise ValueError(f"steps ({self.steps}) must be divisible by the number of blocks "
                             f"(max_new_tokens / block_length = {self.num_blocks})")
        if self.threshold is None and self.alg != "entropy":
            raise ValueError(f"alg={self.alg!r} with cache={self.cache!r}: Fast-dLLM's cached decoding ranks by "
                             "entropy whatever alg says; pass alg='entropy' (or a threshold)")

    @property
    def cached_block_length(self) -> int:
        """The block length of the cached decoding (Fast-dLLM's default 32)."""
        return 32 if self.block_length is None else self.block_length

    @property
    def num_blocks(self) -> int:
        return self.max_new_tokens // self.cached_block_length
