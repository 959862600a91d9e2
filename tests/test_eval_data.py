"""GSM8K / HumanEval data, prompts and answer extraction, on the real data files."""
from pathlib import Path

import pytest

from sinklens.eval import gsm8k, humaneval
from sinklens.eval.records import RecordWriter, read_records
from sinklens.eval.stats import mean_stderr

GSM8K = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


def test_gsm8k_real_file_and_reference_answers():
    items, errors = gsm8k.load(str(GSM8K))
    assert len(items) == 1319 and errors == []
    # the extraction rule applied to the data's own worked answers recovers every reference
    assert all(gsm8k.extract_answer(it["answer"]) == it["reference"] for it in items)
    first, _ = gsm8k.load(str(GSM8K), limit=3)
    assert [it["id"] for it in first] == ["line1", "line2", "line3"]


@pytest.mark.parametrize("text,expected", [
    ("She makes 9 * 2 = $18 every day.\n#### 18", "18"),
    ("The answer is $1,234.", "1234"),
    ("So 3 + 4 = 7. The answer is 7.00.", "7"),
    ("#### -5\nQ: next question 99", "-5"),
    ("So she has 8 left. The answer is 8.\n\nQ: There were 12 apples", "8"),   # stop at an invented Q:
    ("I don't know", None),
    ("0.5 of them, i.e. 0.50", "0.5"),
])
def test_gsm8k_extraction(text, expected):
    assert gsm8k.extract_answer(text) == expected


def test_gsm8k_prompts():
    msgs = gsm8k.build_messages("What is 2+2?", shots=8)
    assert len(msgs) == 17 and msgs[-1]["content"] == "Q: What is 2+2?\nA:"
    assert all(gsm8k.extract_answer(a["content"]) for a in msgs[1:-1:2])   # exemplars end in their answer
    assert "step by step" in gsm8k.build_messages("x", shots=0)[0]["content"]
    assert gsm8k.build_text("x", 2).count("Q: ") == 3
    with pytest.raises(ValueError, match="shots"):
        gsm8k.build_messages("x", shots=9)


def test_malformed_lines_reported_with_line_numbers(tmp_path):
    lines = GSM8K.read_text().splitlines()[:5]
    lines[1] = lines[1][:-10]                      # truncated JSON
    lines[3] = '{"question": "no answer field"}'
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    items, errors = gsm8k.load(str(bad))           # no warning: the caller reports (the runner, once)
    assert [it["id"] for it in items] == ["line1", "line3", "line5"]
    assert [e.line for e in errors] == [2, 4] and "missing field" in errors[1].message
    assert str(errors[0]).startswith(f"{bad}:2: not valid JSON")
    with pytest.raises(FileNotFoundError, match="data file not found"):
        gsm8k.load(str(tmp_path / "missing.jsonl"))


def test_every_bad_gsm8k_line_is_skipped_alone(tmp_path):
    """Bad UTF-8, an answer without ####, "answer": null, a non-string question: each line is skipped
    with file:line, the others load; a BOM does not cost problem 1."""
    good = [line.encode() for line in GSM8K.read_text().splitlines()[:7]]
    lines = list(good)
    lines[0] = b"\xef\xbb\xbf" + good[0]                                  # UTF-8 BOM (Windows editors)
    lines[1] = good[1].replace(b'"question": "', b'"question": "\xff\xfe ')  # invalid UTF-8 inside a string
    lines[2] = b'{"question": "How many?", "answer": "It is 4."}'          # no #### final answer
    lines[3] = b'{"question": "How many?", "answer": null}'
    lines[4] = b'{"question": 17, "answer": "#### 4"}'
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    items, errors = gsm8k.load(str(path))
    assert [it["id"] for it in items] == ["line1", "line6", "line7"]
    assert items[0]["question"] == gsm8k.load(str(GSM8K), limit=1)[0][0]["question"]
    assert [(e.line, e.message.split(" (")[0]) for e in errors] == [
        (2, "not valid UTF-8"), (3, "answer has no '#### N' final answer"),
        (4, "field(s) must be strings: answer is NoneType"), (5, "field(s) must be strings: question is int")]
    assert all(str(e).startswith(f"{path}:{e.line}: ") for e in errors)
    assert gsm8k.load(str(path), limit=2)[0][1]["id"] == "line6"            # --limit counts usable problems


def test_bad_humaneval_lines_are_skipped(tmp_path):
    problems, _ = humaneval.load(limit=2)
    import json
    lines = [json.dumps({k: v for k, v in p.items() if k != "_line"}).encode() for p in problems]
    path = tmp_path / "he.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + lines[0] + b"\n" + b'{"task_id": "X/1", "prompt": null, "entry_point": "f", '
                     b'"test": ""}\n\xff\n' + lines[1] + b"\n")
    rows, errors = humaneval.load(str(path))
    assert [r["id"] for r in rows] == ["HumanEval/0", "HumanEval/1"]
    assert [(e.line, e.message) for e in errors] == [
        (2, "field(s) must be strings: prompt is NoneType"), (3, "not valid UTF-8 (byte 0xff at column 1)")]


def test_humaneval_extract_code():
    problems, _ = humaneval.load(limit=3)
    p = problems[0]                                  # has_close_elements, prompt imports List
    body = p["canonical_solution"]
    full = p["prompt"] + body
    assert humaneval.extract_code(body + "\n\ndef extra():\n    pass\n", p).rstrip() == (p["prompt"] + body).rstrip()
    fenced = f"Here you go:\n```python\nimport math\n{full[full.find('def '):]}```\nDone."
    code = humaneval.extract_code(fenced, p)
    assert code.startswith("from typing import List") and "import math" in code and "Done" not in code
    assert humaneval.extract_code(full[full.find("def "):], p).count("def has_close_elements") == 1
    # two fenced blocks: the one defining the entry point wins
    two = "```python\nprint(1)\n```\n```python\n" + full + "```"
    assert "def has_close_elements" in humaneval.extract_code(two, p)


def test_records_survive_a_torn_line(tmp_path):
    path = str(tmp_path / "s.jsonl")
    with RecordWriter(path) as w:
        w.write({"id": "a", "index": 0})
        w.write({"id": "b", "index": 1})
    with open(path, "ab") as f:
        f.write(b'{"id": "c", "ind')                # killed mid-write
    recs, end = read_records(path)
    assert [r["id"] for r in recs] == ["a", "b"]
    with RecordWriter(path) as w:                   # resuming cuts the torn tail
        w.write({"id": "c", "index": 2})
    assert [r["id"] for r in read_records(path)[0]] == ["a", "b", "c"]


def test_mean_stderr():
    m, se = mean_stderr([1, 0, 1, 1])
    assert m == 0.75 and abs(se - (0.25 / 4) ** 0.5) < 1e-12    # sample variance 0.25, n = 4
