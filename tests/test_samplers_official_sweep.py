"""The llada / dream samplers against the official LLaDA `generate()` and Dream `diffusion_generate()`
over argument combinations the shared reference cases leave out: sampling temperatures with Gumbel
noise / top-p / top-k, random remasking, CFG with sampling and padding, block / step layouts, batches
of three with different left padding, alg_temp, eps, max_length, the EOS options. Every case token
for token, per-step history included, with and without attention capture (tests/fixtures/official_sweep:
README.md says how the official code ran; make_fixtures.py wrote cases.json)."""
import json
from pathlib import Path

import pytest
import torch

import sinklens
from sinklens.samplers import CaptureOptions

torch.set_num_threads(1)  # tiny models: threads only contend on the shared 2-core machine

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "official_sweep"
CASES = json.loads((FIXTURE / "cases.json").read_text())["cases"]
CASES16 = json.loads((FIXTURE / "cases_bf16.json").read_text())["cases"]
EOT = 298  # the id the official code's hard-coded EoT (126348) became for this vocabulary (README.md)


@pytest.fixture(scope="module")
def models(fixtures_dir):
    # The fixtures have no tokenizer, so no EoT id: give the models the one the patched official copy used.
    loaded = {f: sinklens.load(fixtures_dir / f) for f in ("llada", "dream")}
    loaded["llada"].eot_id = EOT
    return loaded


@pytest.fixture(scope="module")
def models16(request):
    """bfloat16, loaded as the official models were: LLaDA's sampler on the committed LLaDA-MoE fixture
    (its bf16 logits are the official ones to the bit; LLaDA's own file rotates in float32), Dream on
    the shared one (needs ../shared: requested only by the Dream cases)."""
    return {"lladamoe": sinklens.load(Path(__file__).resolve().parent / "fixtures" / "lladamoe", dtype="bfloat16")}


def sinklens_kwargs(case) -> dict:
    """sinklens' arguments for the official call's."""
    args = dict(case["arguments"])
    if case["family"] == "dream":
        args["mask_id"] = args.pop("mask_token_id")
        if "dual_cache" in args:  # Fast-dLLM's generation_utils_block.py: the cached decoding
            args["cache"] = "dual" if args.pop("dual_cache") else "prefix"
        if args.get("alg") == "confidence_threshold":  # Fast-dLLM's name for its threshold decoding
            del args["alg"]
        if "eps" in args:
            args["time_eps"] = args.pop("eps")
        if "max_length" in args:  # the official total length; sinklens counts the new tokens
            args["max_new_tokens"] = args.pop("max_length") - len(case["input_ids"][0])
    return args


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])  # a trace must not change a token
@pytest.mark.parametrize("case", CASES, ids=[f"{c['family']}-{c['name']}" for c in CASES])
def test_equals_official_sampler(models, case, capture):
    am = None if case["attention_mask"] is None else torch.tensor(case["attention_mask"])
    kwargs = sinklens_kwargs(case)
    if capture:
        kwargs["capture"] = CaptureOptions(map_slices=((1, 2),), map_steps=(0,))
    torch.manual_seed(case["seed"])  # the official call ran right after this seed
    out = models[case["family"]].generate(torch.tensor(case["input_ids"]), am, **kwargs)
    history = [h.tolist() for h in out.history]
    first = next((s for s, (a, b) in enumerate(zip(history, case["history"])) if a != b), None)
    assert first is None, f"step {first} differs from the official sampler"
    assert len(history) == len(case["history"])
    assert out.sequences.tolist() == case["expected_output_ids"]


@pytest.mark.parametrize("case", CASES16, ids=[f"{c['family']}-{c['name']}" for c in CASES16])
def test_bf16_equals_official_sampler(models16, request, case):
    """The official samplers compute in the dtype of the model's logits: CFG's mix, the softmax, top-p's
    cumulative sum and the confidences round in bfloat16, and their ties decide which positions commit."""
    if case["family"] not in models16:
        models16[case["family"]] = sinklens.load(request.getfixturevalue("fixtures_dir") / case["family"],
                                                 dtype="bfloat16")
    m = models16[case["family"]]
    assert m.dtype == torch.bfloat16
    am = None if case["attention_mask"] is None else torch.tensor(case["attention_mask"])
    torch.manual_seed(case["seed"])
    out = m.generate(torch.tensor(case["input_ids"]), am, **sinklens_kwargs(case))
    if "history" in case:
        assert [h.tolist() for h in out.history] == case["history"]
    else:  # Fast-dLLM's functions return no history: the number of forwards instead
        assert out.num_steps == case["nfe"]
    assert out.sequences.tolist() == case["expected_output_ids"]
