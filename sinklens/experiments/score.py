"""Held-out exact-answer accuracy of a shipped twin through `sinklens.load` and its real sampler.

    python -m sinklens.experiments.score tiny-dlm [--n 500] [--split heldout-wording] [--block-length 8]

Batched (left-padded prompts), unmasked, on each held-out kind (`--split`, both by default: new
number combinations, and new wordings with new combinations); the numbers in docs/training.md
come from here.
"""
from __future__ import annotations

import argparse
import json

import torch

from sinklens.train.batch import decode_answers, encode_prompts, parse_answer
from sinklens.eval.arith import heldout_problems
from sinklens.samplers.registry import get_config
from sinklens.experiments.twins import arm_sampler, dlm_sampler, matched_models


SPLITS = ("heldout", "heldout-wording")


def twin_sampler(name: str, mode: str | None, is_diffusion: bool) -> dict:
    """The sampler settings a matched model is scored and evaluated with (twins.matched_models:
    tiny-dual's diffusion mode runs SDAR's preset); any other model: the DLM or ARM twin's."""
    wanted = mode or ("diffusion" if is_diffusion else "ar")
    for dm in matched_models():
        if dm.name == name and dm.load_kwargs.get("mode", wanted) == wanted:
            return dict(dm.sampler_kwargs)
    return dlm_sampler() if is_diffusion else arm_sampler()


def score(name: str, n: int = 200, seed: int = 0, block_length: int | None = None,
          dtype: str | None = "float32", batch_size: int = 100, split: str = "heldout", mode: str | None = None) -> dict:
    from sinklens.models.loader import load
    torch.set_num_threads(1)
    m = load(name, dtype=dtype, **({} if mode is None else {"mode": mode}))
    sampler = twin_sampler(name, mode, m.is_diffusion)
    if block_length and m.is_diffusion:
        sampler["block_length"] = block_length
    if not get_config(m.family.sampler).batched:      # e.g. SDAR's sampler: one prompt at a time
        batch_size = 1
    problems = heldout_problems(n, seed=seed, split=split)
    correct, outputs = 0, []
    for i in range(0, n, batch_size):
        chunk = problems[i:i + batch_size]
        ids, am = encode_prompts(m.tokenizer, [p.question for p in chunk])
        out = m.generate(ids, attention_mask=am, **sampler)
        texts = decode_answers(m.tokenizer, out.sequences[:, ids.shape[1]:])
        for p, t in zip(chunk, texts):
            ok = parse_answer(t) == p.answer
            correct += ok
            outputs.append({"question": p.question, "output": t, "answer": p.answer, "ok": bool(ok)})
    acc = correct / n
    return {"model": name, "mode": mode, "split": split, "n": n, "seed": seed, "dtype": dtype, "sampler": sampler, "exact_acc": acc,
            "stderr": (acc * (1 - acc) / n) ** 0.5, "outputs": outputs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-length", type=int, default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--mode", default=None, help="a checkpoint trained in two modes (tiny-dual): ar | diffusion")
    ap.add_argument("--split", choices=SPLITS, action="append",
                    help="held-out kind (repeatable; default: both)")
    ap.add_argument("--out", default=None, help="write the full result (with every output) as JSON")
    a = ap.parse_args()
    if a.n < 1:
        ap.error(f"--n must be a positive integer, got {a.n}")
    results = []
    for split in a.split or SPLITS:
        try:
            res = score(a.model, a.n, a.seed, a.block_length, None if a.dtype == "auto" else a.dtype, split=split,
                        mode=a.mode)
        except (OSError, ValueError) as e:     # a typo'd model name, a bad setting: one line, not a traceback
            ap.error(str(e))
        print(f"{a.model}{'' if a.mode is None else f' ({a.mode})'}: {split}: exact {res['exact_acc']:.3f} ± {res['stderr']:.3f} (n={a.n}, "
              f"dtype={a.dtype}, sampler={res['sampler']})", flush=True)
        results.append(res)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
