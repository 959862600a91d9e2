"""`sinklens replicate --table2 --model M`: the paper's Table 2 protocol on one model, beside the
paper's own rows.

The protocol, in the words of the paper's second version (arXiv 2510.15731v2, §4, Table 2): "computed
across 30 generations with generation length of 128, 128 denoising steps and block size of 32";
each row is the relative frequency of the top-5 sink tokens (Eq. 3 sinks, the default ε, over every
step, layer and head of the 30 traces). The reference rows below are that table's, for LLaDA-8B,
Dream-7B and MMaDA-8B; tokens are written as the checkpoints' tokenizers spell them (`Ċ` is a newline
in byte-level BPE), which is how the measured rows are written too.

Prompts: a sinklens-trained twin gets its held-out problems (the only text it knows); any other
model the GSM8K test questions (`--data` a local test.jsonl, else the hub), zero-shot, through the
chat template when the tokenizer has one. A model whose context cannot hold prompt + 128 tokens
generates as many whole blocks as fit (said in the output). Resumable: finished traces are kept.
"""
from __future__ import annotations

import json
from pathlib import Path

GENERATIONS, GEN_LENGTH, STEPS, BLOCK = 30, 128, 128, 32   # the paper's Table 2 protocol (v2)
TOP = 5

# The paper's Table 2 (v2): model -> the top-5 sink tokens and their relative frequencies.
PAPER_TABLE2: dict[str, list[tuple[str, float]]] = {
    "LLaDA-8B": [("Ċ", 0.368), ("<|mdm_mask|>", 0.366), (".", 0.050), ("<|start_header_id|>", 0.008),
                 ("white-space", 0.008)],
    "Dream-7B": [("<|mask|>", 0.321), ("Ċ", 0.090), (".", 0.046), (",", 0.044), ("<|endoftext|>", 0.040)],
    "MMaDA-8B": [("Ċ", 0.180), ("<|mdm_mask|>", 0.166), ("<|end_header_id|>", 0.160), ("<|startoftext|>", 0.108),
                 ("istant", 0.066)],
}
PAPER_SOURCE = "the paper, arXiv 2510.15731v2, Table 2"


def protocol_settings(model, prompt_length: int) -> tuple[dict, list[str]]:
    """The sampler's arguments for the protocol on `model` (its own field names), and notes. The
    length is cut to whole blocks that fit the context (steps follow: one token per step)."""
    from sinklens.samplers import lengths
    from sinklens.samplers.registry import get_config

    cls = get_config(model.family.sampler)
    n, notes = GEN_LENGTH, []
    context = getattr(model, "max_length", None)
    if context is not None and prompt_length + n > context:
        room = context - prompt_length
        n = room // BLOCK * BLOCK if room >= BLOCK else room
        if n < 1:
            raise ValueError(f"--table2: the prompt has {prompt_length} tokens and the model's context is {context}")
        notes.append(f"the model's context is {context} tokens: {n} generated tokens and {n} steps instead of "
                     f"{GEN_LENGTH} (the paper's)")
    overrides = {cls.length_field: n}
    if cls.steps_field:
        overrides[cls.steps_field] = n * STEPS // GEN_LENGTH
    if cls.block_field:
        overrides[cls.block_field] = min(BLOCK, n)
    elif cls.length_field:
        notes.append(f"the {model.family.sampler} sampler has no block size or step count of the paper's kind: its "
                     "own settings for those")
    return lengths.settings(cls, lengths.ModelFacts.of(model), overrides=overrides, flags=False).values, notes


def prompts_for(model, n: int, data: str | None) -> list[str]:
    """`n` prompt texts: a twin's held-out problems, else GSM8K test questions."""
    from sinklens.samplers.lengths import training_config

    if training_config(model.source.get("path")) is not None:
        from sinklens.eval.arith import heldout_problems
        return [p.question for p in heldout_problems(n)]
    from sinklens.eval import gsm8k
    items, _ = gsm8k.load(data, n)
    return [it["question"] for it in items]


def encode(model, text: str) -> list[int]:
    if getattr(model.tokenizer, "chat_template", None) is not None:
        return model.apply_chat_template(text)
    return model.tokenizer.encode(text)


def table2(model_name: str, out: str | Path, n: int = GENERATIONS, data: str | None = None, progress: bool = True,
           load_kwargs: dict | None = None) -> dict:
    """Trace `n` generations of `model_name` under the protocol; the top-5 sink tokens beside the paper's rows.
    Writes `<out>/table2.md` and `.json`; returns {"md": text, "rows": [...], "notes": [...]}."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from sinklens.analysis.analyze import analyze
    from sinklens.experiments.demo_model import slug
    from sinklens.models.loader import load

    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    out = Path(out)
    model = load(model_name, **(load_kwargs or {}))
    if not model.is_diffusion:
        raise ValueError(f"--table2 --model {model_name}: Table 2 is measured on diffusion models (denoising steps, "
                         f"blocks); {model_name} loads as the ARM family {model.family.name!r}")
    prompts = [encode(model, t) for t in prompts_for(model, n, data)]
    settings, notes = protocol_settings(model, max(len(p) for p in prompts))
    counts: dict[int, int] = {}
    label = slug(f"{model_name}{'-' + load_kwargs['mode'] if (load_kwargs or {}).get('mode') else ''}")
    for k, ids in enumerate(tqdm(prompts, desc=f"table2 {model_name}", disable=not progress)):
        path = out / "traces" / f"{label}-{k:03d}.arrow"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".partial")
            model.generate(torch.tensor([ids]), trace=str(tmp), **settings)
            tmp.rename(path)
        for row in analyze(str(path)).token_table.rows:
            counts[row.token_id] = counts.get(row.token_id, 0) + row.count
    total = sum(counts.values())
    ids = sorted(counts, key=lambda i: (-counts[i], i))[:TOP]
    tokens = model.tokenizer.convert_ids_to_tokens(ids) if model.tokenizer is not None else [str(i) for i in ids]
    measured = [(t, counts[i] / total) for t, i in zip(tokens, ids)] if total else []
    name = f"{model_name} (measured, n = {len(prompts)})"
    rows = [{"model": name, "top": measured, "sink_occurrences": total}] + \
           [{"model": f"{m} ({PAPER_SOURCE})", "top": r} for m, r in PAPER_TABLE2.items()]
    cell = lambda t: f"`{t[0]}` {t[1]:.3f}"  # noqa: E731
    lines = [f"Table 2 protocol: relative frequency of the top-{TOP} sink tokens over {len(prompts)} generations "
             f"(Eq. 3 sinks, default ε, every step, layer and head); sampler {model.family.sampler} with "
             f"{json.dumps(settings, sort_keys=True)}.", *(f"note: {x}" for x in notes), "",
             "| model | " + " | ".join(str(i + 1) for i in range(TOP)) + " |", "|---|" + "---|" * TOP]
    for r in rows:
        cells = [cell(t) for t in r["top"]] + ["–"] * (TOP - len(r["top"]))
        lines.append(f"| {r['model']} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    md = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "table2.md").write_text(md)
    (out / "table2.json").write_text(json.dumps({"settings": settings, "notes": notes, "rows": rows}, indent=1))
    return {"md": md, "rows": rows, "notes": notes, "path": str(out / "table2.md")}
