"""Real traces of block diffusion for the report tests: the official-format tiny SDAR and LLaDA2
checkpoints (tests/fixtures/{sdar,llada2}, made from the official code) and the shipped LLaDA-style
twin, each traced by its own sampler. The block sizes are the settings passed here and SDAR's
config.json `block_size`, not anything the report computes."""
from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SDAR_BLOCK = json.loads((FIXTURES / "sdar" / "config.json").read_text())["block_size"]   # 4
LLADA2_BLOCK = 8          # block_length passed to LLaDA2.1's sampler below (its attention blocks too)
LLADA_BLOCK = 8           # the shipped twin's generation blocks (its training settings)


def make(folder: Path) -> dict[str, Path]:
    """Write llada.arrow, llada21.arrow and sdar.arrow into `folder` (about 3 s on one core)."""
    import torch

    import sinklens
    from sinklens.samplers import CaptureOptions

    torch.set_num_threads(1)
    out = {}
    m = sinklens.load(FIXTURES / "llada2")
    ids = torch.randint(0, 157, (1, 9), generator=torch.Generator().manual_seed(3))
    m.generate(ids, sampler="llada21", gen_length=24, block_length=LLADA2_BLOCK, steps=8, threshold=0.5,
               editing_threshold=0.2, max_post_steps=3, trace=folder / "llada21.arrow",
               capture=CaptureOptions(map_slices=((0, 0),), received_dtype="float32"))
    out["llada21"] = folder / "llada21.arrow"
    s = sinklens.load(FIXTURES / "sdar")
    torch.manual_seed(0)
    s.generate(torch.arange(10, 20)[None], gen_length=24, block_length=SDAR_BLOCK, denoising_steps=4, top_k=1,
               remasking_strategy="low_confidence_static", stopping_criteria_idx=[], trace=folder / "sdar.arrow",
               capture=CaptureOptions(received_dtype="float32"))
    out["sdar"] = folder / "sdar.arrow"
    d = sinklens.load("tiny-dlm")
    d.generate(d.apply_chat_template("Tom has 3 apples and buys 4 more. How many apples?"),
               trace=folder / "llada.arrow")
    out["llada"] = folder / "llada.arrow"
    return out
