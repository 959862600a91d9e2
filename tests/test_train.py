"""Tests of sinklens.train: data split, tokenizer folder, LLaDA-format export, decoder, resume.

References nobody here wrote: Python's own arithmetic for the worked solutions, transformers'
AutoTokenizer for the tokenizer folder, and the official LLaDA fixtures (parameter names and
shapes, fp32 logits, low-confidence `generate()` outputs) for the model format and decoder.
"""
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from sinklens.train.batch import encode_batch, parse_answer
from sinklens.train.data import DataConfig, ProblemStream, generate
from sinklens.train.decode import dlm_generate
from sinklens.train.model import ModelConfig, build_model, llada_name, save_llada_folder
from sinklens.train.tokenizer import ASSISTANT, USER, save_tokenizer, train_tokenizer

FIX = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "reference" / "llada"
if not FIX.exists():
    FIX = Path("/work/shared/fixtures/reference/llada")


def _fixture_model():
    """The official fixture weights loaded into our Llama twin through the inverse name map."""
    conf = json.loads((FIX / "config.json").read_text())
    cfg = ModelConfig(n_layers=conf["n_layers"], d_model=conf["d_model"], n_heads=conf["n_heads"],
                      mlp_hidden=conf["mlp_hidden_size"], vocab_size=conf["vocab_size"])
    model = build_model(cfg, diffusion=True, seed=0).eval()
    official = load_file(str(FIX / "model.safetensors"))
    model.load_state_dict({k: official[llada_name(k)] for k in model.state_dict()})
    return cfg, model


# ---------------------------------------------------------------- data

def test_solutions_are_correct_arithmetic():
    for p in generate(300, seed=1, split="train"):
        steps = re.findall(r"(\d+)([+-])(\d+)=(\d+)\.", p.solution)
        assert steps, p.solution
        value = int(steps[0][0])
        for a, op, b, c in steps:
            assert int(a) == value
            value = eval(f"{a}{op}{b}")          # Python's arithmetic, not ours
            assert value == int(c) and 0 <= value <= 99
        assert parse_answer(p.solution) == p.answer == value
        assert str(steps[0][0]) in p.question


def test_heldout_combinations_never_in_train():
    held = {p.key for p in generate(500, seed=0, split="heldout")}
    train = {p.key for i in range(30) for p in ProblemStream(0).batch(i, 200)}
    assert held and not held & train
    assert generate(20, seed=3, split="heldout") == generate(20, seed=3, split="heldout")


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="ops"):
        DataConfig(ops="*")
    with pytest.raises(ValueError, match="split"):
        generate(3, 0, "test")


# ---------------------------------------------------------------- tokenizer

def test_tokenizer_folder_loads_in_transformers(tmp_path):
    save_tokenizer(train_tokenizer(200, n_texts=500), tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))   # no remote code, plain folder
    p = generate(1, seed=0, split="heldout")[0]
    ids = tok.encode(p.solution, add_special_tokens=False)
    assert tok.decode(ids) == p.solution
    assert all(len(tok.convert_ids_to_tokens(i).strip("▁")) <= 1 for i in ids
               if tok.convert_ids_to_tokens(i).strip("▁").isdigit())      # digits one by one
    text = tok.apply_chat_template([{"role": "user", "content": "Hi there."}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == f"{USER}Hi there.{ASSISTANT}"
    assert (tok.pad_token_id, tok.eos_token_id, tok.mask_token_id) == (0, 1, 2)


# ---------------------------------------------------------------- LLaDA format

def test_llada_export_matches_official_names_shapes_and_config(tmp_path):
    conf = json.loads((FIX / "config.json").read_text())
    cases = json.loads((FIX / "cases.json").read_text())
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, mlp_hidden=128, vocab_size=320)
    model = build_model(cfg, diffusion=True, seed=0)
    save_llada_folder(model, cfg, tmp_path, mask_id=300, eos_id=299, pad_id=299, dtype=torch.float32)
    ours = json.loads((tmp_path / "config.json").read_text())
    assert set(ours) == set(conf)
    for k in ("model_type", "d_model", "n_layers", "n_heads", "mlp_hidden_size", "rope_theta",
              "rms_norm_eps", "block_type", "activation_type", "weight_tying", "mask_token_id"):
        assert ours[k] == conf[k], k
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert {k: list(v.shape) for k, v in sd.items()} == cases["parameter_shapes"]


def test_name_mapping_reproduces_official_logits():
    _, model = _fixture_model()
    ref = load_file(str(FIX / "logits.safetensors"))
    with torch.no_grad():
        got = model(input_ids=ref["forward_nopad.input_ids"]).logits
    torch.testing.assert_close(got, ref["forward_nopad.logits"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ["generate_full_block", "generate_semi_ar"])
def test_dlm_decoder_matches_official_generate(case):
    """Our training-time decoder = official low-confidence generate() at temperature 0, steps = gen_length."""
    _, model = _fixture_model()
    c = next(c for c in json.loads((FIX / "cases.json").read_text())["cases"] if c["name"] == case)
    a = c["arguments"]
    assert a["steps"] == a["gen_length"] and a["remasking"] == "low_confidence" and a["temperature"] == 0
    ids = torch.tensor(c["input_ids"])
    out = dlm_generate(model, ids, torch.ones_like(ids), gen_length=a["gen_length"], mask_id=300,
                       block_length=a["block_length"])
    assert out.tolist() == [row[ids.shape[1]:] for row in c["expected_output_ids"]]


# ---------------------------------------------------------------- training

def _tiny_cfg(tmp_path, kind, steps):
    from sinklens.train.train import TrainConfig
    return TrainConfig(kind=kind, out=str(tmp_path / kind), steps=steps, batch_size=4, warmup=2,
                       log_every=2, eval_every=100, eval_n=4, ckpt_every=2, vocab_size=120,
                       model=ModelConfig(n_layers=1, d_model=32, n_heads=2, mlp_hidden=64),
                       data=DataConfig(max_ops=1))


@pytest.mark.parametrize("kind", ["dlm", "arm"])
def test_resume_is_bit_identical(tmp_path, kind):
    from sinklens.train.train import train
    straight = _tiny_cfg(tmp_path / "a", kind, 4)
    train(straight, progress=False)
    half = _tiny_cfg(tmp_path / "b", kind, 2)
    train(half, progress=False)
    from dataclasses import replace
    train(replace(half, steps=4), progress=False)          # resumes from step 2
    wa = load_file(f"{straight.out}/ckpt/model.safetensors")
    wb = load_file(f"{half.out}/ckpt/model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    log = [json.loads(l) for l in Path(straight.out, "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [2, 4]
    assert Path(straight.out, "curves.png").stat().st_size > 0


def test_answer_only_masking(tmp_path):
    """The DLM loss never masks the prompt, and the ARM sees the same tokens."""
    from sinklens.train.train import dlm_loss
    tok_dir = tmp_path / "tok"
    save_tokenizer(train_tokenizer(120, n_texts=200), tok_dir)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    b = encode_batch(tok, generate(8, 0, "train"), 24)
    model = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2, mlp_hidden=64, vocab_size=len(tok)),
                        diffusion=True, seed=0)
    seen = {}
    model.register_forward_pre_hook(lambda m, a, kw: seen.update(x=kw["input_ids"]), with_kwargs=True)
    dlm_loss(model, b.input_ids, b.attention_mask, b.prompt_len, tok.mask_token_id, torch.Generator().manual_seed(0))
    x = seen["x"]
    assert torch.equal(x[:, :b.prompt_len], b.input_ids[:, :b.prompt_len])
    assert (x[:, b.prompt_len:] == tok.mask_token_id).any()
