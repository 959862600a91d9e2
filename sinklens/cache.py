"""Where sinklens keeps the files it makes for itself (one home for that folder): the Gemma3 GGUF
it assembles from its chunk packages, the compiled capture kernel, GGUF files converted once.
`$SINKLENS_CACHE`, else `~/.cache/sinklens`. Also the content hash that keys or checks those
files. Imports nothing from sinklens."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

_hashes: dict[tuple, str] = {}   # (path, size, mtime, inode) -> sha256: file_sha256's memo


def cache_dir() -> Path:
    """$SINKLENS_CACHE, else ~/.cache/sinklens (read at each call: a test or a user may set it)."""
    return Path(os.environ.get("SINKLENS_CACHE") or Path.home() / ".cache" / "sinklens")


def file_sha256(path: str | os.PathLike) -> str:
    """The file's sha256 (hex), remembered for the process while its size, mtime and inode stay (a load
    that checks a file and then keys a copy by it reads it once: 253 MB for Gemma3)."""
    st = os.stat(path)
    key = (os.fspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _hashes:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        _hashes[key] = digest.hexdigest()
    return _hashes[key]
