"""The llada2 / llada21 / sdar samplers against the official LLaDA2.0 and LLaDA2.1 `generate()` and SDAR's
`block_diffusion_generate` over argument combinations the reference cases of tests/fixtures/{llada2,sdar}
leave out: sampling with top-k / top-p (0 and the vocabulary size included), every SDAR remasking
strategy with blocks of 1-8 and 1..block+2 steps, prompts shorter and longer than a block, gen_length off
the block grid, steps above the block, thresholds 0 and 1, minimal_topk above gen_length, the EOS options
with the end token in the prompt, LLaDA2.1's editing threshold / post steps / num_to_transfer, stop ids,
bfloat16 and (SDAR's script default) float16, and LLaDA2's weights routed to 4 experts of 8. Every case
token for token, per-step history included, with and without attention capture; arguments on which the
official call fails must fail here in one clear line (tests/fixtures/official_sweep2: README.md says how
the official code ran)."""
import json
from pathlib import Path

import pytest
import torch

import sinklens
from _kernels import param
from sinklens.samplers import CaptureOptions

torch.set_num_threads(1)  # tiny models: threads only contend on the shared 2-core machine

HERE = Path(__file__).resolve().parent / "fixtures"
SWEEP = HERE / "official_sweep2"
CHECKPOINT = {"llada2": HERE / "llada2", "sdar": HERE / "sdar"}
FILES = ("llada2", "llada2_bf16", "llada2_topk4", "sdar", "sdar_bf16", "sdar_fp16")
META = {f: json.loads((SWEEP / f"{f}.json").read_text()) for f in FILES}
CASES = [(f, c) for f in FILES for c in META[f]["cases"]]
# Deliberately refused although the official call runs: steps=0 (its generate() returns the masks
# untouched; sinklens says in one line that steps must be a positive integer, docs/samplers.md).
REFUSED = {("llada2", "v20_steps0"), ("llada2", "v21_steps0")}
RUNS = [(f, c) for f, c in CASES if "error" not in c and (f, c["name"]) not in REFUSED]
FAILS = [(f, c) for f, c in CASES if "error" in c]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A loader by (checkpoint, dtype, config changes); a case with `config_changes` runs the committed
    weights under the changed config (a folder made here: the config changed, the weights linked)."""
    loaded = {}

    def get(file: str, case: dict):
        changes = case.get("config_changes", {})
        key = (file.split("_")[0], case.get("dtype", "float32"), json.dumps(changes, sort_keys=True))
        if key not in loaded:
            folder = CHECKPOINT[key[0]]
            if changes:
                folder, original = tmp_path_factory.mktemp("variant"), folder
                config = json.loads((original / "config.json").read_text())
                (folder / "config.json").write_text(json.dumps({**config, **changes}))
                (folder / "model.safetensors").symlink_to(original / "model.safetensors")
            loaded[key] = sinklens.load(folder, dtype=key[1])
        return loaded[key]
    return get


def run(model, file: str, case: dict, capture: bool):
    kwargs = dict(case["arguments"])
    if file.startswith("llada2"):
        kwargs["sampler"] = case["model"]  # llada2 (LLaDA2.0) or llada21 (LLaDA2.1): which official file
    elif kwargs["stopping_criteria_idx"] is None:
        kwargs["stopping_criteria_idx"] = []  # the official function's None: never stop
    if capture:
        kwargs["capture"] = CaptureOptions(map_slices=((1, 2),), map_steps=(0,))
    torch.manual_seed(case["seed"])  # the official call ran right after this seed
    return model.generate(torch.tensor(case["input_ids"]), **kwargs)


def fed_windows(out, case: dict) -> list[list[int]]:
    """The window each LLaDA2 step's forward got: the canvas before the step (the prompt and masks, then
    the canvas after the previous step), cut to the official window's length."""
    P, mask = len(case["input_ids"][0]), case["arguments"]["mask_id"]
    lengths = [len(w) for w in case["forward_inputs"]]
    before = [torch.tensor(case["input_ids"][0] + [mask] * max(lengths + [0]))] + [h[0] for h in out.history]
    assert P == out.sequences.shape[1] - len(case["expected_output_ids"][0])
    return [before[k][:n].tolist() for k, n in enumerate(lengths)]


@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])  # capture must not change a token
@pytest.mark.parametrize("file,case", [param(f, c, id=f"{f}-{c['name']}", dtype=c.get("dtype", "float32"),
                                              kernels=META[f].get("kernels")) for f, c in RUNS])
@pytest.mark.sweep  # a slice by default (tests/conftest.py)
def test_equals_official_sampler(models, file, case, capture):
    m = models(file, case)
    out = run(m, file, case, capture)
    if file.startswith("llada2"):
        P = len(case["input_ids"][0])
        assert out.num_steps == len(case["forward_inputs"])
        got = fed_windows(out, case)
        first = next((s for s, (a, b) in enumerate(zip(got, case["forward_inputs"])) if a != b), None)
        assert first is None, f"the forward of step {first} got another window than the official one"
        assert out.sequences[:, P:].tolist() == case["expected_output_ids"]
    else:
        history = [h.tolist() for h in out.history]
        first = next((s for s, (a, b) in enumerate(zip(history, case["history"])) if a[0] != b), None)
        assert first is None, f"step {first} differs from the official sampler"
        assert len(history) == len(case["history"])
        assert out.sequences.tolist() == case["expected_output_ids"]


@pytest.mark.parametrize("file,case", FAILS, ids=[f"{f}-{c['name']}" for f, c in FAILS])
def test_fails_in_one_line_where_the_official_call_fails(models, file, case):
    """A batch, top_k above the vocabulary, SDAR's entropy_bounded (its official branch never sets
    transfer_index), a [MASK] left after the last SDAR step (the mask id drawn as a token), a greedy
    LLaDA2.1 block that can never change (the official loop never ends): a ValueError / TypeError naming
    the argument, never a traceback from inside torch."""
    with pytest.raises((ValueError, TypeError)) as err:
        run(models(file, case), file, case, capture=False)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


@pytest.mark.parametrize("file,name", sorted(REFUSED))
def test_steps_zero_is_refused_in_one_line(models, file, name):
    """steps=0, which the official LLaDA2 generate() takes (and returns the canvas of masks), is a
    mistake sinklens names in one line instead."""
    case = next(c for f, c in CASES if (f, c["name"]) == (file, name))
    assert case["arguments"]["steps"] == 0
    with pytest.raises(ValueError, match="steps must be a positive integer, got 0"):
        run(models(file, case), file, case, capture=False)
