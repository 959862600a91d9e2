"""`sinklens train`'s flags are the `param` fields of TrainConfig, ModelConfig and DataConfig: a
new field is a new flag, a field without `param` metadata fails here unless it is listed as set
by the trainer, and the parsed flags build exactly the config the library would."""
from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from sinklens.cli import build_parser, main
from sinklens.cli.train import config
from sinklens.params import flag_name
from sinklens.train.config import ModelConfig, TrainConfig
from sinklens.train.data import DataConfig

# Fields that are not flags, on purpose: the nested configs (their own fields are flags) and the
# model's vocabulary size (the trainer sets it from the tokenizer, asked for by --vocab-size).
NOT_FLAGS = {(TrainConfig, "model"), (TrainConfig, "data"), (ModelConfig, "vocab_size")}


def _train_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def test_every_config_field_is_a_flag():
    flags = {o: a for a in _train_parser()._actions for o in a.option_strings}
    for cls in (TrainConfig, ModelConfig, DataConfig):
        for f in fields(cls):
            if (cls, f.name) in NOT_FLAGS:
                continue
            assert "type" in f.metadata, f"{cls.__name__}.{f.name} is not declared with param(...): no flag"
            flag = flag_name(f.name, f.metadata)
            assert flag in flags, f"{cls.__name__}.{f.name} has no flag {flag}"
            assert flags[flag].help.startswith(f.metadata["help"].replace("%", "%%")), flag
    assert not [(c, n) for c, n in NOT_FLAGS if "type" in next(f for f in fields(c) if f.name == n).metadata]


def test_flags_build_the_library_config(tmp_path):
    argv = ["--kind", "arm", "--out", str(tmp_path / "r"), "--steps", "7", "--lr", "0.01", "--n-layers", "2",
            "--d-model", "32", "--n-heads", "2", "--style", "story", "--max-ops", "3", "--min-ops", "2"]
    got = config(_train_parser().parse_args(argv))
    want = TrainConfig(kind="arm", out=str(tmp_path / "r"), steps=7, lr=0.01,
                       model=ModelConfig(n_layers=2, d_model=32, n_heads=2),
                       data=DataConfig(style="story", max_ops=3, min_ops=2))
    assert got == want
    defaults = config(_train_parser().parse_args(["--kind", "dlm", "--out", "x"]))
    assert defaults == TrainConfig(kind="dlm", out="x")


@pytest.mark.parametrize("argv, message", [
    (["--out", "x"], "--kind"),                                 # required on the command line
    (["--kind", "dlm"], "--out"),
    (["--kind", "dlm", "--out", "x", "--steps", "0"], "--steps: must be a positive integer, got 0"),
    (["--kind", "gpt", "--out", "x"], "--kind: must be one of"),
    (["--kind", "dlm", "--out", "x", "--heldout-fraction", "1"], "--heldout-fraction: must be in (0, 1)"),
    (["--kind", "dlm", "--out", "x", "--style", "poem"], "--style: must be one of ['short', 'story']"),
])
def test_bad_flags_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train"] + argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1], err


def test_init_from_a_shipped_twin_by_name():
    """A training config records the teacher by its shipped name, never by a machine's path."""
    assert TrainConfig(kind="dlm-shift", init_from="story9-arm-4l").init_from == "story9-arm-4l"
    with pytest.raises(ValueError, match="init_from"):
        TrainConfig(kind="dlm-shift", init_from="no-such-twin")


def test_ctrl_c_says_which_checkpoint_is_kept_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    """Ctrl-C in `sinklens train` (here: at the start of step 4, checkpoints every 2 steps): exit 130
    and one line naming the kept checkpoint's step; the same command then goes on from it."""
    import sinklens.train.train as tr

    argv = ["train", "--kind", "arm", "--out", str(tmp_path / "run"), "--steps", "6", "--ckpt-every", "2",
            "--eval-every", "100", "--eval-n", "2", "--batch-size", "4", "--n-layers", "1", "--d-model", "32",
            "--n-heads", "2", "--mlp-hidden", "32", "-q"]
    original = tr.lr_at

    def lr_at(step, cfg):
        if step == 3:                      # 0-based: the 4th step, after the checkpoint of step 2
            raise KeyboardInterrupt
        return original(step, cfg)

    monkeypatch.setattr(tr, "lr_at", lr_at)
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sinklens train: interrupted; the checkpoint of step 2 is in ") and \
        "the same command resumes from it" in err[-1], err
    monkeypatch.setattr(tr, "lr_at", original)
    assert main(argv) == 0
    assert "done: 6 steps" in capsys.readouterr().out


@pytest.mark.slow
def test_a_second_training_on_the_same_out_is_refused(tmp_path, capsys):
    """Two `sinklens train` on one --out would overwrite each other's checkpoint and log: while a
    process holds the folder, a second is refused in one line (exit 2) and writes nothing there;
    once the first is gone, the same command runs."""
    from sinklens.runlock import RunLock

    out = tmp_path / "run"
    argv = ["train", "--kind", "arm", "--out", str(out), "--steps", "2", "--ckpt-every", "2", "--eval-every", "100",
            "--eval-n", "2", "--batch-size", "4", "--n-layers", "1", "--d-model", "32", "--n-heads", "2",
            "--mlp-hidden", "32", "-q"]
    with RunLock(str(out), who="sinklens train"):      # the first training, as another process holds it
        assert main(argv) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sinklens ")]
        assert len(err) == 1 and "another sinklens train is already writing" in err[0], err
        assert sorted(p.name for p in out.iterdir()) == ["lock.rank0"]
    assert main(argv) == 0
    assert "done: 2 steps" in capsys.readouterr().out
