"""The extension counts, as a test (docs/design.md, "What an extension costs"): in a copy of the
package, a family that reuses a sampler is ONE new file in sinklens/models/, and a family with its
own sampler is one new file there plus ONE new folder sinklens/samplers/<name>/ (config.py,
sample.py, an empty __init__.py), with no edit anywhere; the registries find them by scanning their
packages. A subprocess runs the copy: the new family loads and generates the official LLaDA
fixture's tokens, the new sampler fills the masks by argmax (with and without capture) and
`sinklens generate --help` lists its flag without importing torch (nor the sampler's sample.py)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

TOYDLM = '''"""A family that reuses the llada sampler: LLaDA's architecture under another model_type."""
from sinklens.models.families import Family, register_family
from sinklens.models.llada import _common

TOYDLM = register_family(Family(name="toydlm", matches=lambda c: c.get("model_type") == "toydlm", **_common))
'''

TOYB = '''"""A family with its own sampler."""
from sinklens.models.families import Family, register_family
from sinklens.models.llada import _common

TOYB = register_family(Family(name="toyb", matches=lambda c: c.get("model_type") == "toyb",
                              **{**_common, "sampler": "oneshot"}))
'''

ONESHOT_CONFIG = '''"""One denoising step: settings."""
from dataclasses import dataclass
from typing import ClassVar

from sinklens.samplers.registry import SamplerConfig, param, register


@register("oneshot")
@dataclass
class OneShotConfig(SamplerConfig):
    length_field: ClassVar[str] = "fill_tokens"

    fill_tokens: int = param(16, int, "tokens to fill in one step", min=1)
'''

ONESHOT_SAMPLE = '''"""One denoising step: every mask filled by its argmax."""
import torch
import torch.nn.functional as F

from sinklens.samplers.steps import check_inputs, steps
from sinklens.trace.layout import TraceLayout


@torch.no_grad()
def sample(model, input_ids, config, attention_mask=None, *, trace=None, hook=None, capture=None, progress=False):
    P, G = input_ids.shape[1], config.fill_tokens
    input_ids, attention_mask = check_inputs(input_ids, attention_mask, P + G, None)
    x = F.pad(input_ids, (0, G), value=model.mask_id)  # (B, S)
    real, is_masked = torch.ones_like(x, dtype=torch.bool), x == model.mask_id
    with steps(model, capture, trace, hook, name="oneshot", args=config.to_dict(), input_ids=input_ids, seq_len=P + G,
               layout=TraceLayout(causal=False, prompt_length=P), total=1, progress=progress) as run:
        logits = model.forward_logits(x, attention=run.request(x, is_masked, real, queries=real))  # (B, S, V)
        new = torch.where(is_masked, logits.argmax(-1), x)
        run.step(x, is_masked, logits, is_masked, after=new, attention_mask=real)
    return run.output(new)
'''

CHECK = '''
import json, sys
from pathlib import Path
from sinklens.cli import main
try:
    main(["generate", "--help"])
except SystemExit:
    pass
print("HEAVY", *sorted(k for k in ("torch", "transformers", "sinklens.samplers.oneshot.sample") if k in sys.modules))
import torch
import sinklens
from sinklens.samplers import CaptureOptions
fix, tmp = Path(sys.argv[1]), Path(sys.argv[2])
case = next(c for c in json.loads((fix / "cases.json").read_text())["cases"]
            if c["kind"] == "generate" and c["attention_mask"] is None)
args = {k: v for k, v in case["arguments"].items()
        if k not in {"prompt", "inputs", "attention_mask", "output_history", "return_dict_in_generate"}}
m = sinklens.load(tmp / "toydlm")
if case["seed"] is not None:
    torch.manual_seed(case["seed"])
out = m.generate(torch.tensor(case["input_ids"]), **args)
print("A", m.family.name, m.family.sampler, out.sequences.tolist() == case["expected_output_ids"])
m = sinklens.load(tmp / "toyb")
ids = torch.tensor([[5, 6, 7, 8]])
plain = m.generate(ids, fill_tokens=6)
traced = m.generate(ids, fill_tokens=6, trace=tmp / "b.arrow", capture=CaptureOptions())
argmax = m.forward_logits(torch.cat([ids, torch.full((1, 6), m.mask_id)], 1)).argmax(-1)
print("B", m.family.name, m.family.sampler, plain.sequences.tolist() == traced.sequences.tolist(),
      plain.sequences[0, 4:].tolist() == argmax[0, 4:].tolist(), traced.trace.num_steps)
'''


@pytest.mark.slow
def test_new_families_and_samplers_are_new_files_only(tmp_path, fixtures_dir):
    pkg = tmp_path / "copy" / "sinklens"
    shutil.copytree(REPO / "sinklens", pkg, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    (pkg / "models" / "toydlm.py").write_text(TOYDLM)  # exercise A: one new file
    (pkg / "models" / "toyb.py").write_text(TOYB)  # exercise B: two new files
    oneshot = pkg / "samplers" / "oneshot"  # exercise B: and one new folder
    oneshot.mkdir()
    (oneshot / "__init__.py").write_text("")
    (oneshot / "config.py").write_text(ONESHOT_CONFIG)
    (oneshot / "sample.py").write_text(ONESHOT_SAMPLE)
    for name, model_type in (("toydlm", "toydlm"), ("toyb", "toyb")):
        (tmp_path / name).mkdir()
        shutil.copy(fixtures_dir / "llada" / "model.safetensors", tmp_path / name)
        config = json.loads((fixtures_dir / "llada" / "config.json").read_text())
        (tmp_path / name / "config.json").write_text(json.dumps({**config, "model_type": model_type,
                                                                "architectures": ["ToyModel"]}))
    env = {**os.environ, "PYTHONPATH": str(pkg.parent), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CHECK, str(fixtures_dir / "llada"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--fill-tokens" in r.stdout and "oneshot: 16" in r.stdout  # its flag, from its config alone
    lines = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.startswith(("A ", "B ", "HEAVY"))}
    assert lines["HEAVY"] == []  # --help imported every sampler's config, the new one too, and no torch
    assert lines["A"] == ["toydlm", "llada", "True"]  # the official LLaDA tokens
    assert lines["B"] == ["toyb", "oneshot", "True", "True", "1"]  # capture changes no token; argmax; traced


# What a step's plumbing is made of: only sinklens/samplers/steps.py (and the capture / hook modules it
# builds on) may name these; a sampler's own files are the algorithm plus `with steps(...) as run`.
PLUMBING = {"setup_hooks", "open_trace_writer", "run_context", "build_request", "masked_unmasked_groups", "Hooks",
            "StepEvent", "GenerateOutput", "before_step", "after_step", "make_progress"}


def test_every_sampler_runs_its_steps_in_the_shared_step_context():
    """Every sampler module (a `sample(model, input_ids, config, ...)` function) opens one `with steps(...)`,
    and no file of a sampler's folder calls the capture / hook plumbing itself."""
    import ast

    samplers = REPO / "sinklens" / "samplers"
    folders = [d for d in samplers.iterdir() if (d / "sample.py").is_file()]
    assert len(folders) >= 8
    for folder in folders:
        for path in folder.glob("*.py"):
            tree = ast.parse(path.read_text())
            calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]  # (annotations may name the types)
            names = {getattr(f, "id", None) or getattr(f, "attr", None) for f in calls}
            assert not names & PLUMBING, f"{path.relative_to(REPO)} names {sorted(names & PLUMBING)}"
            samples = [f for f in tree.body if isinstance(f, ast.FunctionDef)   # sample(model, input_ids, config, ...)
                       and [a.arg for a in f.args.args[:3]] == ["model", "input_ids", "config"]]
            withs = [i for n in ast.walk(tree) if isinstance(n, ast.With) for i in n.items
                     if isinstance(i.context_expr, ast.Call) and getattr(i.context_expr.func, "id", None) == "steps"]
            if samples:  # the module's sampler: one step context (llada's sample also hands fast_dllm to fast.py)
                assert len(withs) == 1, f"{path.relative_to(REPO)}: one `with steps(...) as run:` per sampler module"
