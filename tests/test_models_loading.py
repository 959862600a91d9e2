"""Loading paths and guards: hub-style folders with remote code (never run), hub ids offline,
MMaDA detection, native ARM folders, and specific errors for bad inputs."""
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import sinklens
from sinklens.models import loader

TRAP = """import pathlib
pathlib.Path(__file__).with_name("TRAP_RAN").write_text(__name__)
raise RuntimeError("remote code from the checkpoint folder was executed")
"""
REMOTE_FILES = {
    "llada": ["modeling_llada.py", "configuration_llada.py"],
    "dream": ["modeling_dream.py", "configuration_dream.py", "generation_utils.py", "tokenization_dream.py"],
}


def hub_layout(src: Path, dst: Path, family: str, **config_changes) -> Path:
    """A folder laid out like the hub repo: real config key set (incl. auto_map), official
    parameter names, and the repo's remote-code files replaced by traps that record an import."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    config = json.loads((dst / "config.json").read_text())
    assert "auto_map" in config  # the fixtures keep the real auto_map
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    for name in REMOTE_FILES[family]:
        (dst / name).write_text(TRAP)
    return dst


def test_trap_records_an_import(tmp_path):
    """The trap used below does fire when its file is executed (so its absence means something)."""
    import runpy

    trap = tmp_path / "modeling_llada.py"
    trap.write_text(TRAP)
    with pytest.raises(RuntimeError, match="remote code"):
        runpy.run_path(str(trap))
    assert (tmp_path / "TRAP_RAN").exists()


def assert_no_remote_code(folder: Path) -> None:
    assert not (folder / "TRAP_RAN").exists(), "a modeling/configuration file of the checkpoint ran"
    stems = {Path(f).stem for fs in REMOTE_FILES.values() for f in fs}
    for name, mod in list(sys.modules.items()):
        assert name.split(".")[-1] not in stems, f"module {name} from a checkpoint was imported"
        file = getattr(mod, "__file__", None) or ""
        assert not file.startswith(str(folder)), f"module {name} was imported from {folder}"
        assert "transformers_modules" not in name, f"remote-code module {name} was imported"


def max_diff_to_official(m, ref_dir: Path, case: str = "forward_leftpad") -> float:
    ref = load_file(str(ref_dir / "logits.safetensors"))
    mask = ref.get(f"{case}.attention_mask")
    logits = m.forward_logits(ref[f"{case}.input_ids"], attention_mask=mask)
    real = torch.ones(logits.shape[:2], dtype=torch.bool) if mask is None else mask.bool()
    return (logits - ref[f"{case}.logits"]).abs()[real].max().item()


def shard(folder: Path) -> None:
    """Split model.safetensors into two shards + model.safetensors.index.json, like the 7-8B repos."""
    from safetensors.torch import save_file

    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: weights[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_hub_layout_with_remote_code_loads_without_running_it(fixtures_dir, tmp_path, family, sharded):
    folder = hub_layout(fixtures_dir / family, tmp_path / family, family)
    if sharded:
        shard(folder)
    m = sinklens.load(folder)
    assert m.family.name == family
    assert_no_remote_code(folder)
    assert max_diff_to_official(m, fixtures_dir / family) <= 1e-4


def dream_tokenizer_files(tokenizer, folder: Path) -> None:
    """Write a real byte-level BPE tokenizer the way Dream's hub repo ships its own: vocab.json +
    merges.txt + a tokenizer_config.json naming the remote-code DreamTokenizer (no tokenizer.json)."""
    tokenizer.save_pretrained(folder / "_src")
    spec = json.loads((folder / "_src" / "tokenizer.json").read_text())
    (folder / "vocab.json").write_text(json.dumps(spec["model"]["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    added = {
        str(t["id"]): {"content": t["content"], "special": t["special"], "lstrip": False, "rstrip": False,
                       "normalized": False, "single_word": False}
        for t in spec["added_tokens"]
    }  # fmt: skip
    config = {
        "tokenizer_class": "DreamTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "added_tokens_decoder": added,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.rmtree(folder / "_src")


def test_remote_tokenizer_class_falls_back_to_native(fixtures_dir, tmp_path, smollm2):
    """Dream's tokenizer_config names its remote-code DreamTokenizer: sinklens reads the same
    vocab.json / merges.txt with the native Qwen2 class instead, and runs nothing from the folder."""
    from transformers import AutoTokenizer

    folder = hub_layout(fixtures_dir / "dream", tmp_path / "dream", "dream")
    dream_tokenizer_files(smollm2.tokenizer, folder)
    with pytest.raises(ValueError, match="custom code"):  # so the native fallback is what ran
        AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    m = sinklens.load(folder)
    assert_no_remote_code(folder)
    assert type(m.tokenizer).__name__ == "Qwen2Tokenizer"
    text = "The quick brown fox."
    assert m.tokenizer.encode(text, add_special_tokens=False) == smollm2.tokenizer.encode(text, add_special_tokens=False)
    assert m.eot_id == smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>")  # eot found by name


def test_hub_id_goes_through_snapshot_download(fixtures_dir, tmp_path, monkeypatch):
    """A hub id is fetched with snapshot_download (config, safetensors, tokenizer files only)."""
    folder = hub_layout(fixtures_dir / "llada", tmp_path / "snap", "llada")
    calls = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        calls.append((repo_id, revision, list(allow_patterns)))
        return str(folder)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    m = sinklens.load("GSAI-ML/LLaDA-8B-Instruct", revision="abc123")
    assert calls and calls[0][:2] == ("GSAI-ML/LLaDA-8B-Instruct", "abc123")
    patterns = calls[0][2]
    assert "*.safetensors" in patterns and "config.json" in patterns
    assert not any(p.endswith((".py", ".bin")) or p == "*" for p in patterns)
    assert m.source["kind"] == "hub" and m.source["revision"] == "abc123"
    assert_no_remote_code(folder)
    assert max_diff_to_official(m, fixtures_dir / "llada") <= 1e-4


def test_hub_id_from_offline_hub_cache(fixtures_dir, tmp_path, monkeypatch):
    """The real huggingface_hub code path, offline, on a folder laid out like the hub cache."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--Dream-org--Dream-v0-Instruct-7B"
    hub_layout(fixtures_dir / "dream", repo / "snapshots" / commit, "dream")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    m = sinklens.load("Dream-org/Dream-v0-Instruct-7B")
    assert m.family.name == "dream" and Path(m.source["path"]).name == commit
    assert_no_remote_code(repo / "snapshots" / commit)
    assert max_diff_to_official(m, fixtures_dir / "dream") <= 1e-4


def test_hub_id_fetch_failure_names_the_id(monkeypatch):
    import huggingface_hub

    def fail(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(OSError, match=r"could not fetch hub id 'GSAI-ML/LLaDA-8B-Base'.*no network"):
        sinklens.load("GSAI-ML/LLaDA-8B-Base")


@pytest.mark.parametrize(
    "changes",
    [
        {"model_type": "mmada", "architectures": ["MMadaModelLM"]},
        {"llm_vocab_size": 300, "new_vocab_size": 320, "codebook_size": 16},  # MMaDA's extra keys
    ],
    ids=["model_type", "multimodal_keys"],
)
def test_mmada_config_is_detected_and_loads_as_llada(fixtures_dir, tmp_path, changes):
    """MMaDA keeps LLaDA's architecture and parameter names; its config differs."""
    folder = hub_layout(fixtures_dir / "llada", tmp_path / "mmada", "llada", **changes)
    m = sinklens.load(folder)
    assert m.family.name == "mmada" and m.is_diffusion and m.family.sampler == "llada"
    assert max_diff_to_official(m, fixtures_dir / "llada", "forward_nopad") <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_native_arm_folder_matches_transformers(tmp_path, arch):
    """A native Llama / Qwen2 checkpoint loads as is, causal, with transformers' own logits."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    torch.manual_seed(0)
    config = config_cls(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, eos_token_id=1,
    )  # fmt: skip
    ref = model_cls(config).eval()
    ref.save_pretrained(tmp_path / arch)
    m = sinklens.load(tmp_path / arch)
    assert m.family.name == arch and not m.is_diffusion and m.mask_id is None and m.eos_id == 1
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        expected = ref(ids).logits
    assert (m.forward_logits(ids) - expected).abs().max().item() <= 1e-5
    # Causal: changing the last token leaves every earlier position's logits unchanged.
    other = ids.clone()
    other[:, -1] = (other[:, -1] + 1) % 64
    assert torch.equal(m.forward_logits(ids)[:, :-1], m.forward_logits(other)[:, :-1])


# --- bad inputs: specific errors before any compute ------------------------------------------


def test_unknown_architecture(fixtures_dir, tmp_path):
    folder = hub_layout(fixtures_dir / "llada", tmp_path / "x", "llada", model_type="toy_arch", architectures=["ToyArchForCausalLM"])
    with pytest.raises(ValueError, match=r"unknown architecture.*model_type='toy_arch'"):
        sinklens.load(folder)


def test_missing_weights(fixtures_dir, tmp_path):
    folder = tmp_path / "noweights"
    folder.mkdir()
    shutil.copy(fixtures_dir / "llada" / "config.json", folder)
    with pytest.raises(FileNotFoundError, match="missing weights"):
        sinklens.load(folder)


def test_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        sinklens.load(tmp_path)


def test_bin_only_checkpoint_is_refused(fixtures_dir, tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(fixtures_dir / "llada" / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"not read")  # never unpickled
    with pytest.raises(ValueError, match=r"only pickle weights \(pytorch_model.bin\).*safetensors only"):
        sinklens.load(folder)


def test_shape_mismatch_between_config_and_weights(fixtures_dir, tmp_path):
    folder = hub_layout(fixtures_dir / "llada", tmp_path / "mm", "llada", mlp_hidden_size=96)
    with pytest.raises(ValueError, match=r"shape mismatch.*gate_proj.*checkpoint \(128, 64\) vs config \(96, 64\)"):
        sinklens.load(folder)


def test_missing_parameter_is_an_error(fixtures_dir, tmp_path):
    from safetensors.torch import save_file

    folder = hub_layout(fixtures_dir / "llada", tmp_path / "partial", "llada")
    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.transformer.ln_f.weight"]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing weights: \['model.norm.weight'\]"):
        sinklens.load(folder)


def test_unsupported_llada_option(fixtures_dir, tmp_path):
    folder = hub_layout(fixtures_dir / "llada", tmp_path / "alibi", "llada", alibi=True)
    with pytest.raises(ValueError, match="alibi=True is not supported"):
        sinklens.load(folder)


@pytest.mark.parametrize("dtype", ["float8", "int32", 3])
def test_unknown_dtype(fixtures_dir, dtype):
    with pytest.raises(ValueError, match="unknown dtype"):
        sinklens.load(fixtures_dir / "llada", dtype=dtype)


def test_unknown_device(fixtures_dir):
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        sinklens.load(fixtures_dir / "llada", device="gpu0")


def test_a_device_this_machine_lacks_is_one_clear_error(fixtures_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda': this torch sees no CUDA GPU"):
        sinklens.load(fixtures_dir / "llada", device="cuda")
    with pytest.raises(ValueError, match="device 'mps': MPS .* is not available"):
        sinklens.load(fixtures_dir / "llada", device="mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="device 'cuda:3': this machine has 1 CUDA GPU"):
        sinklens.load(fixtures_dir / "llada", device="cuda:3")


def test_dtype_strings_and_stored_default(fixtures_dir):
    assert sinklens.load(fixtures_dir / "dream").dtype == torch.float32  # stored as fp32
    assert sinklens.load(fixtures_dir / "dream", dtype="bf16").dtype == torch.bfloat16


def test_resolve_gguf_file_and_folder(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    assert loader.resolve(tmp_path / "m.gguf").gguf_file == "m.gguf"
    assert loader.resolve(tmp_path).gguf_file == "m.gguf"  # a folder with one GGUF and no config
    (tmp_path / "config.json").write_text("{}")
    assert loader.resolve(tmp_path).gguf_file is None


def test_a_training_run_folder_names_its_export(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    (tmp_path / "config.json").write_text('{"kind": "dlm"}')   # the training config, not a model's
    with pytest.raises(ValueError, match=r"is a `sinklens train` run folder; its model is the exported checkpoint "
                                         r"'.*export': load that"):
        sinklens.load(tmp_path)


def test_unknown_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an alias"):
        sinklens.load(str(tmp_path / "does-not-exist"))


def test_bad_forward_inputs(fixtures_dir):
    m = sinklens.load(fixtures_dir / "llada")
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 320\)"):
        m.forward_logits(torch.tensor([[1, 2, 400]]))
    with pytest.raises(ValueError, match="attention_mask shape"):
        m.forward_logits(torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="ships no tokenizer"):
        m.apply_chat_template("hi")
    with pytest.raises(TypeError, match=r"input_ids must be token ids .* got text: tokenize it first"):
        m.generate("What is 2 + 3?")
    with pytest.raises(TypeError, match="capture must be a CaptureOptions .* got str"):
        m.generate([1, 2, 3], capture="yes")
    with pytest.raises(TypeError, match="trace must be a file path .* got int"):
        m.generate([1, 2, 3], trace=5)


def test_generate_never_overwrites_a_file_that_is_not_a_trace(fixtures_dir, tmp_path):
    m = sinklens.load(fixtures_dir / "llada")
    notes = tmp_path / "notes.txt"
    notes.write_text("precious")
    with pytest.raises(ValueError, match="exists and is not a trace; not overwriting it"):
        m.generate([1, 2, 3], trace=notes, steps=2, gen_length=2, block_length=2)
    assert notes.read_text() == "precious"
    run = tmp_path / "run.arrow"
    for _ in range(2):   # a trace is replaced by the next run's
        m.generate([1, 2, 3], trace=run, steps=2, gen_length=2, block_length=2)
    assert sinklens.open_trace(run).num_steps == 2
