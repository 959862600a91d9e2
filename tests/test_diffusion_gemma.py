"""DiffusionGemma (transformers-native, model type `diffusion_gemma`): the sinklens sampler is
token-identical to transformers' own `generate` on a tiny random checkpoint (seeded), with and
without capture; the sinklens attention function gives transformers' eager attention maps for the
causal sliding-window encoder and for the bidirectional decoder (canvas queries over cached
prefix + canvas keys, sliding layers with a trimmed cache, shared K=V global layers, scaling 1)."""
import json

import numpy as np
import pytest
import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DynamicCache

import sinklens
from sinklens.attention.request import AttentionRequest
from sinklens.models import diffusion_gemma as dg
from sinklens.samplers import CaptureOptions

torch.set_num_threads(1)

V, C, P, WINDOW = 96, 8, 10, 6  # vocab, canvas length, prompt length (> the sliding window), window
TEXT = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
            sliding_window=WINDOW, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            num_experts=2, top_k_experts=1, moe_intermediate_size=16, pad_token_id=0, eos_token_id=1,
            bos_token_id=2, use_bidirectional_attention="vision")
VISION = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=2, head_dim=8)


def build(folder):
    # key set as the hub's configs (e.g. trl-internal-testing/tiny-DiffusionGemmaForBlockDiffusion):
    # "vision" bidirectionality, a top-level EOS list (there [1, 106]; 106 is outside this vocab)
    config = DiffusionGemmaConfig(text_config=TEXT, vision_config=VISION, canvas_length=C, eos_token_id=[1, 50])
    torch.manual_seed(0)
    DiffusionGemmaForBlockDiffusion(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build(tmp_path_factory.mktemp("dg") / "diffusiongemma-tiny")


@pytest.fixture(scope="module")
def models(folder):
    ref = DiffusionGemmaForBlockDiffusion.from_pretrained(str(folder), attn_implementation="sdpa").eval()
    return sinklens.load(folder), ref


def prompt(B=2, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (B, P), generator=g)


def test_loads_natively(models):
    m, _ = models
    assert m.family.name == "diffusion_gemma" and m.family.attention == "encoder-decoder" and m.is_diffusion
    assert m.mask_id is None and m.eos_id == 1 and m.stop_ids == (1, 50) and (m.num_layers, m.num_heads) == (3, 2)
    assert m.model.config.get_text_config().layer_types[-1] == "full_attention"
    with pytest.raises(ValueError, match="use m.generate"):
        m.forward_logits(prompt())


CASES = {
    "defaults": dict(max_new_tokens=16, max_denoising_steps=6),
    # mean entropy falls from ~4.554 to ~4.532 over a canvas here: rows stop at different steps
    "stopping": dict(max_new_tokens=16, max_denoising_steps=6, confidence_threshold=4.548, stability_threshold=0),
    "stability": dict(max_new_tokens=16, max_denoising_steps=6, confidence_threshold=50.0, stability_threshold=1),
    "schedule": dict(max_new_tokens=8, max_denoising_steps=5, t_min=0.2, t_max=1.5, sampler_bound=0.6),
}


def ref_kwargs(kw):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    kw = dict(kw)
    if "sampler_bound" in kw:
        kw["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=kw.pop("sampler_bound"))
    return kw


def our_kwargs(kw):
    kw = dict(kw)
    if "sampler_bound" in kw:
        kw["entropy_bound"] = kw.pop("sampler_bound")
    return kw


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_tokens_equal_transformers_generate(models, tmp_path, case, seed):
    m, ref = models
    ids, kw = prompt(), CASES[case]
    torch.manual_seed(seed)
    expected = ref.generate(ids, **ref_kwargs(kw)).sequences
    torch.manual_seed(seed)
    plain = m.generate(ids, **our_kwargs(kw))
    torch.manual_seed(seed)
    traced = m.generate(ids, **our_kwargs(kw), trace=tmp_path / "t.arrow",
                        capture=CaptureOptions(map_slices=((0, 0), (2, 1)), query_chunk=3))
    assert plain.sequences.tolist() == expected.tolist()
    assert traced.sequences.tolist() == expected.tolist()
    if case == "stopping":  # adaptive stopping fired: fewer steps than canvases x max steps
        assert plain.num_steps < 2 * 6


def test_eos_pad_and_left_padding_equal_transformers(models):
    """A row finishes at EOS (later tokens = pad, later canvases all pad); a left-padded batch."""
    m, ref = models
    ids = prompt()
    am = torch.ones_like(ids)
    am[1, :3] = 0
    kw = dict(max_new_tokens=24, max_denoising_steps=4)
    torch.manual_seed(3)
    free = ref.generate(ids, attention_mask=am, **kw).sequences
    eos = int(free[0, P + 2])  # a token row 0 produces in its first canvas
    for extra in ({}, {"eos_token_id": eos, "pad_token_id": 0}):
        torch.manual_seed(3)
        expected = ref.generate(ids, attention_mask=am, **kw, **extra).sequences
        torch.manual_seed(3)
        got = m.generate(ids, am, **kw, **extra).sequences
        assert got.tolist() == expected.tolist()
    assert (got[0, -C:] == 0).all()  # row 0 finished in canvas 1: canvas 3 is all pad


def test_attention_equals_eager_maps(models, folder):
    """One encoder prefill and one decoder step through the sinklens attention (capture, every
    layer and head) against transformers' eager attention weights of the same calls."""
    m, _ = models
    eager = DiffusionGemmaForBlockDiffusion.from_pretrained(str(folder), attn_implementation="eager").eval()
    ids = prompt()
    every = tuple((layer, h) for layer in range(3) for h in range(2))
    cache_e = DynamicCache(config=eager.config.get_text_config(decoder=True))
    enc = eager.model.encoder(input_ids=ids, past_key_values=cache_e, output_attentions=True)
    cache_s, req = dg.new_cache(m), AttentionRequest(capture=True, map_slices=every)
    dg.encode_prefix(m, ids, torch.ones_like(ids, dtype=torch.bool), torch.arange(P, dtype=torch.int32)[None],
                     cache_s, attention=req)
    far = (torch.arange(P)[:, None] - torch.arange(P)[None, :]) >= WINDOW  # outside a sliding layer's window
    for layer, h in every:
        torch.testing.assert_close(req.maps[(layer, h)], enc.attentions[layer][:, h], atol=1e-5, rtol=0)
        if layer < 2:  # sliding layers: causal and windowed
            assert req.maps[(layer, h)][:, far].abs().max() == 0

    torch.manual_seed(0)
    canvas = torch.randint(0, V, (2, C))
    dec = eager(decoder_input_ids=canvas, past_key_values=cache_e, output_attentions=True)
    req = AttentionRequest(capture=True, map_slices=every)
    req.num_keys = P + C
    masks = dg.decoder_masks(m, canvas, cache_s, torch.ones(2, P + C, dtype=torch.bool))
    logits = dg.denoise(m, canvas, None, masks, cache_s, torch.arange(P, P + C, dtype=torch.int32)[None], attention=req)
    torch.testing.assert_close(logits, dec.logits, atol=1e-5, rtol=0)
    received = req.received  # (L, B, H, P + C), right-aligned
    for layer, h in every:
        ref_map = dec.attentions[layer][:, h]  # (B, C, S_k): sliding layers see the last WINDOW - 1 prefix keys
        s_k = ref_map.shape[-1]
        assert s_k == (WINDOW - 1 + C if layer < 2 else P + C)
        got = req.maps[(layer, h)]  # (B, C, P + C)
        torch.testing.assert_close(got[..., -s_k:], ref_map, atol=1e-5, rtol=0)
        if s_k < P + C:  # keys outside the sliding cache receive nothing
            assert got[..., :-s_k].abs().max() == 0
        torch.testing.assert_close(received[layer, :, h, -s_k:], ref_map.sum(dim=1), atol=1e-5, rtol=0)


def test_trace_records_canvas_steps(models, tmp_path):
    """Per denoising step: canvas queries over every key; `is_masked` = fed as noise (all of the
    canvas at a canvas's first step), `revealed` = accepted; analysis and report run on it."""
    m, _ = models
    torch.manual_seed(0)
    out = m.generate(prompt(), max_new_tokens=16, max_denoising_steps=4, trace=tmp_path / "dg.arrow")
    t = sinklens.open_trace(out.trace_path)
    assert t.num_steps == out.num_steps == 8
    assert t.meta["layout"] == {"causal": False, "prompt_length": P, "block_length": C, "query_rows": "block",
                                "attention_block": None, "windows": [WINDOW, WINDOW, None], "window_kind": "cache"}
    for k, step in enumerate(t.steps):
        Pk = P + C * (k // 4)
        tokens, masked, q = t.tokens(step, 0), t.is_masked(step, 0), t.query_positions(step, 0)
        assert tokens.shape == (Pk + C,) and list(q) == list(range(Pk, Pk + C))
        assert not masked[:Pk].any() and (masked[Pk:].all() if k % 4 == 0 else True)
        r = t.received(step, 0)  # (L, H, Pk + C): each canvas row sums to 1 over the keys
        np.testing.assert_allclose(r.sum(-1), C, rtol=2e-3)
        groups = t.received_groups(step, 0)  # (G, L, H, S): noise rows + accepted rows = all rows
        np.testing.assert_allclose(groups.sum(0), r, atol=2e-3)
    a = sinklens.analyze(out.trace_path)
    assert a.source.layout.query_rows == "block" and a.source.block_length == C and not a.source.causal
    from sinklens.report.report import ReportOptions, build_report

    rep = build_report([out.trace_path], tmp_path / "report", options=ReportOptions(figures=False, progress=False))
    assert rep.html.is_file()


def test_defaults_are_transformers_defaults():
    """The sampler's documented defaults are transformers' own (they move together or this fails)."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    from sinklens.samplers.diffusion_gemma import DiffusionGemmaSamplerConfig

    theirs = DiffusionGemmaGenerationConfig._get_default_generation_params()
    ours = dict(DiffusionGemmaSamplerConfig.DEFAULTS)
    assert ours.pop("entropy_bound") == theirs.pop("sampler_config").entropy_bound
    assert ours == theirs


def test_by_hub_id_from_offline_cache(folder, tmp_path, monkeypatch):
    import shutil

    import huggingface_hub.constants as hf_constants

    commit = "fedcba9876543210fedcba9876543210fedcba98"
    repo = tmp_path / "hub" / "models--google--diffusiongemma-26B-A4B-it"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    m = sinklens.load("google/diffusiongemma-26B-A4B-it")
    assert m.family.name == "diffusion_gemma" and m.source["kind"] == "hub"
    assert json.loads((repo / "snapshots" / commit / "config.json").read_text())["model_type"] == "diffusion_gemma"


def test_bfloat16_tokens_equal_transformers_with_capture(folder, tmp_path):
    ref = DiffusionGemmaForBlockDiffusion.from_pretrained(str(folder), attn_implementation="sdpa",
                                                          dtype=torch.bfloat16).eval()
    m = sinklens.load(folder, dtype="bfloat16")
    kw = dict(max_new_tokens=16, max_denoising_steps=5)
    torch.manual_seed(0)
    expected = ref.generate(prompt(), **kw).sequences
    torch.manual_seed(0)
    got = m.generate(prompt(), **kw, trace=tmp_path / "bf16.arrow").sequences
    assert got.tolist() == expected.tolist()
