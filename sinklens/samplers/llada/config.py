"""LLaDA / MMaDA sampler settings (torch-free: the command line reads them for its flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, cache_param, param, register


@register("llada")
@dataclass
class LLaDAConfig(SamplerConfig):
    """LLaDA / MMaDA `generate()` (LLaDA's generate.py); defaults as the official function."""

    length_field: ClassVar[str] = "gen_length"
    steps_field: ClassVar[str] = "steps"
    block_field: ClassVar[str] = "block_length"
    TASK_LENGTHS: ClassVar[dict] = {"gsm8k": 256, "humaneval": 512}
    # the paper's setting: blocks of 32, greedy low-confidence remasking, no guidance
    PAPER: ClassVar[dict] = dict(block_length=32, temperature=0.0, cfg_scale=0.0, remasking="low_confidence")
    TRAINED: ClassVar[dict] = dict(temperature=0.0, remasking="low_confidence")  # the twins' scoring decoder

    steps: int = param(128, int, "denoising steps (a multiple of the number of blocks)", min=1)
    gen_length: int = param(128, int, "tokens to generate (a multiple of block_length)", min=1)
    block_length: int = param(128, int, "semi-autoregressive block length", min=1)
    temperature: float = param(0.0, float, "Gumbel sampling temperature (0 = greedy)", min=0)
    cfg_scale: float = param(0.0, float, "classifier-free guidance scale (0 = off)", min=0)
    remasking: str = param("low_confidence", str, "which masked positions are revealed first",
                           choices=("low_confidence", "random"))
    mask_id: int | None = param(None, int, "mask token id (default: the model's)", min=0)
    logits_eos_inf: bool = param(False, bool, "never sample EOS")
    confidence_eos_eot_inf: bool = param(False, bool, "EOS / EoT get no confidence")
    # Fast-dLLM (NVlabs/Fast-dLLM llada/generate.py): cached decoding and parallel commits
    cache: str = cache_param()
    threshold: float | None = param(None, float, "Fast-dLLM parallel decoding: commit every masked position of the "
                                    "block whose confidence reaches this (the most confident always); "
                                    "default: the fixed schedule", gt=0, max=1)
    factor: float | None = param(None, float, "Fast-dLLM's factor-based parallel decoding (newer Fast-dLLM, "
                                 "no cache only): commit the n most confident masked positions of the block while "
                                 "the n-th reaches 1 - factor / (n + 1) (the most confident always)", gt=0)

    def check(self) -> None:
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length ({self.gen_length}) must be a multiple of block_length ({self.block_length})")
        if self.steps % self.num_blocks:
            raise ValueError(f"steps ({self.steps}) must be divisible by the number of blocks "
                             f"(gen_length / block_length = {self.num_blocks})")
        if self.fast_dllm:
            # Fast-dLLM's generate functions have none of these options: refuse rather than guess
            for name, off in (("cfg_scale", 0.0), ("logits_eos_inf", False), ("confidence_eos_eot_inf", False)):
                if getattr(self, name) != off:
                    raise ValueError(f"{name}={getattr(self, name)!r} cannot be combined with cache={self.cache!r} / "
                                     f"threshold={self.threshold!r} (Fast-dLLM's decoding has no {name})")
        if self.factor is not None and (self.threshold is not None or self.cache != "none"):
            raise ValueError(f"factor={self.factor!r} takes neither a threshold nor a cache (got threshold="
                             f"{self.threshold!r}, cache={self.cache!r}): it is checked against Fast-dLLM's "
                             "uncached generate() only")
        if self.cache != "none" and self.threshold is None and self.steps // self.num_blocks < 2:
            raise ValueError(f"cache={self.cache!r} without a threshold needs at least 2 steps per block, got "
                             f"{self.steps // self.num_blocks} (Fast-dLLM's schedule runs past its end: IndexError)")

    @property
    def fast_dllm(self) -> bool:
        """True when Fast-dLLM's decoding runs (a cache, a threshold or a factor); else LLaDA's generate()."""
        return self.cache != "none" or self.threshold is not None or self.factor is not None

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length
