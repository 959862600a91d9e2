"""tiny-dual: one folder, two modes. Block diffusion (SDAR's family, layout and sampler) by default,
an ARM with mode="ar", the same weights byte for byte. Each mode is checked against code nobody
here wrote: AR mode's greedy against transformers' own `generate`, diffusion mode (SDAR's KV-cached
sampler, itself checked against the official outputs in tests/test_sdar*.py) against block diffusion
computed without a cache on transformers' plain LlamaForCausalLM."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaForCausalLM

import sinklens
from sinklens.models.loader import ASSETS
from sinklens.train.dual import block_generate

DUAL = ASSETS / "tiny-dual"
PROMPTS = ["Max has 29 cards. He finds 22 more. How many cards now?",
           "Tom has 44 cards. He loses 38. How many cards now?"]


@pytest.fixture(scope="module")
def modes():
    return sinklens.load("tiny-dual", dtype="float32"), sinklens.load("tiny-dual", dtype="float32", mode="ar")


@pytest.fixture(scope="module")
def plain():
    """transformers' own class on the folder, as any transformers user loads it (no sinklens)."""
    return LlamaForCausalLM.from_pretrained(str(DUAL), dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(str(DUAL))


def test_two_modes_share_the_weights_byte_for_byte(modes):
    diffusion, ar = modes
    assert diffusion.is_diffusion and diffusion.family.sampler == "sdar" and diffusion.family.attention == "block-causal"
    assert not ar.is_diffusion and ar.family.causal and ar.family.sampler == "arm"
    assert diffusion.source["path"] == ar.source["path"] and ar.source["mode"] == "ar"
    stored = load_file(str(DUAL / "model.safetensors"))   # the one weights file of the folder
    assert sorted(p.name for p in DUAL.glob("*.safetensors")) == ["model.safetensors"]
    fp16 = lambda m: {k: v.to(torch.float16) for k, v in m.model.state_dict().items()}  # noqa: E731  (stored dtype)
    a, b = fp16(diffusion), fp16(ar)
    assert a.keys() == b.keys() == stored.keys()
    for k in stored:
        assert torch.equal(a[k].view(torch.int16), stored[k].view(torch.int16)), k
        assert torch.equal(b[k].view(torch.int16), stored[k].view(torch.int16)), k


@pytest.mark.parametrize("prompt", PROMPTS)
def test_ar_mode_traced_greedy_equals_transformers_generate(modes, plain, tmp_path, prompt):
    _, ar = modes
    model, tok = plain
    ids = torch.tensor([ar.apply_chat_template(prompt)])
    out = ar.generate(ids, trace=str(tmp_path / "ar.arrow"), max_new_tokens=16, do_sample=False)
    ref = model.generate(ids, max_new_tokens=16, do_sample=False)
    assert out.sequences[0].tolist() == ref[0].tolist()
    assert sinklens.open_trace(tmp_path / "ar.arrow").meta["sampler"]["name"] == "arm"


def reference_block_diffusion(model, ids: torch.Tensor, gen_length: int, mask_id: int, eos_id: int, parallel: bool):
    """No cache, plain transformers: the answer tokens up to and including the first EOS."""
    ans = block_generate(model, ids, torch.ones_like(ids), gen_length=gen_length, mask_id=mask_id, block=4,
                         parallel=parallel)[0].tolist()
    return ans[:ans.index(eos_id) + 1] if eos_id in ans else ans


@pytest.mark.parametrize("strategy", ["sequential", "low_confidence_dynamic"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_diffusion_mode_is_sdars_cached_sampler_and_equals_uncached_block_diffusion(modes, plain, tmp_path,
                                                                                    prompt, strategy):
    """Greedy (top_k=1): `sequential` commits one token per step left to right in each block,
    `low_confidence_dynamic` the whole block in one step (every greedy confidence is 1.0)."""
    diffusion, _ = modes
    model, tok = plain
    ids = torch.tensor([diffusion.apply_chat_template(prompt)])
    out = diffusion.generate(ids, trace=str(tmp_path / "bd.arrow"), gen_length=16, block_length=4,
                             denoising_steps=4, top_k=1, remasking_strategy=strategy)
    meta = sinklens.open_trace(tmp_path / "bd.arrow").meta
    assert meta["sampler"]["name"] == "sdar" and meta["family"] == "sdar-llama"
    got = out.sequences[0, ids.shape[1]:].tolist()
    want = reference_block_diffusion(model, ids, 16, tok.mask_token_id, tok.eos_token_id, strategy != "sequential")
    assert got[:len(want)] == want
    assert tok.eos_token_id in want   # the twin finished its answer (a real comparison, not two empty ones)


def test_diffusion_is_the_default_and_its_preset_is_the_trained_one(modes):
    diffusion, _ = modes
    from sinklens.samplers import lengths
    from sinklens.samplers.sdar.config import SDARConfig
    s = lengths.settings(SDARConfig, lengths.ModelFacts.of(diffusion))
    assert s.origin == "the model's training config"
    assert s.values["block_length"] == diffusion.config_dict["block_size"] == 4


@pytest.mark.parametrize("name, mode", [("tiny-arm", "ar"), ("tiny-dlm", "diffusion"), ("tiny-dual", "bidirectional")])
def test_mode_is_refused_in_one_line_where_it_means_nothing(name, mode):
    with pytest.raises(ValueError) as e:
        sinklens.load(name, mode=mode)
    msg = str(e.value)
    assert "\n" not in msg and f"mode={mode!r}" in msg


@pytest.mark.slow
def test_mode_on_the_command_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    run = lambda *a: subprocess.run([sys.executable, "-m", "sinklens", "generate", "--model", "tiny-dual",  # noqa: E731
                                     "--prompt", PROMPTS[0], *a], capture_output=True, text=True, env=env, timeout=600)
    ar = run("--mode", "ar")
    assert ar.returncode == 0, ar.stderr
    bad = run("--mode", "sideways")
    assert bad.returncode != 0 and "mode='sideways'" in bad.stderr and "Traceback" not in bad.stderr
