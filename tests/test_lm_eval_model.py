"""The lm-eval model type `sinklens` and the shipped offline GSM8K task (lm-eval is an optional extra)."""
import os
import sys
from types import SimpleNamespace

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is the optional extra sinklens[lm-eval]")

from sinklens.eval import gsm8k  # noqa: E402
from sinklens.eval.lm_eval_model import TASK_DIR, ModelArgsError, SinklensLM, main, write_task_yaml  # noqa: E402
from sinklens.masking.config import MaskingConfig  # noqa: E402

torch.set_num_threads(1)
# MaskingConfig's K field, whatever its name (model_args are read off the config's fields)
K_ARG = next(f.name for f in __import__("dataclasses").fields(MaskingConfig) if f.name in ("top_k", "mask_k"))
GSM8K = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "gsm8k", "test.jsonl"))


def test_shipped_yaml_is_generated_and_matches_lm_eval_exemplars(tmp_path):
    import yaml
    shipped = os.path.join(TASK_DIR, "sinklens_gsm8k_cot.yaml")
    assert open(write_task_yaml(str(tmp_path))).read() == open(shipped).read()
    # our 8 exemplars are lm-eval's own gsm8k-cot ones, word for word
    theirs = yaml.safe_load(open(os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "gsm8k", "gsm8k-cot.yaml")))
    assert [(s["question"], s["target"]) for s in theirs["fewshot_config"]["samples"]] == gsm8k.EXEMPLARS
    ours = yaml.safe_load(open(shipped))
    assert ours["generation_kwargs"]["until"] == theirs["generation_kwargs"]["until"]
    assert ours["filter_list"] == theirs["filter_list"] and ours["metric_list"] == theirs["metric_list"]


@pytest.mark.slow
def test_lm_eval_cli_offline_with_masking(tiny_dlm, tmp_path, monkeypatch):
    """`python -m sinklens.eval.lm_eval_model --model sinklens ...` = lm-eval's CLI, offline, local JSONL."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = write_task_yaml(str(tmp_path / "tasks"), GSM8K)
    monkeypatch.setattr(sys, "argv", [
        "lm_eval", "--model", "sinklens", "--model_args",
        f"pretrained={tiny_dlm},mask_{K_ARG.removeprefix('mask_')}=1,gen_length=8,block_length=4", "--device", "cpu",
        "--tasks", "sinklens_gsm8k_cot", "--include_path", os.path.dirname(tasks), "--limit", "2",
        "--num_fewshot", "1", "--output_path", str(tmp_path / "out"), "--log_samples"])
    main()
    import glob
    import json
    (res,) = glob.glob(str(tmp_path / "out" / "*" / "results_*.json"))
    r = json.load(open(res))["results"]["sinklens_gsm8k_cot"]
    assert r["exact_match,strict-match"] == 0.0 and r["exact_match,flexible-extract"] == 0.0
    (samples,) = glob.glob(str(tmp_path / "out" / "*" / "samples_*.jsonl"))
    docs = [json.loads(line) for line in open(samples)]
    assert {d["doc_id"] for d in docs} == {0, 1} and all("Q: There are 15 trees" in d["arguments"]["gen_args_0"]["arg_0"] for d in docs)


@pytest.mark.slow
def test_documented_commands_work_from_any_directory(tiny_dlm, tmp_path):
    """docs/evaluation.md: `sinklens lm-eval-task` then `sinklens-lm-eval`, run from a temporary
    directory (the shipped YAML's relative data path would not be found there)."""
    import glob
    import json
    import subprocess
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    work = tmp_path / "elsewhere"
    work.mkdir()
    run = lambda *a: subprocess.run([sys.executable, *a], cwd=work, env=env, capture_output=True, text=True,  # noqa: E731
                                    timeout=300)
    res = run("-m", "sinklens.cli", "lm-eval-task", "--data", os.path.relpath(GSM8K, work), "--out", "tasks")
    assert res.returncode == 0, res.stderr
    import yaml
    conf = yaml.safe_load(open(work / "tasks" / "sinklens_gsm8k_cot.yaml"))
    assert conf["dataset_kwargs"]["data_files"]["test"] == GSM8K            # absolute
    res = run("-m", "sinklens.eval.lm_eval_model", "--model", "sinklens", "--model_args",
              f"pretrained={tiny_dlm},gen_length=4,block_length=4", "--device", "cpu", "--tasks",
              "sinklens_gsm8k_cot", "--include_path", "tasks", "--limit", "1", "--num_fewshot", "0",
              "--output_path", "out")
    assert res.returncode == 0, res.stderr[-3000:]
    (out,) = glob.glob(str(work / "out" / "*" / "results_*.json"))
    assert "sinklens_gsm8k_cot" in json.load(open(out))["results"]


def test_entry_point_names_the_registered_model_type():
    """pyproject's lm_eval.models entry point resolves to the class lm-eval registers as `sinklens`."""
    import importlib
    import tomllib
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = tomllib.load(open(os.path.join(repo, "pyproject.toml"), "rb"))["project"]["entry-points"][
        "lm_eval.models"]["sinklens"]
    module, name = target.split(":")
    from lm_eval.api.registry import get_model
    assert getattr(importlib.import_module(module), name) is get_model("sinklens") is SinklensLM


def _documented(doc: str, marker: str) -> list[str]:
    """The command lines of the code block after `marker` in `doc`, continuation lines joined."""
    text = open(doc).read().split(marker, 1)[1].split("```", 2)[1]
    return [" ".join(line.split()) for line in text.replace("\\\n", " ").strip().splitlines()]


@pytest.mark.slow
def test_documented_lm_eval_example_runs_as_written(tmp_path):
    """docs/evaluation.md's lm-eval example, word for word (the data path pointed at a one-problem
    file), and `sinklens lm-eval-task --help` shows the same lines."""
    import subprocess
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lines = _documented(os.path.join(repo, "docs", "evaluation.md"), "<!-- lm-eval-example")
    assert [line.split()[0] for line in lines] == ["sinklens", "sinklens-lm-eval"]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    helptext = subprocess.run([sys.executable, "-m", "sinklens.cli", "lm-eval-task", "--help"], env=env,
                              capture_output=True, text=True).stdout
    assert all(line in " ".join(helptext.replace("\\\n", " ").split()) for line in lines)
    data = tmp_path / "one.jsonl"
    data.write_text(open(GSM8K).readline())
    entry = {"sinklens": [sys.executable, "-m", "sinklens.cli"],
             "sinklens-lm-eval": [sys.executable, "-m", "sinklens.eval.lm_eval_model"]}
    for line in lines:
        words = line.replace("/path/to/gsm8k/test.jsonl", str(data)).split()
        res = subprocess.run(entry[words[0]] + words[1:], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
    assert "sinklens_gsm8k_cot" in res.stdout and "exact_match" in res.stdout


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_one_line(tmp_path, monkeypatch, capsys):
    """The twin's context is 128 tokens, GSM8K's 8-shot prompt ~1900: one line naming the
    context, exit 2, before anything is generated."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = write_task_yaml(str(tmp_path / "tasks"), GSM8K)
    monkeypatch.setattr(sys, "argv", [
        "sinklens-lm-eval", "--model", "sinklens", "--model_args", "pretrained=tiny-dlm", "--device", "cpu",
        "--tasks", "sinklens_gsm8k_cot", "--include_path", os.path.dirname(tasks), "--limit", "1"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("sinklens-lm-eval: error: tiny-dlm: a request needs ") and \
        "the model's context of 128 tokens" in err[-1], err[-1]


def test_the_shipped_task_without_its_data_file_is_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """docs/evaluation.md's first lm-eval command (the shipped task, `--include_path
    sinklens/eval/lm_eval_tasks`) run where no gsm8k/test.jsonl is: one line saying which file the
    task reads and how to write a task for your copy, not a `datasets` traceback after the load."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", [
        "sinklens-lm-eval", "--model", "sinklens", "--model_args", "pretrained=tiny-dlm", "--device", "cpu",
        "--tasks", "sinklens_gsm8k_cot", "--include_path", TASK_DIR, "--limit", "1"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sinklens-lm-eval: error: task sinklens_gsm8k_cot"), err
    assert "'gsm8k/test.jsonl'" in err[0] and "sinklens lm-eval-task --data PATH" in err[0]
    (tmp_path / "gsm8k").mkdir()   # with the file where the task reads it, nothing is said
    (tmp_path / "gsm8k" / "test.jsonl").write_text(open(GSM8K).readline())
    from sinklens.eval.lm_eval_task import missing_data
    assert missing_data(sys.argv[1:]) is None


def test_masking_model_args_are_the_masking_config_fields(tiny_dlm):
    """Every MaskingConfig field is a model_arg (by name or mask_<name>), parsed and checked by the
    field; unset ones take the field's default; an unknown name is an error, not a silent no-op."""
    lm = SinklensLM(pretrained=tiny_dlm, device="cpu")
    assert lm.config == MaskingConfig(seed=0)                  # the config's own defaults
    lm = SinklensLM(pretrained=tiny_dlm, device="cpu", seed=3, mask_sinks="topk", mask_units="sum",
                    keep_self="true", mask_threshold="None", **{K_ARG: "2"})
    assert lm.config == MaskingConfig(sinks="topk", units="sum", keep_self=True, seed=3, **{K_ARG: 2})
    with pytest.raises(ModelArgsError, match="sinks must be one of"):
        SinklensLM(pretrained=tiny_dlm, device="cpu", mask_sinks="all")
    with pytest.raises(ModelArgsError, match=r"model_args \['mask_topk_typo'\] are not sinklens arguments"):
        SinklensLM(pretrained=tiny_dlm, device="cpu", mask_topk_typo="1")


def test_sampler_fields_are_model_args(tiny_dlm):
    lm = SinklensLM(pretrained=tiny_dlm, steps="8", block_length="4", gen_length="8", device="cpu")
    assert lm.sampler_args == {"steps": 8, "block_length": 4}
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        SinklensLM(pretrained=tiny_dlm, steps="0", device="cpu")


def test_loglikelihood_equals_transformers_and_drops_when_masked(smollm2):
    """K=0: exactly transformers' own log p(continuation | context); K=1: lower."""
    ctx, cont = "The capital of France is", " Paris."
    req = [SimpleNamespace(args=(ctx, cont))]
    from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy
    from lm_eval.api.model import CacheHook
    for k in (0, 1):
        lm = SinklensLM.__new__(SinklensLM)       # reuse the session's SmolLM2 instead of loading it again
        lm.m, lm.config, lm.pretrained = smollm2, MaskingConfig(mask_k=k), "smollm2"
        lm.policy = SinkMaskingPolicy(lm.config, num_layers=smollm2.num_layers, is_diffusion=False)
        lm.cache_hook = CacheHook(None)
        (ll, greedy), = lm.loglikelihood(req, disable_tqdm=True)
        if k == 0:
            ids = smollm2.tokenizer(ctx + cont)["input_ids"]
            n_ctx = len(smollm2.tokenizer(ctx)["input_ids"])
            smollm2.model.config._attn_implementation = "sdpa"
            try:
                logits = smollm2.model(torch.tensor([ids])).logits[0].float()
            finally:
                smollm2.model.config._attn_implementation = "sinklens"
            logp = torch.log_softmax(logits[n_ctx - 1:-1], -1).gather(-1, torch.tensor(ids[n_ctx:])[:, None]).sum()
            assert abs(ll - float(logp)) < 1e-3
            ll0 = ll
        else:
            assert ll < ll0
