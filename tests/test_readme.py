"""The README's first screen says what a new user will see: its Python example runs as printed and
answers what its comment says, its figure's caption describes the trace `make demo` draws it from,
and the page stays short (≤ 10 kB); docs/benchmarks.md stays a reference, not a log (≤ 400 lines)."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np

import sinklens

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_BYTES = 10_000
BENCHMARKS_MAX_LINES = 400


def _python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, "the README has one Python example"
    return blocks[0]


def test_the_readme_stays_short():
    assert README.stat().st_size <= MAX_BYTES, f"README.md is {README.stat().st_size} bytes (at most {MAX_BYTES})"


def test_the_readme_limitations_are_at_most_15_one_line_bullets_each_linking_its_doc():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Known limitations", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.strip().splitlines() if line.strip()]
    assert all(line.startswith("- ") for line in lines), "one line per limitation"
    assert 0 < len(lines) <= 15
    assert all(re.search(r"\]\(docs/[\w./#-]+\)\.?$", line) for line in lines), "each ends with a link to its doc"


def test_every_file_the_readme_links_exists():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert local and [link for link in local if not (REPO / link).exists()] == []


def test_the_benchmarks_doc_stays_a_reference():
    """One current table per measurement: earlier runs live in git history, not in the file."""
    lines = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").count("\n")
    assert lines <= BENCHMARKS_MAX_LINES, f"docs/benchmarks.md has {lines} lines (at most {BENCHMARKS_MAX_LINES})"


def test_the_readme_python_example_runs_and_prints_the_answer_its_comment_shows(tmp_path, monkeypatch):
    """Run as a user pastes it (in a fresh folder: it writes run.arrow there)."""
    code = _python_example()
    claimed = re.search(r"print\(out\.text\[0\]\)\s+# its answer: (.+)", code)
    assert claimed, "the example's answer line states the answer"
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines[0].strip() == claimed.group(1).strip()
    assert (tmp_path / "run.arrow").is_file()
    assert re.fullmatch(r"\(\d+, \d+, \d+\)", lines[1])        # (layers, heads, tokens)
    rows = dict(line.split(": ", 1) for line in lines[2:])
    assert re.fullmatch(r"\d+ \(step, layer, head, position\) occurrences", rows["sinks"])


def test_the_readme_figure_caption_matches_the_demo_trace(tmp_path):
    """The caption: `tiny-dlm` on the demo's prompt answers 29+22=51, and at layer 1, head 0 the Eq. 3
    sinks at every step include the prompt's `9` (of 29) and ` She`."""
    import torch

    from sinklens.experiments.demo import default_models

    text = README.read_text(encoding="utf-8")
    models, prompt = default_models()
    dlm = models[0]
    assert dlm.label == "tiny-dlm" and f'answering "{prompt}"' in " ".join(text.split())
    model = sinklens.load(dlm.name, **dlm.load_kwargs)
    ids = torch.tensor([model.apply_chat_template(prompt)])
    torch.manual_seed(0)
    res = model.generate(ids, trace=str(tmp_path / "t.arrow"), progress=False, **dlm.sampler_kwargs)
    answer = model.tokenizer.decode(res.sequences[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    assert answer.startswith("29+22=51") and "(`29+22=51`)" in text
    a = sinklens.analyze(str(tmp_path / "t.arrow"))
    s = a.sinks
    tokens = model.tokenizer.convert_ids_to_tokens(ids[0].tolist())
    for shown in ("9", "▁She"):
        pos = tokens.index(shown)
        steps = s["step"][(s["layer"] == 1) & (s["head"] == 0) & (s["pos"] == pos)]
        assert np.array_equal(np.unique(steps), np.arange(a.num_steps)), shown
