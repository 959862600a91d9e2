"""The transformers-native samplers against transformers' own `generate`, token for token, over random
argument combinations the hand-written cases of tests/test_samplers_arm.py and tests/test_diffusion_gemma.py
leave out. The references run here, on tiny random checkpoints built and saved by transformers and
loaded through `sinklens.load(folder)`; every call is seeded the same way right before it (transformers
draws with the global generator), and each sinklens run is repeated with a trace written: capture must
never change a token.

- ARM sampler vs `model.generate` on Llama, Qwen2, Qwen3, Gemma, Gemma2 (attention and final logit
  softcapping, sliding + full layers), Gemma3, Mistral (a sliding window shorter than the runs), gpt-oss
  (learned sink logits, MoE), Qwen2-MoE, Qwen3-MoE, Mixtral, Phi-3, OLMo-2 and Granite: greedy and
  sampled (temperature, top-k incl. 0 and above the vocabulary, top-p incl. 0 and 1, min-p), 1-50 new
  tokens, prompts of 1-12 tokens, batches of 1-4 rows left-padded to different lengths (some
  right-padded or with holes), no attention mask with the pad id in the prompt, EOS single / list
  (a row finishing while others go on), pad_token_id; float32 and bfloat16.
- the logit filters (samplers/arm/warpers.py) vs transformers' warpers on logits with exact
  top-p boundaries and ties.
- the checkpoint's generation_config.json: its sampling settings apply once do_sample=True; its
  do_sample=True alone does not make sinklens sample, and sinklens' default length is not generate's
  (deliberate: strict xfails, docs/samplers.md).
- DiffusionGemma sampler vs `DiffusionGemmaForBlockDiffusion.generate`: random max_new_tokens (on and
  off the canvas grid), max_denoising_steps, entropy_bound, t_min / t_max, stability / confidence
  thresholds, EOS / pad, left padding (some right padding, holes), batch sizes, float32 and
  bfloat16, and a stored generation_config (max_length included).
"""
from __future__ import annotations

import random
import zlib

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

import sinklens
from sinklens.samplers import CaptureOptions
from sinklens.samplers.arm.warpers import warp

torch.set_num_threads(1)  # tiny models: threads only contend on the shared 2-core machine

V = 120  # vocabulary: above transformers' default top_k of 50, so that default filters
SMALL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, vocab_size=V, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
TWO_KINDS = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4)
ARCHS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma": ("gemma", {}),
    "gemma2": ("gemma2", dict(TWO_KINDS, attn_logit_softcapping=3.0, final_logit_softcapping=5.0,
                              query_pre_attn_scalar=24)),
    "mistral": ("mistral", dict(sliding_window=4)),
    "gpt_oss": ("gpt_oss", dict(TWO_KINDS, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                    shared_expert_intermediate_size=16)),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)),
    "gemma3": ("gemma3_text", dict(TWO_KINDS, query_pre_attn_scalar=24)),
    "phi3": ("phi3", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", dict(attention_multiplier=0.3)),
}
ARM_COMBOS = 24  # per architecture (float32); bfloat16: fewer, on three architectures


def build_arm(folder, name: str, generation_config: GenerationConfig | None = None):
    model_type, extra = ARCHS[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SMALL, **extra))
    if generation_config is not None:
        model.generation_config = generation_config
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def arm_models(tmp_path_factory):
    """(name, dtype) -> (sinklens model, transformers reference with its default attention)."""
    loaded, folders = {}, {}

    def get(name: str, dtype: str = "float32"):
        if name not in folders:
            folders[name] = build_arm(tmp_path_factory.mktemp(name) / "m", name)
        if (name, dtype) not in loaded:
            ref = AutoModelForCausalLM.from_pretrained(folders[name], dtype=getattr(torch, dtype)).eval()
            loaded[name, dtype] = sinklens.load(folders[name], dtype=dtype), ref
        return loaded[name, dtype]
    return get


def arm_combo(rng: random.Random):
    """(input_ids (B, P), attention_mask (B, P) or None, generate kwargs without the stop settings)."""
    B, P = rng.choice([1, 1, 2, 3, 4]), rng.choice([1, 2, 3, 5, 8, 12])
    lengths = [P] + [rng.randint(1, P) for _ in range(B - 1)]
    rng.shuffle(lengths)
    mask = torch.tensor([[0] * (P - n) + [1] * n for n in lengths])
    kind = rng.random()
    if kind < 0.15:  # right padding: transformers generates on from the pad row (it warns); so must we
        mask = mask.flip(1)
    elif kind < 0.25:  # holes anywhere, an all-pad row possible
        mask = torch.tensor([[int(rng.random() < 0.7) for _ in range(P)] for _ in range(B)])
    ids = torch.tensor([[rng.randrange(3, V) for _ in range(P)] for _ in range(B)]) * mask  # pads: id 0
    if rng.random() < 0.2:  # no mask: transformers infers it from the pad id (0) in the prompt
        ids[0, 0] = 0 if rng.random() < 0.5 else ids[0, 0]
        mask = None
    kw = dict(max_new_tokens=rng.choice([1, 2, 5, 9, 14, 30, 50]))
    if rng.random() < 0.7:
        kw["do_sample"] = True
        for name, values, chance in (("temperature", [0.3, 0.7, 1.0, 1.5], 0.6),
                                     ("top_p", [0.0, 0.5, 0.8, 0.95, 1.0], 0.5),
                                     ("top_k", [0, 1, 5, 20, 200], 0.5), ("min_p", [0.0, 0.05, 0.3, 0.9], 0.3)):
            if rng.random() < chance:
                kw[name] = rng.choice(values)
    return ids, mask, kw


def stop_settings(rng: random.Random, free: torch.Tensor, P: int) -> dict:
    """EOS chosen among the tokens a free run generated (so rows stop, some before others), a list
    with an id never drawn, or the checkpoint's; sometimes another pad id."""
    extra, generated = {}, free.shape[1] - P
    r = rng.random()
    if r < 0.4 and generated > 0:
        extra["eos_token_id"] = int(free[0, P + generated // 2])  # row 0 stops mid-run
    elif r < 0.6 and generated > 0:
        extra["eos_token_id"] = [int(free[-1, -1]), 7]
    if extra and rng.random() < 0.5:
        extra["pad_token_id"] = 5
    return extra


def run_arm_sweep(m, ref, rng: random.Random, n: int, tmp_path):
    """n random combos; returns (mismatches, coverage counts)."""
    bad, seen = [], {"early_stop": 0, "sampled": 0, "inferred_mask": 0, "one_token_prompt": 0, "right_padded": 0}
    for i in range(n):
        ids, mask, kw = arm_combo(rng)
        seed = rng.randrange(1000)
        torch.manual_seed(seed)
        free = ref.generate(ids, attention_mask=mask, **kw)
        kw.update(stop_settings(rng, free, ids.shape[1]))
        torch.manual_seed(seed)
        expected = ref.generate(ids, attention_mask=mask, **kw).tolist()
        torch.manual_seed(seed)
        plain = m.generate(ids, mask, **kw).sequences.tolist()
        torch.manual_seed(seed)
        capture = CaptureOptions(capture_prefix=i % 2 == 1, map_slices=((1, 0),))  # every other: all prefix rows
        traced = m.generate(ids, mask, **kw, trace=tmp_path / f"{i}.arrow", capture=capture)
        steps = sinklens.open_trace(traced.trace_path).num_steps  # one record per generated token
        traced = traced.sequences.tolist()
        if plain != expected or traced != expected or steps != len(expected[0]) - ids.shape[1]:
            bad.append(f"combo {i}: prompt {tuple(ids.shape)} mask {None if mask is None else mask.sum(1).tolist()} "
                       f"{kw} seed {seed}\n  transformers {expected}\n  plain {plain}\n  traced {traced}")
        pad = kw.get("pad_token_id", 0)
        seen["early_stop"] += any(r[-1] == pad and len(r) < ids.shape[1] + kw["max_new_tokens"] + 1 for r in expected) \
            and len(expected[0]) > ids.shape[1] + 1
        seen["sampled"] += bool(kw.get("do_sample"))
        seen["inferred_mask"] += mask is None and bool((ids == 0).any())
        seen["one_token_prompt"] += ids.shape[1] == 1
        seen["right_padded"] += mask is not None and bool((mask[:, -1] == 0).any())
    return bad, seen


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ARCHS))
def test_arm_equals_transformers_generate(arm_models, name, tmp_path):
    m, ref = arm_models(name)
    bad, seen = run_arm_sweep(m, ref, random.Random(zlib.crc32(name.encode())), ARM_COMBOS, tmp_path)
    assert not bad, "\n".join(bad)
    assert seen["sampled"] >= 8 and seen["one_token_prompt"] >= 1, seen  # the sweep reaches what it claims


@pytest.mark.slow
def test_arm_sweep_reaches_early_stops_and_inferred_masks(arm_models, tmp_path):
    """Coverage of the rarer branches, on one architecture with more combos."""
    m, ref = arm_models("llama")
    bad, seen = run_arm_sweep(m, ref, random.Random(8), 40, tmp_path)
    assert not bad, "\n".join(bad)
    assert seen["early_stop"] >= 2 and seen["inferred_mask"] >= 2 and seen["right_padded"] >= 2, seen


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss"])
def test_arm_bfloat16_equals_transformers_generate(arm_models, name, tmp_path):
    m, ref = arm_models(name, "bfloat16")
    bad, _ = run_arm_sweep(m, ref, random.Random(zlib.crc32(b"bf16" + name.encode())), 10, tmp_path)
    assert not bad, "\n".join(bad)


def test_warpers_keep_what_transformers_keeps():
    """The filters against transformers' own warpers: exact top-p boundaries (a token whose preceding
    mass equals top_p), ties at the k-th logit, min-p, random logits; -inf where transformers puts it."""
    exact = torch.log(torch.tensor([[0.5, 0.25, 0.25, 1e-9], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]))
    g = torch.Generator().manual_seed(0)
    rand = torch.cat([torch.randn(64, 40, generator=g) * 3, torch.randint(-3, 3, (64, 40), generator=g).float()])
    for logits in (exact, rand):
        for temperature in (0.5, 1.0, 2.0):
            for top_k in (0, 1, 2, 3, 50):
                for top_p in (None, 0.0, 0.25, 0.5, 0.75, 0.9, 1.0):
                    for min_p in (None, 0.0, 0.3):
                        procs = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
                        procs += [TopKLogitsWarper(top_k)] if top_k else []
                        procs += [TopPLogitsWarper(top_p)] if top_p is not None and top_p < 1 else []
                        procs += [MinPLogitsWarper(min_p)] if min_p is not None else []
                        expected = LogitsProcessorList(procs)(None, logits.clone())
                        got = warp(logits.clone(), temperature, top_k, top_p, min_p)
                        assert torch.equal(torch.isinf(got), torch.isinf(expected)), (temperature, top_k, top_p, min_p)
                        kept = ~torch.isinf(got)
                        torch.testing.assert_close(got[kept], expected[kept], rtol=0, atol=0)
    # the boundary Dream's filter draws differently: mass before token 1 is exactly 0.5 = top_p
    assert torch.isinf(warp(exact[:1], 1.0, 0, 0.5, None)).tolist() == [[False, True, True, True]]


@pytest.fixture(scope="module")
def configured_arm(tmp_path_factory):
    """A checkpoint whose generation_config.json asks for sampling with its own settings."""
    stored = GenerationConfig(do_sample=True, temperature=0.6, top_k=7, top_p=0.9, min_p=0.05, eos_token_id=2,
                              pad_token_id=0, bos_token_id=1)
    folder = build_arm(tmp_path_factory.mktemp("configured") / "m", "llama", stored)
    return sinklens.load(folder), AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.mark.parametrize("kw", [dict(do_sample=True), dict(do_sample=True, top_k=0, temperature=1.3),
                                dict(do_sample=False)], ids=["stored-settings", "overridden", "greedy"])
def test_arm_reads_the_checkpoint_generation_config(configured_arm, kw):
    m, ref = configured_arm
    ids = torch.randint(3, V, (2, 5), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(3)
    expected = ref.generate(ids, max_new_tokens=20, **kw)
    torch.manual_seed(3)
    assert m.generate(ids, max_new_tokens=20, **kw).sequences.tolist() == expected.tolist()


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="deliberate: sinklens decodes greedily unless do_sample=True is passed, even when the "
                   "checkpoint's generation_config.json sets do_sample (docs/samplers.md, ARM)")
def test_arm_default_samples_when_the_checkpoint_says_so(configured_arm):
    m, ref = configured_arm
    ids = torch.randint(3, V, (2, 5), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(3)
    expected = ref.generate(ids, max_new_tokens=20)
    torch.manual_seed(3)
    assert m.generate(ids, max_new_tokens=20).sequences.tolist() == expected.tolist()


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="deliberate: with no max_new_tokens sinklens generates 32 new tokens; generate stops at "
                   "max_length 20 including the prompt (docs/samplers.md, ARM)")
def test_arm_default_length_is_generates(arm_models):
    m, ref = arm_models("llama")
    ids = torch.randint(3, V, (1, 5), generator=torch.Generator().manual_seed(0))
    assert m.generate(ids, eos_token_id=[]).sequences.tolist() == ref.generate(ids, eos_token_id=[]).tolist()


# ---------------------------------------------------------------------------------------------- DiffusionGemma

DG_V, DG_C, DG_WINDOW = 96, 8, 6
DG_TEXT = dict(vocab_size=DG_V, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
               sliding_window=DG_WINDOW, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
               num_experts=2, top_k_experts=1, moe_intermediate_size=16, pad_token_id=0, eos_token_id=1,
               bos_token_id=2, use_bidirectional_attention="vision")
DG_VISION = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=2, head_dim=8)


def build_dg(folder, generation_config=None):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    config = DiffusionGemmaConfig(text_config=DG_TEXT, vision_config=DG_VISION, canvas_length=DG_C,
                                  eos_token_id=[1, 50])  # a top-level EOS list, as the hub's configs
    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion(config)
    if generation_config is not None:
        model.generation_config = generation_config
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def dg_folder(tmp_path_factory):
    return build_dg(tmp_path_factory.mktemp("dg") / "m")


def dg_pair(folder, dtype="float32"):
    from transformers import DiffusionGemmaForBlockDiffusion

    ref = DiffusionGemmaForBlockDiffusion.from_pretrained(str(folder), attn_implementation="sdpa",
                                                          dtype=getattr(torch, dtype)).eval()
    return sinklens.load(folder, dtype=dtype), ref


def dg_reference_kwargs(kw: dict) -> dict:
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    kw = dict(kw)
    if "entropy_bound" in kw:  # transformers takes the bound inside its sampler config
        kw["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=kw.pop("entropy_bound"))
    return kw


def dg_combo(rng: random.Random):
    B, P = rng.choice([1, 1, 2, 3]), rng.choice([1, 2, 4, 7, 10, 13])  # prompts shorter and longer than the window
    lengths = [P] + [rng.randint(1, P) for _ in range(B - 1)]
    rng.shuffle(lengths)
    mask = torch.tensor([[0] * (P - n) + [1] * n for n in lengths])
    kind = rng.random()
    if kind < 0.1:  # right padding
        mask = mask.flip(1)
    elif kind < 0.2:  # holes anywhere
        mask = torch.tensor([[int(rng.random() < 0.7) for _ in range(P)] for _ in range(B)])
    ids = torch.tensor([[rng.randrange(3, DG_V) for _ in range(P)] for _ in range(B)]) * mask
    if rng.random() < 0.15 and bool(mask.all()):
        mask = None
    kw = dict(max_new_tokens=rng.choice([1, 5, 8, 9, 16, 24]), max_denoising_steps=rng.choice([1, 2, 3, 5, 8]))
    if rng.random() < 0.5:
        kw["entropy_bound"] = rng.choice([0.01, 0.1, 0.6, 2.0, 10.0])
    if rng.random() < 0.4:
        kw["t_min"], kw["t_max"] = sorted(rng.sample([0.0, 0.1, 0.4, 0.8, 1.0, 1.5, 3.0], 2))
    if rng.random() < 0.4:
        kw["stability_threshold"] = rng.choice([0, 1, 2, 3])
    if rng.random() < 0.4:  # mean canvas entropy here lies near 4.53-4.55: some rows stop early, some not
        kw["confidence_threshold"] = rng.choice([0.005, 1.0, 4.5, 4.55, 50.0])
    return ids, mask, kw


def run_dg_sweep(m, ref, rng: random.Random, n: int, tmp_path):
    bad = []
    for i in range(n):
        ids, mask, kw = dg_combo(rng)
        P, seed = ids.shape[1], rng.randrange(1000)
        masked = {} if mask is None else {"attention_mask": mask}  # its generate takes no attention_mask=None
        torch.manual_seed(seed)
        free = ref.generate(ids, **masked, **dg_reference_kwargs(kw)).sequences
        r = rng.random()
        if r < 0.3:
            kw["eos_token_id"] = int(free[0, P + min(2, free.shape[1] - P - 1)])  # row 0 stops in its first canvas
        elif r < 0.45:
            kw["eos_token_id"] = [int(free[-1, -1]), 7]
        if rng.random() < 0.3:
            kw["pad_token_id"] = rng.choice([0, 5])
        torch.manual_seed(seed)
        expected = ref.generate(ids, **masked, **dg_reference_kwargs(kw)).sequences.tolist()
        torch.manual_seed(seed)
        plain = m.generate(ids, mask, **kw).sequences.tolist()
        torch.manual_seed(seed)
        traced = m.generate(ids, mask, **kw, trace=tmp_path / f"{i}.arrow",
                            capture=CaptureOptions(map_slices=((2, 1),), query_chunk=3))
        steps = sinklens.open_trace(traced.trace_path).num_steps, traced.num_steps  # one record per denoising step
        traced = traced.sequences.tolist()
        if plain != expected or traced != expected or steps[0] != steps[1]:
            bad.append(f"combo {i}: prompt {tuple(ids.shape)} {kw} seed {seed}\n  transformers {expected}\n"
                       f"  plain {plain}\n  traced {traced}")
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("dtype,n", [("float32", 40), ("bfloat16", 12)])
def test_diffusion_gemma_equals_transformers_generate(dg_folder, dtype, n, tmp_path):
    m, ref = dg_pair(dg_folder, dtype)
    bad = run_dg_sweep(m, ref, random.Random(zlib.crc32(dtype.encode())), n, tmp_path)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("stored", [
    dict(max_new_tokens=16, max_denoising_steps=4, t_min=0.3, t_max=0.9, entropy_bound=0.5, stability_threshold=2,
         confidence_threshold=4.55, eos_token_id=[1, 50], pad_token_id=0),
    dict(max_length=30, max_denoising_steps=3, eos_token_id=[3], pad_token_id=5),  # prompt + generation
], ids=["settings", "max_length"])
@pytest.mark.parametrize("kw", [{}, dict(max_new_tokens=256, max_denoising_steps=2), dict(max_new_tokens=8)],
                         ids=["defaults", "default-length-passed", "length"])
def test_diffusion_gemma_reads_the_checkpoint_generation_config(tmp_path, stored, kw):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

    m, ref = dg_pair(build_dg(tmp_path / "m", DiffusionGemmaGenerationConfig(**dg_reference_kwargs(stored))))
    ids = torch.randint(3, DG_V, (2, 5), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    expected = ref.generate(ids, **kw).sequences
    torch.manual_seed(1)
    assert m.generate(ids, **kw).sequences.tolist() == expected.tolist()
