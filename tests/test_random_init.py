"""The random-init control of any model (`load(..., random_init=SEED)`, `--random-init`) and the
corpus report drawn beside it (`sinklens report CORPUS --control CONTROL_CORPUS`).

What a user relies on: the control has the checkpoint's config, shapes, format and tokenizer and
none of its weights; the same seed gives the same weights, another seed others; the class's own
init drew them; nothing is fetched from a hub; traces and corpus files say it is a control; the
corpus report's figures, tables, page and summary carry the control's own numbers; a control of
another shape, or a trace given for a corpus, is refused in one line.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from sinklens.analysis.corpus import open_corpus
from sinklens.cli import main
from sinklens.eval.corpus import CorpusConfig, run_corpus
from sinklens.models import loader
from sinklens.models.loader import load
from sinklens.samplers.capture import CaptureOptions

DLM_FAST = {"steps": 2, "gen_length": 4, "block_length": 4}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Any hub access fails the test (the loader's only way to the hub is `_download`)."""
    def refuse(repo_id, revision):
        raise AssertionError(f"tried to download {repo_id}")
    monkeypatch.setattr(loader, "_download", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A local Llama folder (2 layers x 2 heads, tied embeddings) with tiny-arm's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    arm = loader.ASSETS / "tiny-arm"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(arm / name, folder / name)
    vocab = json.loads((arm / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=True, initializer_range=0.05, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():                      # "trained" weights: far from the class's init
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def _weights(m) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.model.state_dict().items()}


@pytest.mark.parametrize("name", ["tiny-dlm", "story9-dlmarm-4l", "tiny-llama"])
def test_control_keeps_config_shapes_and_tokenizer_and_redraws_every_weight(name, tiny_llama):
    src = str(tiny_llama) if name == "tiny-llama" else name
    trained = load(src, dtype="float32")
    state = torch.random.get_rng_state()
    ctrl = load(src, dtype="float32", random_init=3)
    assert torch.equal(torch.random.get_rng_state(), state), "random_init moved the global RNG"
    assert type(ctrl.model) is type(trained.model) and ctrl.family.name == trained.family.name
    assert ctrl.model.config.to_dict() == trained.model.config.to_dict()
    a, b = _weights(trained), _weights(ctrl)
    assert {k: (v.shape, v.dtype) for k, v in a.items()} == {k: (v.shape, v.dtype) for k, v in b.items()}
    std = ctrl.model.config.initializer_range
    for k, w in b.items():
        if w.ndim == 2:                        # linear and embedding weights: the class's normal(0, initializer_range)
            assert not torch.equal(w, a[k]), k
            assert abs(w.std().item() - std) < 0.2 * std, (k, w.std().item(), std)
        elif k.endswith("norm.weight"):        # norms: ones
            assert torch.equal(w, torch.ones_like(w)), k
    if ctrl.model.config.tie_word_embeddings:
        assert ctrl.model.lm_head.weight.data_ptr() == ctrl.model.get_input_embeddings().weight.data_ptr()
    text = "Tom has 3 apples."
    assert ctrl.tokenizer.encode(text) == trained.tokenizer.encode(text)
    assert ctrl.source["random_init"] == 3 and "random_init" not in trained.source


def test_control_is_deterministic_in_its_seed():
    one, again, other = (_weights(load("tiny-arm", random_init=s)) for s in (11, 11, 12))
    assert all(torch.equal(one[k], again[k]) for k in one)
    assert sum(not torch.equal(one[k], other[k]) for k in one if one[k].ndim == 2) == sum(
        one[k].ndim == 2 for k in one)


def test_random_init_is_refused_with_device_map_and_a_negative_seed(capsys):
    with pytest.raises(ValueError, match=r"random_init must be in \[0, "):
        load("tiny-arm", random_init=-1)
    with pytest.raises(ValueError, match="does not go with device_map"):
        load("tiny-arm", random_init=1, device_map="auto")
    with pytest.raises(SystemExit) as e:
        main(["trace", "--model", "tiny-arm", "--prompt", "hi", "--random-init", "-2", "--out", "x.arrow"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--random-init" in err[0] and "must be in [0, " in err[0], err


def test_trace_records_the_control(tmp_path):
    from sinklens.trace.reader import open_trace

    out = tmp_path / "c.arrow"
    assert main(["trace", "--model", "tiny-dlm", "--prompt", "Tom has 3 apples.", "--random-init", "5", "--steps", "2",
                 "--gen-length", "4", "--block-length", "4", "--out", str(out), "-q"]) == 0
    meta = open_trace(str(out)).meta
    assert meta["model"]["random_init"] == 5 and meta["model"]["name_or_path"] == "tiny-dlm"


# ---------------------------------------------------------------------------------------------
# The corpus report against its control

READOUTS = CaptureOptions(value_norms=True, diagonal=True, distance=True, hidden_norms=True)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, tiny_llama) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("corpora")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tom has {i} apples and gets {i + 2} more."}) + "\n"
                               for i in range(3)))
    out = {}
    for key, model, load_args, fast in (("trained", "tiny-dlm", {}, DLM_FAST),
                                        ("control", "tiny-dlm", {"random_init": 7}, DLM_FAST),
                                        ("other", str(tiny_llama), {"random_init": 7}, {"max_new_tokens": 2})):
        out[key] = Path(run_corpus(CorpusConfig(model=model, prompts=str(prompts), out=str(root / key),
                                                sampler_args=fast, capture=READOUTS, load_args=load_args)))
    return out


def test_corpus_header_records_the_control_and_a_resume_cannot_mix_them(corpora, tmp_path):
    assert open_corpus(corpora["control"]).meta["random_init"] == 7
    assert open_corpus(corpora["trained"]).meta["random_init"] is None
    run = corpora["trained"].parent            # resuming the trained run's folder as a control is refused
    with pytest.raises(ValueError, match="random_init"):
        run_corpus(CorpusConfig(model="tiny-dlm", prompts=str(run.parent / "p.jsonl"), out=str(run),
                                sampler_args=DLM_FAST, capture=READOUTS, load_args={"random_init": 7}))


@pytest.mark.slow
def test_corpus_report_draws_the_control_beside_the_corpus(corpora, tmp_path):
    from sinklens.report.readouts import CORPUS_FIGURES, value_norm_ratio

    out = tmp_path / "rep"
    assert main(["report", str(corpora["trained"]), "--control", str(corpora["control"]), "--out", str(out), "-q"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    ctrl = open_corpus(corpora["control"])
    mine = ctrl.to_dict()["views"]["scaled_sum"]
    assert summary["control"]["label"] == "tiny-dlm (random init, seed 7)"
    assert summary["control"]["views"]["scaled_sum"] == json.loads(json.dumps(mine))
    trained = summary["views"]["scaled_sum"]["fraction_heads_steps_with_sink"]
    assert trained != mine["fraction_heads_steps_with_sink"]        # else the test below could not tell them apart
    md = (out / "summary.md").read_text()
    sink_row = next(line for line in md.splitlines() if line.startswith("| (prompt, step, layer, head) with a sink"))
    assert sink_row.rstrip(" |").endswith(f"{100 * mine['fraction_heads_steps_with_sink']:.3g} %"), sink_row  # control beside
    assert "sink_vectors: tiny-dlm (random init, seed 7)" in md          # the control's table beside the corpus''
    rates = np.nanmean(np.asarray(mine["layer_head"]["sink_rate"], float), axis=1)
    row0 = next(line for line in md.splitlines() if line.startswith("| 0 | "))
    assert row0.split(" | ")[2] == f"{rates[0]:.4g}".replace("nan", "—")
    page = (out / "index.html").read_text()
    for name in ("fig05_layer_head", "readout_value_norms", "readout_massive", "readout_diagonal_heads",
                 "readout_distance"):
        assert f"alt='{name}'" in page and (out / f"{name}.png").stat().st_size > 1000, name
    # the drawn curves are the control's own numbers, dashed beside the corpus'
    t, c = open_corpus(corpora["trained"]).totals["scaled_sum"], ctrl.totals["scaled_sum"]
    _, draw = CORPUS_FIGURES["sink_vectors"]
    fig = draw([("trained", t["sink_vectors"]), ("control", c["sink_vectors"])], "scaled_sum")
    lines = {ln.get_label(): ln for ln in fig.axes[1].get_lines() if not ln.get_label().startswith("_")}
    np.testing.assert_allclose(lines["control"].get_ydata(), value_norm_ratio(c["sink_vectors"]))
    np.testing.assert_allclose(lines["trained"].get_ydata(), value_norm_ratio(t["sink_vectors"]))
    assert lines["control"].get_linestyle() == "--" and lines["trained"].get_linestyle() == "-"


def test_control_of_another_shape_or_kind_is_refused_in_one_line(corpora, tmp_path, capsys):
    trace = tmp_path / "t.arrow"
    assert main(["trace", "--model", "tiny-dlm", "--prompt", "hi", "--steps", "2", "--gen-length", "4",
                 "--block-length", "4", "--out", str(trace), "-q"]) == 0
    capsys.readouterr()
    cases = [([str(corpora["trained"]), "--control", str(corpora["other"])], "2 layers x 2 heads"),
             ([str(corpora["trained"]), "--control", str(trace)], "is not a corpus file"),
             ([str(trace), "--control", str(corpora["control"])], "is a corpus file"),
             ([str(corpora["trained"]), "--control", str(tmp_path / "missing.jsonl")], "no such file")]
    for argv, expected in cases:
        assert main(["report", *argv, "--out", str(tmp_path / "r")]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0] and "--control" in err[0], err


@pytest.mark.slow
def test_eval_of_the_control_goes_to_its_own_folder_and_row(tmp_path):
    """`sinklens eval --random-init SEED`: the control's results never land in (or resume) the
    trained model's folder, and the summary names it."""
    out = tmp_path / "ev"
    for extra in ([], ["--random-init", "3"]):
        assert main(["eval", "--model", "tiny-dlm", "--task", "arith", "--limit", "2", "--no-loglik", "--out", str(out),
                     "-q", *extra]) == 0
    trained, control = (json.loads((out / name / "arith" / "k0" / "config.json").read_text())
                        for name in ("tiny-dlm", "tiny-dlm-random-init-3"))
    assert control["model"] == "tiny-dlm (random init, seed 3)" and control["source"]["random_init"] == "3"
    assert trained["model"] == "tiny-dlm" and "random_init" not in trained["source"]
    rows = list((out / name / "arith" / "k0" / "samples.jsonl").read_text().splitlines()
                for name in ("tiny-dlm", "tiny-dlm-random-init-3"))
    assert [json.loads(x)["raw_output"] for x in rows[0]] != [json.loads(x)["raw_output"] for x in rows[1]]
