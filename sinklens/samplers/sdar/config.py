"""SDAR sampler settings (torch-free: the command line reads them for its flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, param, register

STRATEGIES = ("low_confidence_dynamic", "low_confidence_static", "sequential")


@register("sdar")
@dataclass
class SDARConfig(SamplerConfig):
    """SDAR's `block_diffusion_generate` (JetAstra/SDAR generate.py): block diffusion with a KV
    cache, defaults as the official function. Greedy decoding is `top_k=1` (temperature scales the
    logits and 0 is not allowed, as in the official code)."""

    batched: ClassVar[bool] = False  # the official function decodes one prompt, without padding
    length_field: ClassVar[str] = "gen_length"  # any length: the canvas is rounded up to whole blocks
    # the paper's chat setting (SDAR-*-Chat model cards): blocks of 4, 4 steps, greedy
    PAPER: ClassVar[dict] = dict(block_length=4, denoising_steps=4, top_k=1)
    # a sinklens-trained dual twin (tiny-dual, trained on this block of 4): greedy, one token per step,
    # left to right in each block (greedy confidences are all 1.0, so no confidence order exists)
    TRAINED: ClassVar[dict] = dict(PAPER, remasking_strategy="sequential")

    gen_length: int = param(128, int, "tokens to generate (prompt + this, rounded up to whole blocks)", min=1)
    block_length: int = param(8, int, "block length (attention blocks from position 0, prompt included)", min=1)
    denoising_steps: int = param(8, int, "denoising steps per block (at most; a block may finish early)", min=1)
    temperature: float = param(1.0, float, "sampling temperature (greedy: top_k=1)", gt=0)
    top_k: int = param(0, int, "sample among the k most likely tokens (0 = all; 1 = greedy; at most the vocabulary "
                               "size)", min=0)
    top_p: float = param(1.0, float, "nucleus sampling mass (1 = off; 0 keeps only the most likely token, as the "
                                     "official code)", min=0, max=1)
    remasking_strategy: str = param("low_confidence_dynamic", str, "which masked positions are committed (the "
                                    "official script also lists entropy_bounded, which fails in its function)",
                                    choices=STRATEGIES)
    confidence_threshold: float = param(0.85, float, "low_confidence_dynamic: commit every position whose "
                                        "sampled token has a probability above this")
    stopping_criteria_idx: int | list[int] | None = param(
        None, "ids", "stop after a block that holds one of these ids (default: the checkpoint's EOS ids, as the "
        "official script reads them from generation_config.json; from Python, [] never stops)")
    mask_id: int | None = param(None, int, "mask token id (default: the model's)", min=0)

    def max_steps(self, prompt_length: int) -> int:
        """`denoising_steps` per block after the prompt's whole blocks (the prefill is no step)."""
        blocks = -(-(prompt_length + self.gen_length) // self.block_length) - prompt_length // self.block_length
        return blocks * self.denoising_steps
