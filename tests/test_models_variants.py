"""Checkpoint variants (iLLaDA, LLaDA 1.5, Dream-Coder, DiffuCoder): each from a folder laid out
like its hub repo (remote-code files present as traps that must never run) and by hub id from an
offline hub cache; detected from what the checkpoint ships; logits and the first official
generation case equal to the official LLaDA / Dream code on the same weights."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from test_models_loading import REMOTE_FILES, TRAP, assert_no_remote_code, max_diff_to_official

import sinklens
from sinklens.models.variants import VARIANTS, detect_variant

torch.set_num_threads(1)

# Ids of the tiny fixtures: vocab 320, EOS 299, mask 300 (see ../shared/fixtures/reference).
SPECIALS = {"<|endoftext|>": 299, "<|mask|>": 300, "<|im_start|>": 301, "<|im_end|>": 302, "<|dlm_pad|>": 303}


def write_tokenizer(folder: Path, specials: dict[str, int], mask_token: str | None = None,
                    tokenizer_class: str = "PreTrainedTokenizerFast") -> None:
    """A real byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json + added_tokens.json)
    whose special tokens sit at the given ids; the other ids are plain vocabulary entries."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    free = [i for i in range(max(specials.values()) + 1) if i not in specials.values()]
    vocab = {ch: free[k] for k, ch in enumerate(sorted(alphabet))}
    vocab.update({f"tok{i}": i for i in free[len(alphabet):]})
    vocab.update(specials)  # in the model vocabulary at their ids; marked special below
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    for text, i in sorted(specials.items(), key=lambda kv: kv[1]):
        assert tok.add_special_tokens([text]) == 1 and tok.token_to_id(text) == i
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   **({"mask_token": mask_token} if mask_token else {}))
    fast.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = tokenizer_class
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "added_tokens.json").write_text(json.dumps(specials))


def variant_folder(fixtures_dir: Path, dst: Path, variant: str) -> Path:
    """`dst` laid out like the variant's hub repo: the family fixture's weights and real config key
    set (incl. auto_map), the variant's distinguishing config / tokenizer facts, trapped remote code."""
    family = next(v.family for v in VARIANTS if v.name == variant)
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (fixtures_dir / family / name).is_file():
            shutil.copy(fixtures_dir / family / name, dst / name)
    config = json.loads((dst / "config.json").read_text())
    assert "auto_map" in config
    if variant == "illada":
        # iLLaDA's new tokenizer declares its mask token at id 5; the config names no mask id.
        config.pop("mask_token_id")
        write_tokenizer(dst, {"<|startoftext|>": 3, "<|mask|>": 5, "<|endoftext|>": 299}, mask_token="<|mask|>")
    elif variant == "diffucoder":
        write_tokenizer(dst, SPECIALS, tokenizer_class="Qwen2Tokenizer")
    (dst / "config.json").write_text(json.dumps(config))
    for name in REMOTE_FILES[family]:
        (dst / name).write_text(TRAP)
    return dst


HUB_NAMES = {"illada": "GSAI-ML/iLLaDA-8B-Instruct", "llada-1.5": "GSAI-ML/LLaDA-1.5",
             "diffucoder": "apple/DiffuCoder-7B-Instruct", "dream-coder": "Dream-org/Dream-Coder-v0-Instruct-7B"}


def first_generate_case(fixtures_dir: Path, family: str) -> dict:
    cases = json.loads((fixtures_dir / family / "cases.json").read_text())["cases"]
    return next(c for c in cases if c["kind"] == "generate" and c["attention_mask"] is None)


def run_case(m, case, **kw):
    skip = {"prompt", "inputs", "attention_mask", "output_history", "return_dict_in_generate"}
    args = {k: v for k, v in case["arguments"].items() if k not in skip}
    args.update(kw)
    if case["seed"] is not None:
        torch.manual_seed(case["seed"])
    return m.generate(torch.tensor(case["input_ids"]), **args)


@pytest.mark.parametrize("variant", list(HUB_NAMES))
def test_variant_from_hub_layout_folder(fixtures_dir, tmp_path, variant):
    """Folder named like the hub repo: detected, no remote code run, official logits."""
    folder = variant_folder(fixtures_dir, tmp_path / HUB_NAMES[variant].split("/")[1], variant)
    m = sinklens.load(folder)
    assert_no_remote_code(folder)
    assert m.variant is not None and m.variant.name == variant
    assert m.source["variant"] == variant
    assert m.family.name == m.variant.family
    assert max_diff_to_official(m, fixtures_dir / m.family.name) <= 1e-4


@pytest.mark.parametrize("variant", list(HUB_NAMES))
def test_variant_by_hub_id_from_offline_cache(fixtures_dir, tmp_path, monkeypatch, variant):
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hub"
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    repo = cache / ("models--" + HUB_NAMES[variant].replace("/", "--"))
    variant_folder(fixtures_dir, repo / "snapshots" / commit, variant)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    m = sinklens.load(HUB_NAMES[variant])
    assert m.variant.name == variant and m.source["kind"] == "hub"
    assert_no_remote_code(repo / "snapshots" / commit)
    assert max_diff_to_official(m, fixtures_dir / m.family.name) <= 1e-4


def test_illada_mask_id_comes_from_its_tokenizer(fixtures_dir, tmp_path):
    """Detected from the tokenizer alone (neutral folder name): mask 5, and LLaDA's sampler uses it."""
    m = sinklens.load(variant_folder(fixtures_dir, tmp_path / "ckpt", "illada"))
    assert m.variant.name == "illada" and m.mask_id == 5 and m.eos_id == 299
    case = first_generate_case(fixtures_dir, "llada")
    out = run_case(m, case, steps=2, gen_length=4, block_length=4, mask_id=None)  # None: the model's
    P = len(case["input_ids"][0])
    first = out.history[0][0, P:].tolist()
    assert first.count(5) == 2  # half of the 4 masks revealed at step 1; the rest still id 5
    # the same call on the base fixture with mask_id=5 passed explicitly gives the same tokens
    base = sinklens.load(fixtures_dir / "llada")
    assert base.variant is None and base.mask_id == 300
    ref = run_case(base, case, steps=2, gen_length=4, block_length=4, mask_id=5)
    assert out.sequences.tolist() == ref.sequences.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["llada-1.5", "dream-coder", "diffucoder"])
def test_variant_generation_equals_official(fixtures_dir, tmp_path, variant):
    """Same weights and sampler as the base family: the official generate case token for token."""
    folder = variant_folder(fixtures_dir, tmp_path / HUB_NAMES[variant].split("/")[1], variant)
    m = sinklens.load(folder)
    case = first_generate_case(fixtures_dir, m.family.name)
    assert run_case(m, case).sequences.tolist() == case["expected_output_ids"]
    traced = run_case(m, case, trace=tmp_path / "t.arrow")  # capture changes no token
    assert traced.sequences.tolist() == case["expected_output_ids"]
    meta = sinklens.open_trace(tmp_path / "t.arrow").meta
    assert meta["model"]["variant"] == variant and meta["family"] == m.family.name


def test_diffucoder_detected_from_dlm_pad_token(fixtures_dir, tmp_path):
    m = sinklens.load(variant_folder(fixtures_dir, tmp_path / "ckpt", "diffucoder"))
    assert m.variant.name == "diffucoder"
    assert m.pad_id == SPECIALS["<|dlm_pad|>"] and SPECIALS["<|dlm_pad|>"] in m.stop_ids
    assert m.mask_id == 300 and m.eot_id == SPECIALS["<|im_end|>"]
    assert type(m.tokenizer).__name__ == "Qwen2Tokenizer"


def test_base_checkpoints_are_no_variant(fixtures_dir):
    for family in ("llada", "dream"):
        m = sinklens.load(fixtures_dir / family)
        assert m.variant is None and m.source["variant"] is None


@pytest.mark.parametrize("name,family,expected", [
    ("GSAI-ML/LLaDA-8B-Instruct", "llada", None),
    ("GSAI-ML/LLaDA-1.5", "llada", "llada-1.5"),
    ("/models/llada_1.5", "llada", "llada-1.5"),
    ("Dream-org/Dream-v0-Instruct-7B", "dream", None),
    ("/cache/models--Dream-org--Dream-Coder-v0-Base-7B/snapshots/abc", "dream", "dream-coder"),
    ("apple/DiffuCoder-7B-cpGRPO", "dream", "diffucoder"),
    ("apple/DiffuCoder-7B-cpGRPO", "llada", None),  # a name never crosses families
])
def test_detect_variant_by_name(name, family, expected):
    v = detect_variant(family, {}, None, name, mask_id=None)
    assert (None if v is None else v.name) == expected
