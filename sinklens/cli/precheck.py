"""Checks of what a user typed that need no torch: run before a sub-command imports the model
stack, so a typo costs a fraction of a second, not a model load.

`model_name`: an alias, an existing checkpoint folder or `.gguf` file, or something shaped like
a hub id "owner/name" (not looked up, `sinklens.load` does that; refused at once only when it is
not in the local hub cache and the hub cannot be reached); a GGUF checkpoint without the `gguf`
extra installed.
`sampler_flags`: the sampler flags given must all belong to one sampler. `dtype`: a known name.
`model_sampler`: the sampler the model runs, told from its config.json (this one imports the
model stack, but reads no weight), takes the flags given. Each raises `CliError` (one line naming
the flag, exit 2).
"""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import fields
from pathlib import Path

from sinklens.cli.types import CliError
from sinklens.eval.gsm8k import hub_reachable

# Kept equal to the loader's ALIASES and DTYPES by tests/test_cli.py (the loader imports torch).
PACKAGE_ALIASES = ("smollm2-135m-instruct", "all-minilm-l6-v2", "gemma3-270m")
DTYPE_NAMES = ("float32", "fp32", "float", "bfloat16", "bf16", "float16", "fp16", "half", "auto")
ASSETS = Path(__file__).resolve().parents[1] / "assets"
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def aliases() -> list[str]:
    """The package aliases and the twins shipped in sinklens/assets (every folder with a config.json)."""
    twins = [p.name for p in ASSETS.iterdir() if (p / "config.json").is_file()] if ASSETS.is_dir() else []
    return sorted([*PACKAGE_ALIASES, *twins])


GGUF_ALIASES = ("smollm2-135m-instruct", "gemma3-270m")
NEEDS_GGUF = "pip install 'sinklens[gguf]' (the PyPI package gguf, which transformers reads GGUF files with)"


def model_name(name: str, flag: str = "--model") -> None:
    path = Path(name).expanduser()
    gguf = name in GGUF_ALIASES or path.suffix == ".gguf" or (
        path.is_dir() and not (path / "config.json").is_file() and any(path.glob("*.gguf")))
    if gguf and importlib.util.find_spec("gguf") is None:
        raise CliError(f"{flag} {name!r} is a GGUF checkpoint: {NEEDS_GGUF}")
    if name in aliases():
        return
    if path.is_dir():
        if not (path / "config.json").is_file() and not list(path.glob("*.gguf")):
            raise CliError(f"{flag} {name!r}: the folder has neither a config.json nor a .gguf file; "
                           "expected a checkpoint folder laid out like a hub repo")
        return
    if path.is_file():
        if path.suffix != ".gguf":
            raise CliError(f"{flag} {name!r} is a file; expected a checkpoint folder, a .gguf file, an alias or a hub id")
        return
    if name.endswith(".gguf") or name.startswith((".", "/", "~")):
        raise CliError(f"{flag} {name!r}: no such file or folder")
    if not HUB_ID.match(name):
        raise CliError(f"{flag} {name!r} is neither an alias ({', '.join(aliases())}), an existing folder or "
                       ".gguf file, nor a hub id of the form 'owner/name'")
    if not _hub_cached(name) and not hub_reachable():
        raise CliError(f"{flag} {name!r} is not a local folder, and as a hub id it cannot be fetched: the hub cannot "
                       "be reached and the local hub cache has no copy; pass a local folder or .gguf file")


def _hub_cached(repo_id: str) -> bool:
    from huggingface_hub.constants import HF_HUB_CACHE

    return os.path.isdir(os.path.join(HF_HUB_CACHE, "models--" + repo_id.replace("/", "--")))


def dtype(name: str | None, flag: str = "--dtype") -> None:
    if name is not None and name.lower() not in DTYPE_NAMES:
        raise CliError(f"{flag} {name!r}: expected one of {', '.join(DTYPE_NAMES)}")


def sampler_flags(given: dict) -> None:
    """The sampler flags given (field name -> value) must all be fields of one sampler."""
    from sinklens.samplers.registry import SAMPLERS

    names = set(given)
    if len(names) < 2 or any(names <= {f.name for f in fields(cls)} for cls in SAMPLERS.values()):
        return
    owners = {n: sorted(s for s, cls in SAMPLERS.items() if n in {f.name for f in fields(cls)}) for n in sorted(names)}
    said = "; ".join(f"--{n.replace('_', '-')}: {', '.join(o)}" for n, o in owners.items())
    raise CliError(f"these sampler flags belong to different samplers ({said}); give only the flags of the "
                   "model's sampler")


def sampler_name(name: str | None, flag: str = "--sampler") -> None:
    """A registered sampler's name (whether the model's family runs it is checked once it is loaded)."""
    from sinklens.samplers.registry import SAMPLERS

    if name is not None and name not in SAMPLERS:
        raise CliError(f"{flag} {name!r}: expected one of {', '.join(sorted(SAMPLERS))}")


def model_sampler(model: str, sampler: str | None, given: dict, task: str | None = None,
                  gen_length: int | None = None, generates: str | None = None) -> str | None:
    """The sampler `model` runs with the sampler flags `given` (by field name), told from its
    config.json before any weight is read; None where that takes loading it (`loader.checkpoint_family`).
    Refused now, not after a model load of minutes: a sampler its family does not run, a flag the
    sampler does not take, settings it refuses (gen_length not a multiple of block_length; over
    `task`'s preset, with `gen_length`, as eval runs it), and an encoder where text is wanted
    (`generates`: what to do instead, said in the refusal)."""
    from sinklens.eval.settings import planned_settings
    from sinklens.models.loader import checkpoint_family
    from sinklens.samplers import lengths
    from sinklens.samplers.registry import get_config

    found = checkpoint_family(model)
    if found is None:
        return None
    family, folder = found
    try:
        name = family.pick_sampler(sampler, given)
        cls = get_config(name)
        if generates is not None and not cls.generates:
            raise ValueError(encoder_refusal(model, family.name, generates))
        planned_settings(cls, lengths.ModelFacts(None, lengths.training_config(folder)), task, gen_length, None, given)
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from None
    return name


def encoder_refusal(model: str, family: str, instead: str) -> str:
    return (f"{model} is a {family!r} encoder: it generates no text (one forward pass reads the whole input at "
            f"once); {instead}")
