"""Sampler configs: one dataclass per sampler is the only place its parameters are written;
validation and the command-line flags come from its fields (the length policy, which reads its
length facts, is tests/test_lengths.py)."""
import argparse
from dataclasses import dataclass, fields

import pytest

from sinklens.cli.generate import add_sampler_flags, sampler_args
from sinklens.samplers import registry as configs
from sinklens.samplers.arm import ARMConfig
from sinklens.samplers.registry import SAMPLERS, SamplerConfig, param
from sinklens.samplers.dream import DreamConfig
from sinklens.samplers.llada import LLaDAConfig


@pytest.mark.parametrize("cls,kwargs,match", [
    (LLaDAConfig, dict(steps=0), r"steps must be a positive integer, got 0"),
    (LLaDAConfig, dict(remasking="greedy"), r"remasking must be one of \['low_confidence', 'random'\]"),
    (LLaDAConfig, dict(gen_length=16, block_length=5), r"gen_length \(16\) must be a multiple of block_length \(5\)"),
    (LLaDAConfig, dict(temperature=float("nan")), r"temperature must be >= 0, got nan"),
    (LLaDAConfig, dict(logits_eos_inf="yes"), r"logits_eos_inf must be True or False"),
    (DreamConfig, dict(time_eps=1.0), r"time_eps must be in \(0, 1\), got 1.0"),
    (DreamConfig, dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    (DreamConfig, dict(steps=True), r"steps must be a positive integer, got True"),
    (ARMConfig, dict(do_sample=True, temperature=0.0), r"do_sample=True needs temperature > 0"),
    (ARMConfig, dict(eos_token_id=[1, -2]), r"eos_token_id must be a token id >= 0 or a list of them"),
])
def test_fields_are_checked_from_their_metadata(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_unknown_argument_names_the_sampler_and_its_fields():
    with pytest.raises(TypeError, match=r"the dream sampler got unknown argument\(s\) \['gen_length'\]; it takes"):
        DreamConfig.from_kwargs(gen_length=8)


def test_dreams_old_eps_is_time_eps_with_a_one_line_deprecation_note(capsys):
    with pytest.warns(FutureWarning, match=r"^note: eps of the dream sampler is deprecated; use time_eps$"):
        assert DreamConfig.from_kwargs(eps=0.01).time_eps == 0.01
    with pytest.raises(TypeError, match="both 'eps' and 'time_eps'"):
        DreamConfig.from_kwargs(eps=0.01, time_eps=0.02)
    p, names = _parser()
    assert sampler_args(p.parse_args(["--eps", "0.01"]), names) == {"time_eps": 0.01}  # the old flag still works
    assert capsys.readouterr().err == "note: --eps is deprecated, use --time-eps\n"
    p = argparse.ArgumentParser(exit_on_error=False)
    add_sampler_flags(p, exclude=("eps",))  # `sinklens eval`, where --eps is another setting's old flag
    assert p.parse_known_args(["--eps", "0.01"])[1] == ["--eps", "0.01"] and "--time-eps" in p.format_help()


def _parser():
    p = argparse.ArgumentParser(exit_on_error=False)
    return p, add_sampler_flags(p)


def test_every_field_of_every_sampler_is_a_flag_with_help_and_default():
    p, names = _parser()
    assert set(names) == {f.name for cls in SAMPLERS.values() for f in fields(cls)}
    help_text = p.format_help()
    for name in names:
        action = next(a for a in p._actions if a.dest == name)
        assert action.help and "[official default " in action.help, name
        assert "--" + name.replace("_", "-") in help_text
    args = p.parse_args(["--steps", "8", "--alg", "entropy", "--no-do-sample", "--eos-token-id", "1,2"])
    assert sampler_args(args, names) == {"steps": 8, "alg": "entropy", "do_sample": False, "eos_token_id": [1, 2]}


def test_a_registered_sampler_gets_its_flags_without_any_cli_edit(request):
    request.addfinalizer(lambda: SAMPLERS.pop("toy", None))   # the registry is the real one: leave it as found

    @configs.register("toy")
    @dataclass
    class ToyConfig(SamplerConfig):
        canvas_temperature: float = param(0.5, float, "toy canvas temperature", gt=0)

    p, names = _parser()
    assert "canvas_temperature" in names
    assert p.parse_args(["--canvas-temperature", "2"]).canvas_temperature == 2.0
    with pytest.raises(argparse.ArgumentError, match=r"must be > 0, got -1.0"):
        p.parse_args(["--canvas-temperature", "-1"])


def test_eval_sampler_args_allowed_by_any_sampler_with_that_field():
    """`temperature` is >= 0 for LLaDA but > 0 for SDAR: before the model is known, eval accepts a
    value some sampler allows, and still refuses one that none allows."""
    import pytest

    from sinklens.eval.config import check_sampler_args

    check_sampler_args({"temperature": 0.0, "top_k": 0})
    with pytest.raises(ValueError, match="temperature"):
        check_sampler_args({"temperature": -1.0})
