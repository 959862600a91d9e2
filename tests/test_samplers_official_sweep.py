"""The llada / dream samplers against the official LLaDA `generate()` and Dream `diffusion_generate()`
over argument combinations the shared reference cases leave out: sampling temperatures with Gumbel
noise / top-p / top-k, random remasking, CFG with sampling and padding, block / step layouts, batches
of three with different left padding, alg_temp, eps, max_length, the EOS options, and Dream with a pad
right before a [MASK]. Every case token for token, per-step history included, with and without attention
capture (tests/fixtures/official_sweep: README.md says how the official code ran; make_fixtures.py wrote
cases.json, make_padding_cases.py cases_padding.json)."""
import json
from pathlib import Path

import pytest
import torch

import sinklens
from _kernels import cpu, param
from sinklens.samplers import CaptureOptions

torch.set_num_threads(1)  # tiny models: threads only contend on the shared 2-core machine

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "official_sweep"
CASES = json.loads((FIXTURE / "cases.json").read_text())["cases"]
SHORT_META = json.loads((FIXTURE / "cases_short.json").read_text())  # prompts of 1-3 tokens (below)
SHORT_ALL = SHORT_META["cases"]
BF16_META = json.loads((FIXTURE / "cases_bf16.json").read_text())
CASES16 = [(c, BF16_META["kernels"]) for c in BF16_META["cases"]] + [(c, SHORT_META["kernels"]) for c in SHORT_ALL
                                                                      if c["dtype"] == "bfloat16"]
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


@pytest.mark.slow
@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])  # a trace must not change a token
@pytest.mark.parametrize("case", CASES, ids=[f"{c['family']}-{c['name']}" for c in CASES])
@pytest.mark.sweep  # a slice by default (tests/conftest.py)
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


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])  # the default route in bf16: lse
@pytest.mark.parametrize("case", [param(c, id=f"{c['family']}-{c['name']}", dtype=c["dtype"], kernels=k) for c, k in CASES16])
@pytest.mark.sweep
def test_bf16_equals_official_sampler(models16, request, case, capture):
    """The official samplers compute in the dtype of the model's logits: CFG's mix, the softmax, top-p's
    cumulative sum and the confidences round in bfloat16, and their ties decide which positions commit."""
    if case["family"] not in models16:
        models16[case["family"]] = sinklens.load(request.getfixturevalue("fixtures_dir") / case["family"],
                                                 dtype="bfloat16")
    m = models16[case["family"]]
    assert m.dtype == torch.bfloat16
    am = None if case["attention_mask"] is None else torch.tensor(case["attention_mask"])
    kwargs = sinklens_kwargs(case)
    if capture:
        kwargs["capture"] = CaptureOptions(map_slices=((1, 2),), map_steps=(0,))
    torch.manual_seed(case["seed"])
    out = m.generate(torch.tensor(case["input_ids"]), am, **kwargs)
    if "history" in case:
        assert [h.tolist() for h in out.history] == case["history"]
    else:  # Fast-dLLM's functions return no history: the number of forwards instead
        assert out.num_steps == case["nfe"]
    assert out.sequences.tolist() == case["expected_output_ids"]


# A pad right before a [MASK] (cases_padding.json, make_padding_cases.py): Dream predicts the [MASK] from the
# pad's row, which its official mask lets see no key. Routes: plain; traced with the whole-layer pass (exact),
# the chunk loop (exact with a map) and lse. bfloat16 takes the route `auto` picks there (lse): the exact route
# drifts from sdpa by bf16 rounding steps with or without padding (sinklens/attention/function.py, choose_route).
PADDING = json.loads((FIXTURE / "cases_padding.json").read_text())
PAD_ROUTES = [param(c, r, id=f"{c['dtype']}-{c['name']}-{r}", dtype=c["dtype"], kernels=PADDING.get("kernels"))
              for c in PADDING["cases"]
              for r in (("plain", "exact", "exact-map", "lse") if c["dtype"] == "float32" else ("plain", "auto"))]


@pytest.fixture(scope="module")
def dream_models(fixtures_dir):
    return {dt: sinklens.load(fixtures_dir / "dream", dtype=dt) for dt in ("float32", "bfloat16")}


@pytest.mark.parametrize("case,route", PAD_ROUTES)
def test_a_pad_before_a_mask_equals_official(dream_models, case, route):
    kwargs = sinklens_kwargs(case)
    if route != "plain":
        kwargs["capture"] = CaptureOptions(route=route.split("-")[0],
                                           **({"map_slices": ((1, 2),), "map_steps": (0, 1)} if "map" in route else {}))
    torch.manual_seed(case["seed"])
    out = dream_models[case["dtype"]].generate(torch.tensor(case["input_ids"]), torch.tensor(case["attention_mask"]),
                                               **kwargs)
    history = [h.tolist() for h in out.history]
    first = next((s for s, (a, b) in enumerate(zip(history, case["history"])) if a != b), None)
    assert first is None, f"step {first} differs from the official sampler"
    assert len(history) == len(case["history"]) and out.sequences.tolist() == case["expected_output_ids"]


@pytest.mark.parametrize("route", [None, "exact", "lse"], ids=["plain", "exact", "lse"])
def test_pad_rows_logits_equal_official(dream_models, route):
    """The logits of a right-padded canvas' pad rows (what Dream reads for the [MASK] after a pad) are the
    official forward's, plain and traced."""
    from sinklens.attention import AttentionRequest

    f = PADDING["forward"]
    am = torch.tensor(f["attention_mask"])
    req = None if route is None else AttentionRequest(capture=True, route=route)
    logits = dream_models["float32"].forward_logits(torch.tensor(f["input_ids"]), am, attention=req)
    rows = torch.tensor(f["pad_rows"])
    assert (am[rows[:, 0], rows[:, 1]] == 0).all()
    got = logits[rows[:, 0], rows[:, 1]]  # (pads, V)
    assert float((got - torch.tensor(f["logits"])).abs().max()) <= 1e-5
    if req is not None:  # a pad's row is not a query row: every real row spends 1, the pads nothing
        torch.testing.assert_close(req.received.sum(-1), am.sum(-1).float()[None, :, None].expand_as(req.received.sum(-1)))


# Prompts of 1-3 real tokens (cases_short.json, make_short_prompts.py), alone and in left-padded batches whose rows
# have different prompt lengths, one row without any real prompt token: plain and traced, step for step.
SHORT = [c for c in SHORT_ALL if c["dtype"] == "float32"]  # the bfloat16 ones run with CASES16
# A row with no prompt token is all [MASK]: its positions' confidences tie to ~1e-6 (relative), and the exact route
# (auto on a float32 CPU; its output is within ~1e-5 of sdpa's) flips which one commits. The lse route, whose output
# is sdpa's own, keeps the official choice (test_a_maskonly_row_is_a_near_tie below says why it must be lse there).
NEAR_TIE = {"batch2_row_without_prompt"}
# The same tie is decided by the float32 kernels' order of summation, which torch and MKL pick by CPU: the row flips
# untraced on an AVX2-only AMD EPYC and on an AMX Intel Xeon alike, and no setting reproduces the fixture CPU's
# kernels on another. So a NEAR_TIE case that differs is checked where it differs, on any CPU: the positions the two
# samplers committed differently at that step must have confidences within NEAR_TIE_GAP (relative) of each other on
# the step's own logits; then it is an expected failure naming the gap and this CPU, else a failure.
NEAR_TIE_GAP = 1e-5   # the all-[MASK] row's gaps: ~1e-6 (test_a_maskonly_row_is_a_near_tie)


class StepLogits:
    """A hook keeping each step's logits as the sampler used them (row j predicts position j, shift included)."""

    wants_commit_prob = False

    def __init__(self):
        self.logits = []

    def after_step(self, event):
        self.logits.append(event.logits.double())


def confidences(logits: torch.Tensor, case) -> torch.Tensor:
    """(B, S) the confidence the case's sampler ranks masked positions by, greedy: LLaDA's low_confidence and
    Dream's maskgit_plus the top probability, Dream's entropy the negative entropy, topk_margin top-1 minus top-2."""
    p = logits.softmax(-1)
    alg = case["arguments"].get("alg", "maskgit_plus") if case["family"] == "dream" else "maskgit_plus"
    if alg == "entropy":
        return (p * (p + 1e-10).log()).sum(-1)
    top = p.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1] if alg == "topk_margin" else top[..., 0]


def committed_gap(logits: torch.Tensor, ours: list, official: list, case) -> float:
    """The largest relative spread, over the rows, of the confidences of the positions that `ours` and `official`
    (the canvases after one step from the same canvas, (B, S) lists) hold differently: ~0 where the two samplers
    chose among tied positions; inf where a position holds two different tokens (not a choice of position).
    logits (B, S, V): that step's."""
    mask = case["arguments"].get("mask_id", case["arguments"].get("mask_token_id"))
    conf, gap = confidences(logits, case), 0.0
    for row, (a, b) in enumerate(zip(ours, official)):
        differ = [j for j, (x, y) in enumerate(zip(a, b)) if x != y]
        if any(a[j] != mask and b[j] != mask for j in differ):
            return float("inf")
        if differ:
            c = conf[row, differ]
            gap = max(gap, float((c.max() - c.min()) / c.abs().max()))
    return gap


@pytest.mark.parametrize("traced", [False, True], ids=["plain", "traced"])
@pytest.mark.parametrize("case", SHORT, ids=[f"{c['family']}-{c['name']}" for c in SHORT])
@pytest.mark.sweep
def test_short_prompts_equal_official(models, case, traced, tmp_path):
    am = None if case["attention_mask"] is None else torch.tensor(case["attention_mask"])
    kwargs = sinklens_kwargs(case)
    if traced:
        route = "lse" if case["name"] in NEAR_TIE else "auto"
        kwargs |= dict(trace=tmp_path / "run.arrow",
                       capture=CaptureOptions(map_slices=((1, 2),), map_steps=(0,), route=route))
    steps = StepLogits() if case["name"] in NEAR_TIE else None   # (the other cases run without a hook)
    torch.manual_seed(case["seed"])
    out = models[case["family"]].generate(torch.tensor(case["input_ids"]), am, hook=steps, **kwargs)
    history = [h.tolist() for h in out.history]
    first = next((s for s, (a, b) in enumerate(zip(history, case["history"])) if a != b), None)
    if first is not None and case["name"] in NEAR_TIE:
        gap = committed_gap(steps.logits[first], history[first], case["history"][first], case)
        if gap < NEAR_TIE_GAP:
            pytest.xfail(f"a near tie decided by this CPU's float32 kernels ({cpu()[0]}, {' '.join(cpu()[1])}): "
                         f"step {first} commits positions whose confidences are {gap:.1e} apart (relative)")
        raise AssertionError(f"step {first} differs from the official sampler, and not between tied positions "
                             f"(relative confidence gap {gap:.1e})")
    assert first is None, f"step {first} differs from the official sampler"
    assert len(history) == len(case["history"]) and out.sequences.tolist() == case["expected_output_ids"]
    if traced:
        assert sinklens.open_trace(out.trace_path).num_steps == len(case["history"])


def test_committed_gap_tells_a_tie_from_a_wrong_choice():
    """What excuses a NEAR_TIE case: two positions swapped between tied confidences, and nothing else."""
    M = 9
    logits = torch.zeros(1, 3, 5, dtype=torch.float64)   # position 0: uniform (the least confident)
    logits[0, 1, 0], logits[0, 2, 0] = 4.0, 4.0 + 1e-9    # positions 1 and 2: tied
    for case in ({"family": "dream", "arguments": {"alg": "entropy", "mask_token_id": M}},
                 {"family": "dream", "arguments": {"alg": "topk_margin", "mask_token_id": M}},
                 {"family": "llada", "arguments": {"mask_id": M}}):
        assert committed_gap(logits, [[M, M, 0]], [[M, 0, M]], case) < NEAR_TIE_GAP        # the tied pair swapped
        assert committed_gap(logits, [[0, M, M]], [[M, 0, M]], case) > 1e-2                # the least confident taken
        assert committed_gap(logits, [[M, 1, M]], [[M, 0, M]], case) == float("inf")       # another token
        assert committed_gap(logits, [[M, 0, M]], [[M, 0, M]], case) == 0.0


def test_short_prompt_cases_cover_one_token_and_mixed_lengths():
    """A change of make_short_prompts.py that drops these fails here."""
    for family in ("llada", "dream"):
        cases = [c for c in SHORT if c["family"] == family]
        assert any(len(c["input_ids"][0]) == 1 for c in cases)
        real = [sorted({sum(r) for r in c["attention_mask"]}) for c in cases if c["attention_mask"]]
        assert [0, 2] in real and [1, 2, 3] in real  # a row without prompt; rows of 1, 2 and 3 real tokens
    short16 = [c for c, _ in CASES16 if c["name"].startswith("bf16_short")]
    assert {c["family"] for c in short16} == {"lladamoe", "dream"} and any(len(c["input_ids"][0]) == 1 for c in short16)


def test_a_maskonly_row_is_a_near_tie(models):
    """Why NEAR_TIE takes the lse route: at LLaDA's first step the all-[MASK] row's best two confidences differ
    by about 1e-6 of their value, while the exact route's logits differ from sdpa's by a few 1e-6: float32
    rounding decides which position commits, and only the lse route is sdpa's own."""
    from sinklens.attention import AttentionRequest

    case = next(c for c in SHORT if c["family"] == "llada" and c["name"] in NEAR_TIE)
    m, prompt_mask, P = models["llada"], torch.tensor(case["attention_mask"]), len(case["input_ids"][0])
    canvas = torch.tensor(case["history"][0])
    canvas[:, P:] = case["arguments"]["mask_id"]  # the canvas step 0 saw
    am = torch.nn.functional.pad(prompt_mask, (0, canvas.shape[1] - P), value=1)
    row = int((prompt_mask.sum(-1) == 0).nonzero()[0])
    plain = m.forward_logits(canvas, am)
    conf = plain[row, P:].double().softmax(-1).amax(-1).sort(descending=True).values
    assert (conf[0] - conf[1]) / conf[0] < 5e-6  # measured 1.0e-6
    for route, bound in (("exact", 1e-4), ("lse", 0.0)):
        got = m.forward_logits(canvas, am, attention=AttentionRequest(capture=True, route=route))
        assert float((got - plain).abs().max()) <= bound
