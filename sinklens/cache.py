"""Where sinklens keeps the files it makes for itself (one home for that folder): the Gemma3 GGUF
it assembles from its chunk packages, the compiled capture kernel. `$SINKLENS_CACHE`, else
`~/.cache/sinklens`. Imports nothing from sinklens."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SINKLENS_CACHE, else ~/.cache/sinklens (read at each call: a test or a user may set it)."""
    return Path(os.environ.get("SINKLENS_CACHE") or Path.home() / ".cache" / "sinklens")
