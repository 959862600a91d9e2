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
from sinklens.train.data import SPLITS, DataConfig, ProblemStream, generate, heldout_templates
from sinklens.train.wordings import MALE, FEMALE, TEMPLATES
from sinklens.train.decode import dlm_generate
from sinklens.train.model import ModelConfig, build_model, llada_name, save_llada_folder
from sinklens.train.config import TrainConfig
from sinklens.train.tokenizer import ASSISTANT, USER, save_tokenizer, train_tokenizer

FIX = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "reference" / "llada"   # ../shared beside the repo


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

@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("max_ops", [1, 2])
def test_solutions_are_correct_arithmetic(split, max_ops):
    for p in generate(300, seed=1, split=split, cfg=DataConfig(max_ops=max_ops)):
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


def _pattern(template) -> re.Pattern:
    """A template's text with its slots as wildcards: which problems it could have written."""
    text = re.escape(" ".join(x for x in (template.body, template.question) if x))
    for slot, what in [("name", "[A-Z][a-z]+"), ("friend", "[A-Z][a-z]+"), ("a", r"\d+"), ("b", r"\d+"),
                       ("obj", "[a-z]+"), ("box", "the [a-z]+"), ("P", "(He|She)"), ("p", "(he|she)"),
                       ("pos", "(his|her)"), ("them", "(him|her)")]:
        text = text.replace(re.escape("{" + slot + "}"), what)
    return re.compile(text)


def test_heldout_wordings_never_in_train():
    """Whole templates are held out: >= 20 wordings per operation, a few reserved; no training
    problem could have been written by a reserved one, and every held-out-wording problem was
    (with a held-out number combination as well)."""
    cfg = DataConfig(max_ops=1)
    train = [p for i in range(10) for p in ProblemStream(0, cfg).batch(i, 100)]
    held = generate(300, seed=0, split="heldout-wording", cfg=cfg)
    numbers = {p.key for p in generate(300, seed=0, split="heldout", cfg=cfg)}
    for op in "+-":
        assert len(TEMPLATES[op]) - cfg.heldout_templates >= 20
        reserved = [_pattern(TEMPLATES[op][i]) for i in heldout_templates(op, cfg)]
        assert len(reserved) == cfg.heldout_templates
        assert not [p.question for p in train if any(r.fullmatch(p.question) for r in reserved)]
        assert all(any(r.fullmatch(p.question) for r in reserved) for p in held if op in p.key)
    assert {p.key.count("+") for p in held} == {0, 1}            # both operations held out
    assert not {p.key for p in held} & {p.key for p in train}     # the numbers are new too
    assert not numbers & {p.key for p in train}
    names = set(MALE + FEMALE)
    assert all(any(n in p.question for n in names) or "shop" in p.question for p in train)
    with pytest.raises(ValueError, match="heldout-wording"):
        generate(1, 0, "heldout-wording", DataConfig(style="story"))


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="ops"):
        DataConfig(ops="*")
    with pytest.raises(ValueError, match="heldout_templates"):
        DataConfig(heldout_templates=len(TEMPLATES["+"]))
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


def test_vocabulary_note_only_for_prompts_far_outside_a_twins_words(tmp_path):
    """Every word of every problem is known; a prompt with more than a few other words gets one
    line of example prompts, a problem in a new wording of known words none."""
    from sinklens.train.tokenizer import UNFAMILIAR_LIMIT, unfamiliar_words, vocabulary_note
    from sinklens.train.wordings import EXAMPLES
    for split in SPLITS:
        assert all(unfamiliar_words(p.question + p.solution) == [] for p in generate(100, 0, split))
    far = "Please write a haiku about quantum chromodynamics and entropy"
    assert len(unfamiliar_words(far)) > UNFAMILIAR_LIMIT
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "train_config.json").write_text(json.dumps({"data": {"style": "short"}}))
    note = vocabulary_note(tmp_path, far)
    assert note and "\n" not in note and all(e in note for e in EXAMPLES)
    assert vocabulary_note(tmp_path, "Mia has 23 pens. She finds 15 more. How many pens now?") is None
    assert vocabulary_note(tmp_path / "training", far) is None        # not a twin's folder: no note


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


def test_arm_export_names_its_end_and_pad_ids_for_transformers_generate(tmp_path):
    """The ARM folder's generation_config.json names the export's EOS / pad (transformers' generate
    reads them there; it had kept the ids of the config the model was built with: EOS 2, BOS 1)."""
    from transformers import AutoModelForCausalLM

    from sinklens.train.model import save_llama_folder

    model = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2, mlp_hidden=64, vocab_size=40), diffusion=False, seed=0)
    save_llama_folder(model, tmp_path, eos_id=7, pad_id=5, dtype=torch.float32)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert (gen.get("eos_token_id"), gen.get("pad_token_id"), gen.get("bos_token_id")) == (7, 5, None)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert (loaded.generation_config.eos_token_id, loaded.generation_config.pad_token_id) == (7, 5)


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

def _tiny_cfg(tmp_path, kind, steps, **kw):
    from sinklens.train.train import TrainConfig
    return TrainConfig(kind=kind, out=str(tmp_path / kind), steps=steps, batch_size=4, warmup=2,
                       log_every=2, eval_every=100, eval_n=4, ckpt_every=2, vocab_size=120,
                       model=ModelConfig(n_layers=1, d_model=32, n_heads=2, mlp_hidden=64),
                       data=DataConfig(max_ops=1), **kw)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dlm", "arm", "dlm-shift"])
def test_resume_is_bit_identical(tmp_path, kind):
    from dataclasses import replace
    from sinklens.train.train import train
    init = ""
    if kind == "dlm-shift":                                 # Dream's recipe starts from an ARM run
        arm = _tiny_cfg(tmp_path / "arm", "arm", 2)
        train(arm, progress=False)
        init = arm.out
    straight = replace(_tiny_cfg(tmp_path / "a", kind, 4), init_from=init)
    train(straight, progress=False)
    half = replace(_tiny_cfg(tmp_path / "b", kind, 2), init_from=init)
    train(half, progress=False)
    train(replace(half, steps=4), progress=False)          # resumes from step 2
    wa = load_file(f"{straight.out}/ckpt/model.safetensors")
    wb = load_file(f"{half.out}/ckpt/model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    log = [json.loads(l) for l in Path(straight.out, "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [2, 4]
    assert Path(straight.out, "curves.png").stat().st_size > 0


def _masking_setup(tmp_path, n: int):
    """A tokenizer, a batch of n problems (answer region 24), a one-layer DLM, and `seen`, which
    receives the input_ids of the model's last forward (what the loss masked)."""
    tok_dir = tmp_path / "tok"
    save_tokenizer(train_tokenizer(120, n_texts=200), tok_dir)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    b = encode_batch(tok, generate(n, 0, "train"), 24)
    model = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2, mlp_hidden=64, vocab_size=len(tok)),
                        diffusion=True, seed=0)
    seen = {}
    model.register_forward_pre_hook(lambda m, a, kw: seen.update(x=kw["input_ids"]), with_kwargs=True)
    return tok, b, model, seen


def test_answer_only_masking(tmp_path):
    """The DLM loss never masks the prompt, and the ARM sees the same tokens."""
    from sinklens.train.train import dlm_loss
    tok, b, model, seen = _masking_setup(tmp_path, 8)
    dlm_loss(model, b.input_ids, b.attention_mask, b.prompt_len, tok.mask_token_id, torch.Generator().manual_seed(0))
    x = seen["x"]
    assert torch.equal(x[:, :b.prompt_len], b.input_ids[:, :b.prompt_len])
    assert (x[:, b.prompt_len:] == tok.mask_token_id).any()


def test_block_masking_is_what_block_decoding_sees(tmp_path):
    """--mask-block 8: per row one block partly masked (the loss only there), the blocks before it
    clean, every block after it masked; the prompt never. --mask-block 0 keeps LLaDA's masking over
    the whole answer, draw for draw (a resumed or re-run twin's training is unchanged)."""
    from sinklens.train.train import dlm_loss
    tok, b, model, seen = _masking_setup(tmp_path, 16)
    P, mask = b.prompt_len, tok.mask_token_id
    _, masked, _, t = dlm_loss(model, b.input_ids, b.attention_mask, P, mask, torch.Generator().manual_seed(0), block=8)
    x = seen["x"][:, P:]
    assert torch.equal(seen["x"][:, :P], b.input_ids[:, :P])
    for row in range(x.shape[0]):
        blocks = {int(i) // 8 for i in masked[row].nonzero()}
        assert len(blocks) == 1, blocks                             # the loss lives in one block
        (blk,) = blocks
        assert (x[row, (blk + 1) * 8:] == mask).all()              # later blocks: all masked
        assert torch.equal(x[row, :blk * 8], b.input_ids[row, P:P + blk * 8])   # earlier: clean
        assert torch.equal(x[row, blk * 8:(blk + 1) * 8] == mask, masked[row, blk * 8:(blk + 1) * 8])
        assert t[row] == masked[row].sum() / 8
    # block 0: the masks of the whole-answer recipe, written out as it was before --mask-block
    gen = torch.Generator().manual_seed(3)
    _, masked0, _, _ = dlm_loss(model, b.input_ids, b.attention_mask, P, mask, gen)
    ref = torch.Generator().manual_seed(3)
    B, G = masked0.shape
    u = (torch.rand(1, generator=ref) + torch.arange(B)) / B
    u = u[torch.randperm(B, generator=ref)]
    k = (u * G).ceil().long().clamp(1, G)
    assert torch.equal(masked0, torch.rand((B, G), generator=ref).argsort(1).argsort(1) < k[:, None])
    with pytest.raises(ValueError, match="--mask-block"):
        TrainConfig(kind="arm", mask_block=32)


# ---------------------------------------------------------------- the paper's regime (story problems)

STORY = DataConfig(style="story", min_ops=2, max_ops=3, max_operand=30)


def test_story_problems_are_long_and_correct():
    """Prompts >= 48 tokens and answers >= 128 tokens (the controlled study's regime), every worked step is
    Python's arithmetic, each step is checked back, and the split stays by combination."""
    from sinklens.train.batch import prompt_ids
    tok = train_tokenizer(320, STORY, n_texts=1000)
    problems = generate(300, seed=2, split="train", cfg=STORY)
    for p in problems:
        assert len(prompt_ids(tok, p.question)) >= 48, p.question
        assert len(tok.encode(p.solution, add_special_tokens=False)) >= 128, p.solution
        steps = re.findall(r"(\d+) ([+-]) (\d+) = (\d+)\. Now", p.solution)
        checks = re.findall(r"check it: (\d+) ([+-]) (\d+) = (\d+),", p.solution)
        assert 2 <= len(steps) == len(checks) <= 3 and len(steps) == p.key.count("+") + p.key.count("-")
        value = int(steps[0][0])
        assert f"there are {value} " in p.question
        for (a, op, b, c), (ca, cop, cb, cc) in zip(steps, checks):
            assert int(a) == value
            value = eval(f"{a}{op}{b}")
            assert value == int(c) == int(ca) and eval(f"{ca}{cop}{cb}") == int(cc) == int(a)
        assert parse_answer(p.solution) == p.answer == value == eval(p.key)
    held = {p.key for p in generate(300, seed=0, split="heldout", cfg=STORY)}
    assert held and not held & {p.key for p in problems}


def test_equations_right_scores_each_written_step_by_python():
    """The study's graded score: every worked solution scores all its equations right; a wrong
    result, a wrong check and a garbled step are each counted as written and wrong."""
    from sinklens.train.story import equations_right
    for p in generate(50, seed=3, split="train", cfg=STORY):
        right, written = equations_right(p.solution)
        assert right == written == 2 * (p.key.count("+") + p.key.count("-"))
    text = "so we add: 23 + 15 = 38. We check it: 38 - 15 = 24, so we subtract: 38 - 9 = 27. 3 + = 4"
    assert equations_right(text) == (1, 3)
    assert equations_right("") == (0, 0)


@pytest.mark.slow
def test_dlm_shift_starts_from_the_arm_and_exports_a_dream_folder(tmp_path):
    """Dream's recipe: a DLM initialised from a trained ARM run (same weights at step 0), trained
    with the shifted loss, exported in Dream's format; sinklens.load reads it as the Dream family
    and its logits equal the trained Llama's (Qwen2 with zero q/k/v biases is the same function)."""
    import sinklens
    from dataclasses import replace
    from sinklens.train.train import TrainConfig, dlm_loss, train
    arm = _tiny_cfg(tmp_path, "arm", 2)
    train(arm, progress=False)
    shift = replace(_tiny_cfg(tmp_path, "dlm-shift", 2), init_from=arm.out)
    with pytest.raises(ValueError, match="init_from"):
        replace(shift, init_from=str(tmp_path / "nowhere"))
    res = train(replace(shift, steps=2, stop_after=0), progress=False)
    assert res["finished"]
    m = sinklens.load(f"{shift.out}/export", dtype="float32")
    assert m.family.name == "dream" and m.is_diffusion
    tok = AutoTokenizer.from_pretrained(f"{shift.out}/export")
    text = "Tom has 3 pens. He gets 2 more."   # the loaded twin reads text with its own tokenizer
    assert m.tokenizer(text)["input_ids"] == tok(text)["input_ids"]
    assert m.tokenizer.decode(tok(text)["input_ids"]) == text
    ours = build_model(replace(arm.model, vocab_size=len(tok)), diffusion=True, seed=0).eval()
    w = load_file(f"{shift.out}/ckpt/model.safetensors")
    ours.load_state_dict(w)
    ids = torch.tensor([tok.encode("Tom has 3 pens. He gets 2 more.")])
    ref = ours.half().float()(input_ids=ids).logits            # the export is float16
    got = m.model(input_ids=ids).logits
    assert torch.allclose(got, ref, atol=1e-3), (got - ref).abs().max()
    # the shifted loss reads position i - 1 for token i; at step 0 the weights are the ARM's
    fresh = replace(_tiny_cfg(tmp_path / "f", "dlm-shift", 1), init_from=arm.out, stop_after=0)
    a = load_file(f"{arm.out}/ckpt/model.safetensors")
    model0 = build_model(replace(arm.model, vocab_size=len(tok)), diffusion=True, seed=fresh.seed)
    model0.load_state_dict(a)
    assert TrainConfig(kind="dlm-shift").shift and not TrainConfig(kind="dlm").shift
    b = encode_batch(tok, generate(4, 0, "train", DataConfig(max_ops=1)), 24)
    seen = {}
    model0.register_forward_hook(lambda mod, args, kw, out: seen.update(logits=out.logits), with_kwargs=True)
    loss, masked, correct, t = dlm_loss(model0, b.input_ids, b.attention_mask, b.prompt_len,
                                        tok.mask_token_id, torch.Generator().manual_seed(0), shift=True)
    P = b.prompt_len
    assert torch.equal(correct, seen["logits"][:, P - 1:-1].argmax(-1) == b.input_ids[:, P:])


def test_arith_task_reads_a_twins_data_config(tmp_path):
    """`sinklens eval --task arith --data <run>/config.json` scores the held-out problems of that
    twin's data settings; anything else is one clear error."""
    from dataclasses import asdict
    from sinklens.eval import arith as task
    (tmp_path / "config.json").write_text(json.dumps({"kind": "arm", "data": asdict(STORY)}))
    items, errors = task.load(str(tmp_path), limit=5)
    assert errors == [] and len(items) == 5
    assert [i["question"] for i in items] == [p.question for p in generate(5, task.SEED, "heldout", STORY)]
    assert all("keeps some" in i["question"] and i["answer"].endswith(f"#### {i['reference']}") for i in items)
    with pytest.raises(ValueError, match="training config"):
        task.load(str(tmp_path / "missing.json"))
    # a shipped / exported twin's folder: its config.json is the model's, the data sit in
    # training/train_config.json (read before: "--data must be ... '<folder>': 'data'")
    from sinklens.eval.config import EvalConfig

    shipped = task.ASSETS / "story9-arm-4l"
    want = json.loads((shipped / "training" / "train_config.json").read_text())["data"]
    assert task.data_config(str(shipped)) == DataConfig(**want) and "data" not in json.loads((shipped / "config.json").read_text())
    EvalConfig(model="m", task="arith", out=str(tmp_path / "o"), data=str(shipped))     # a folder, as for arith
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match='holds no "data" section'):
        task.data_config(str(tmp_path / "model"))
    with pytest.raises(ValueError, match="is a folder; expected a JSONL file"):      # not "does not exist"
        EvalConfig(model="m", task="gsm8k", out=str(tmp_path / "o"), data=str(tmp_path))


@pytest.mark.slow
def test_study_end_to_end_on_tiny_runs(tmp_path, monkeypatch):
    """`sinklens study` on four finished (2-step) runs of the four recipes: a table row per
    twin and K with its control (the dual twin: one per mode), and dynamics rows for each twin and
    its random-init control."""
    from dataclasses import replace
    from sinklens.cli import main
    from sinklens.train.train import train
    runs = {}
    for kind in ("arm", "dlm", "dlm-shift", "dual"):
        cfg = _tiny_cfg(tmp_path, kind, 2, init_from=runs.get("arm", ""), block_length=4 * (kind == "dual"))
        train(cfg, progress=False)
        runs[kind] = cfg.out
    twins = ["arm", "dlm", "dlm-shift", "dual (ar)", "dual (diffusion)"]   # one set of dual weights, both modes
    out = tmp_path / "study"
    prompts = []                              # transformers asks on stdin before running remote code
    monkeypatch.setattr("builtins.input", lambda *a: prompts.append(a) or "n")
    assert main(["study", "--out", str(out), "--n", "2", "--n-traces", "1", "--mask-topk", "0,1", "--quiet",
                 "--workers", "2"] + [a for k, r in runs.items() for a in ("--run", f"{k}={r}")]) == 0
    table = (out / "eval" / "summary.md").read_text()
    assert table.count("random keys (control)") >= 1 and all(f"{k}" in table for k in ("Unmasked", "K=1"))
    study_md = (out / "study.md").read_text()
    assert all(f"| {k} |" in study_md for k in twins) and "K / S" in study_md and (out / "study.png").is_file()
    from sinklens.experiments.study import run_stats   # the samples' statistics are found under each row's label
    assert {m for m, _ in run_stats(out / "eval")} == set(twins)
    assert re.search(r"\| dual \(diffusion\) \| \d+\.\d%", study_md.split("K / S")[1]), study_md
    # two worker processes split the samples; the merged result is what one process computes
    one = tmp_path / "study1"
    assert main(["study", "--out", str(one), "--n", "2", "--n-traces", "0", "--mask-topk", "0,1", "--quiet",
                 "--workers", "1"] + [a for k, r in runs.items() for a in ("--run", f"{k}={r}")]) == 0
    for f in sorted((one / "eval").glob("*/arith/*/samples.jsonl")):
        split = out / f.relative_to(one)
        a, b = (sorted((json.loads(x)["id"], json.loads(x)["raw_output"]) for x in p.read_text().splitlines())
                for p in (f, split))
        assert a == b and len(a) == 2, f
    assert prompts == [], "something asked whether to run a checkpoint's remote code"
    rows = json.loads((out / "dynamics_over_problems.json").read_text())
    labels = {r["model"] for r in rows}
    assert labels >= {*twins, *(f"{k} (random init)" for k in twins)}
    assert all("track_classes" in r and "drift" in r for r in rows)
    from sinklens.trace.reader import open_trace
    controls = sorted((out / "traces").glob("*-random-init-*.arrow"))   # each twin's control: random_init recorded
    assert len(controls) == 5 and all(open_trace(str(p)).meta["model"].get("random_init") is not None for p in controls)
    with pytest.raises(SystemExit) as e:                                              # no LABEL=: a usage error
        main(["study", "--run", str(runs["arm"]), "--out", str(out)])
    assert e.value.code == 2


@pytest.mark.slow
def test_dlm_shift_starts_from_an_exported_arm_folder(tmp_path):
    """--init-from also takes an exported ARM folder (what `sinklens/assets/story-arm-4l` ships),
    so Dream's recipe can start from a shipped twin without its training run: the first weights
    are the export's (fp16 -> fp32); another tokenizer is refused in one line."""
    from dataclasses import replace
    from sinklens.train.train import _init_weights, train
    arm = _tiny_cfg(tmp_path, "arm", 2)
    train(arm, progress=False)
    exported = f"{arm.out}/export"
    shift = replace(_tiny_cfg(tmp_path / "s", "dlm-shift", 1), init_from=exported)
    res = train(shift, progress=False)
    assert res["finished"]
    w = _init_weights(exported, tmp_path / "s" / "dlm-shift" / "tokenizer")
    ref = load_file(f"{exported}/model.safetensors")
    assert w.keys() == ref.keys() and all(torch.equal(w[k], ref[k].float()) for k in w)
    other = replace(_tiny_cfg(tmp_path / "o", "dlm-shift", 1), vocab_size=100, init_from=exported)
    with pytest.raises(ValueError, match="another tokenizer"):
        train(other, progress=False)


def test_a_run_still_training_ships_its_latest_checkpoint(tmp_path):
    """ship(snapshot=True) ships the checkpoint of an unfinished run: sinklens.load reads it and
    its logits are the checkpoint's weights (in float16); the summary and log stop at its step."""
    import sinklens
    from dataclasses import replace
    from sinklens.train.ship import ship
    from sinklens.train.train import snapshot, train
    cfg = replace(_tiny_cfg(tmp_path, "dlm", 6), stop_after=4)
    assert not train(cfg, progress=False)["finished"]
    snapshot(cfg.out)
    dest = ship(cfg.out, "twin", dest_root=tmp_path / "assets", snapshot=True)
    summary = json.loads((dest / "training" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["schedule_steps"] == 6
    assert max(json.loads(l)["step"] for l in (dest / "training" / "log.jsonl").read_text().splitlines()) == 4
    m = sinklens.load(str(dest), dtype="float32")
    tok = AutoTokenizer.from_pretrained(str(dest))
    ours = build_model(replace(cfg.model, vocab_size=len(tok)), diffusion=True, seed=0).eval()
    ours.load_state_dict(load_file(f"{cfg.out}/ckpt/model.safetensors"))
    ids = torch.tensor([tok.encode("Tom has 3 pens. He gets 2 more.")])
    assert torch.allclose(m.model(input_ids=ids).logits, ours.half().float()(input_ids=ids).logits, atol=1e-3)


def test_the_recorded_command_rebuilds_the_config_however_the_run_was_called(tmp_path, monkeypatch):
    """command.txt holds the command line of the run's config, not the calling process's argv (a
    run started from Python, or from pytest with absolute paths, records the same); parsed by the
    `sinklens train` parser it gives the config back."""
    import argparse
    import shlex
    import sys
    from dataclasses import replace

    from sinklens.cli import train as train_cli
    from sinklens.train.train import train

    monkeypatch.setattr(sys, "argv", ["pytest", "--junitxml=/elsewhere/x.xml"])
    cfg = replace(_tiny_cfg(tmp_path, "arm", 2), lr=1e-3, seed=3)
    train(cfg, progress=False)
    line = (Path(cfg.out) / "command.txt").read_text().splitlines()[1]
    assert line.startswith("sinklens train --kind arm ") and "/elsewhere" not in line
    parser = argparse.ArgumentParser()
    train_cli.register(parser.add_subparsers())
    args = parser.parse_args(shlex.split(line)[1:])
    assert train_cli.config(args).to_dict() == cfg.to_dict()
