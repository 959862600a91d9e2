"""The length policy (sinklens/samplers/lengths.py): one table, sampler x model context x training
config x task x the user's settings -> (length, steps, block) and the notes; then the callers that
must agree with it (the Python API, `sinklens generate`, `sinklens eval`, the twins' presets)."""
import json
import re

import pytest
import torch

import sinklens
from sinklens.cli import main
from sinklens.samplers import lengths
from sinklens.samplers.registry import get_config

TWIN = {"kind": "dlm", "gen_length": 16, "block_length": 8}  # the shipped tiny-dlm's training config
SHIFT = {"kind": "dlm-shift", "gen_length": 24, "block_length": 0}  # 0: one block (a Dream-format twin)
PAPER = "the paper's setting"

# sampler, (context, prompt), train, task (name, its length), policy keywords -> (length, steps, block), other
# values expected, note (a substring of the one note; None: no note, Exception: the error's message)
TABLE = [
    # no training config, no task: the paper's GSM8K setting (the command line), official defaults (Python)
    ("llada", (None, None), None, (None, None), {}, (256, 256, 32), dict(temperature=0.0), None),
    ("llada", (64, 20), None, (None, None), {}, (32, 32, 32), {},
     "gen_length 256 (the paper's setting) capped to 32: the prompt has 20 tokens and the model's context is 64; "
     "set --gen-length to choose"),
    ("llada", (64, 20), None, (None, None), dict(overrides=dict(gen_length=40)), (40, 40, 40), {},
     "block_length 32 does not divide gen_length 40: one block of 40; set --block-length to choose"),
    ("llada", (None, None), None, (None, None), dict(overrides=dict(gen_length=96)), (96, 96, 32), {}, None),
    ("llada", (64, 20), None, (None, None), dict(overrides=dict(gen_length=50)), None, {},
     ValueError("--gen-length 50 does not fit: the prompt (20 tokens) + 50 exceeds the model's context of 64; "
                "--gen-length must be at most 44")),
    ("llada", (20, 20), None, (None, None), {}, None, {}, ValueError("no room left to generate")),
    ("llada", (None, None), None, (None, None), dict(fallback="official"), (128, 128, 128), {}, None),
    ("llada", (128, 10), None, (None, None), dict(fallback="official", flags=False), (118, 118, 118), {},
     "gen_length 128 (the official defaults) capped to 118: the prompt has 10 tokens and the model's context is 128; "
     "set gen_length to choose"),  # one official block of 128 does not fit: one block of the room
    ("llada", (None, None), None, (None, None), dict(fallback="official", overrides=dict(gen_length=64, block_length=64)),
     (64, 128, 64), {}, None),  # the official defaults stay: steps do not follow the length
    # a task: its answer length or the paper's for it, whole blocks rounded up
    ("llada", (None, None), None, ("humaneval", None), {}, (512, 512, 32), {}, None),
    ("llada", (None, None), None, ("arith", 16), {}, (16, 16, 16), {}, None),
    ("llada", (None, None), None, (None, 100), {}, (128, 128, 32), {}, None),  # an lm-eval request of 100 tokens
    ("llada", (None, None), None, (None, 100), dict(overrides=dict(block_length=8)), (104, 104, 8), {}, None),
    ("llada", (None, None), None, ("gsm8k", None), dict(length=64), (64, 64, 32), {}, None),  # eval's --gen-length
    ("llada", (None, None), None, ("gsm8k", None), dict(length=64, overrides=dict(gen_length=32)), None, {},
     ValueError("two lengths given: 64 and --gen-length 32")),
    # a sinklens-trained twin: its training settings, whatever the task or the fallback
    ("llada", (128, 10), TWIN, (None, None), {}, (16, 16, 8), dict(remasking="low_confidence"), None),
    ("llada", (128, 10), TWIN, ("arith", 16), {}, (16, 16, 8), {}, None),
    ("llada", (128, 10), TWIN, ("gsm8k", None), {}, (16, 16, 8), {}, None),
    ("llada", (128, 10), TWIN, (None, None), dict(fallback="official"), (16, 16, 8), {}, None),
    ("llada", (128, 10), TWIN, (None, None), dict(overrides=dict(gen_length=32)), (32, 32, 8), {}, None),
    ("llada", (128, 10), TWIN, ("arith", 16), dict(overrides=dict(block_length=16)), (16, 16, 16), {}, None),
    ("llada", (128, 120), TWIN, (None, None), {}, (8, 8, 8), {}, "gen_length 16 (the model's training config) capped to 8"),
    # Dream: no blocks
    ("dream", (4096, 20), None, (None, None), {}, (256, 256, None), dict(alg="entropy", temperature=0.1, top_p=0.9), None),
    ("dream", (None, None), None, ("humaneval", None), dict(overrides=dict(steps=64)), (768, 64, None), {}, None),
    ("dream", (None, None), SHIFT, ("arith", 16), {}, (24, 24, None), dict(alg="maskgit_plus", temperature=0.0), None),
    ("dream", (None, None), None, (None, None), dict(fallback="official", overrides=dict(max_new_tokens=16)),
     (16, 512, None), {}, None),
    ("dream", (None, None), None, (None, None), dict(fallback="official", overrides=dict(eps=0.01)), (20, 512, None),
     dict(time_eps=0.01), "--eps of the dream sampler is deprecated; use --time-eps"),
    # ARM: no steps
    ("arm", (128, 120), None, (None, None), {}, (8, None, None), dict(do_sample=False),
     "max_new_tokens 256 (the paper's setting) capped to 8"),
    ("arm", (None, None), {**TWIN, "kind": "arm"}, ("gsm8k", None), {}, (16, None, None), {}, None),
    # DiffusionGemma has no paper setting (None: the checkpoint's generation_config); encoders generate nothing
    ("diffusion_gemma", (None, None), None, (None, None), {}, (None, None, None), {}, None),
    ("diffusion_gemma", (None, None), None, ("arith", 16), {}, (16, None, None), {}, None),
    ("encoder", (512, 20), TWIN, ("arith", 16), {}, (None, None, None), {}, None),
]


@pytest.mark.parametrize("sampler,context,train,task,kw,expected,other,note", TABLE)
def test_the_length_policy(sampler, context, train, task, kw, expected, other, note):
    cls = get_config(sampler)
    facts = lengths.ModelFacts(context[0], train)
    call = dict(task=task[0], task_length=task[1], prompt_length=context[1], **kw)
    if isinstance(note, Exception):
        with pytest.raises(type(note), match=re.escape(str(note))):
            lengths.settings(cls, facts, **call)
        return
    plan = lengths.settings(cls, facts, **call)
    v = {**plan.sampler.defaults(), **plan.values}  # fields left out: the sampler's defaults
    assert tuple(v.get(f) if f else None for f in (cls.length_field, cls.steps_field, cls.block_field)) == expected
    assert {k: v.get(k) for k in other} == other
    notes = plan.deprecated + plan.notes
    assert (notes == []) if note is None else (len(notes) == 1 and note in notes[0]), notes
    plan.config()  # a valid config


def test_origin_names_the_source():
    cls = get_config("llada")
    assert lengths.settings(cls).origin == PAPER
    assert lengths.settings(cls, lengths.ModelFacts(train=TWIN), task="arith").origin == "the model's training config"
    assert lengths.settings(cls, task="arith", task_length=16).origin == "the arith task's answer length"
    assert lengths.settings(cls, fallback="official").origin == "the official defaults"
    with pytest.raises(ValueError, match="fallback must be 'paper' or 'official', got 'nope'"):
        lengths.settings(cls, fallback="nope")


def test_a_twins_training_config_is_found_in_its_folder():
    from sinklens.models.loader import ALIASES

    train = lengths.training_config(ALIASES["tiny-dlm"]().folder)
    assert train is not None and (train["gen_length"], train["block_length"]) == (16, 8)


@pytest.fixture(scope="module")
def tiny_dlm():
    return sinklens.load("tiny-dlm", dtype="float32")


def _cli_settings(capsys, *args) -> dict:
    assert main(["generate", "--model", "tiny-dlm", "--dtype", "float32", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)["sampler"]["args"]


def test_the_python_api_runs_a_twin_with_the_command_lines_defaults(tiny_dlm, capsys):
    """`sinklens.load("tiny-dlm").generate(ids)` used the official 128 tokens, which do not fit the
    128-token twin after its prompt; it now runs the twin's training settings, as the CLI does."""
    ids = [3, 4, 5, 6, 7, 8, 9, 10]
    out = tiny_dlm.generate(torch.tensor([ids]))
    cli = _cli_settings(capsys, "--input-ids", ",".join(map(str, ids)))
    assert (out.num_steps, out.sequences.shape[1]) == (cli["steps"], len(ids) + cli["gen_length"]) == (16, 24)
    assert cli["block_length"] == 8
    with pytest.raises(ValueError, match="gen_length 200 does not fit: .* gen_length must be at most 120"):
        tiny_dlm.generate(torch.tensor([ids]), gen_length=200)  # one message, naming the argument


def test_eval_generate_and_replicate_run_the_twin_alike(tiny_dlm, tmp_path, capsys):
    """`sinklens eval --task arith` ran tiny-dlm in blocks of 16 (the task's length, the paper's
    blocks) while generate, trace and replicate used the twin's blocks of 8."""
    from sinklens.experiments.twins import dlm_sampler

    assert main(["eval", "--model", "tiny-dlm", "--task", "arith", "--limit", "1", "--mask-topk", "0",
                 "--dtype", "float32", "--no-loglik", "--no-progress", "--out", str(tmp_path)]) == 0
    run = json.loads(next(tmp_path.rglob("config.json")).read_text())["settings"]
    capsys.readouterr()
    cli = _cli_settings(capsys, "--input-ids", "3,4,5")
    keys = ("gen_length", "steps", "block_length")
    assert [run[k] for k in keys] == [cli[k] for k in keys] == [dlm_sampler()[k] for k in keys] == [16, 16, 8]


def test_a_length_cut_to_the_context_is_one_note_on_every_path(capsys):
    """A 120-token prompt leaves the 128-token ARM twin 8 of its 16 tokens: the command line says so
    on stderr (naming the flag), the Python API as a warning (naming the keyword)."""
    ids = list(range(3, 123))
    assert main(["generate", "--model", "tiny-arm", "--input-ids", ",".join(map(str, ids)), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["sampler"]["args"]["max_new_tokens"] == 8
    assert err.count("note:") == 1 and "max_new_tokens 16 (the model's training config) capped to 8" in err
    assert "set --max-new-tokens to choose" in err
    arm = sinklens.load("tiny-arm", dtype="float32")
    with pytest.warns(UserWarning, match="capped to 8: .* set max_new_tokens to choose"):
        arm.generate(torch.tensor([ids]))
