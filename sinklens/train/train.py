"""Training loop for the tiny twins: a LLaDA-style masked DLM and its autoregressive twin.

DLM loss (LLaDA SFT, answer-only masking): per sequence a masking ratio t ~ U(0, 1) (stratified
across the batch), t G answer tokens masked, never the prompt; cross-entropy on masked positions
weighted 1/t, divided by the answer-region length G (see dlm_loss). ARM loss: next-token cross-entropy on the same answer region. Same data,
same tokens, same shape; only attention (bidirectional vs causal) and the objective differ.

Resumable: `<out>/ckpt/` holds model + AdamW state (safetensors) and `state.json` (step,
config). Randomness is a pure function of (seed, step) — the data stream and the masking
generator are re-seeded per step — so a resumed run is bit-identical to an uninterrupted one.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from sinklens.params import command_flags
from sinklens.runlock import RunLock
from sinklens.train.batch import decode_answers, encode_batch, encode_prompts, parse_answer
from sinklens.train.data import DataConfig, ProblemStream, generate
from sinklens.train.decode import arm_generate, dlm_generate
from sinklens.train.config import ModelConfig, TrainConfig, init_weights_path  # noqa: F401  (TrainConfig is public here too)
from sinklens.train.model import build_model, save_dream_folder, save_llada_folder, save_llama_folder
from sinklens.train.tokenizer import save_tokenizer, train_tokenizer

BUCKETS = 5              # masked-token accuracy is logged per mask-ratio bucket [0,.2),...,[.8,1]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_frac * lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def dlm_loss(model, input_ids, attention_mask, P: int, mask_id: int, gen: torch.Generator,
             shift: bool = False, block: int = 0):
    """LLaDA SFT loss on the answer region. Returns (loss, masked (B,G) bool, correct (B,G) bool, t (B,)).

    t ~ U(0, 1) per sequence, stratified across the batch (one draw per slice of (0, 1)). Instead
    of masking each token with probability t (Bernoulli), exactly k = ceil(t G) answer tokens are
    masked and t is taken as k / G: the same 1/t-weighted objective, sum_masked CE / (t G) =
    mean CE over the masked tokens, without the variance of a few heavily weighted tokens at
    small t (seen to dominate whole batches with Bernoulli masking).
    `shift` (Dream's recipe, for a DLM initialised from an ARM): the prediction for position i is
    read at position i - 1, as the ARM was trained to do.
    `block` > 0: the states block decoding meets (SDAR's and LLaDA2's recipe, the blocks of the
    sampler): per sequence one block of the answer drawn uniformly, t of its tokens masked, every
    block before it clean and every block after it fully masked; the loss on the drawn block's
    masked tokens only (n = that block's length in place of G).
    """
    B, S = input_ids.shape
    G = S - P
    u = (torch.rand(1, generator=gen) + torch.arange(B)) / B                  # (B,) stratified U(0,1)
    u = u[torch.randperm(B, generator=gen)]
    block = block or G                                      # 0: the whole answer is the one block
    blocks = -(-G // block)
    start = torch.zeros(B, dtype=torch.long) if blocks == 1 else \
        torch.randint(blocks, (B,), generator=gen) * block                   # (B,) the drawn block
    end = (start + block).clamp(max=G)
    pos = torch.arange(G)
    inside = (pos >= start[:, None]) & (pos < end[:, None])                     # (B, G)
    later = pos >= end[:, None]                                                  # (B, G) masked, no loss
    n = end - start                                                              # (B,) maskable tokens
    k = torch.minimum((u * n).ceil().long().clamp(min=1), n)                     # (B,) masked tokens
    order = torch.rand((B, G), generator=gen).masked_fill(~inside, 2.0)          # outside the block: last
    rank = order.argsort(1).argsort(1)                                           # (B, G) random order
    masked = rank < k[:, None]                                                   # (B, G)
    t = k.float() / n                                                            # realised ratio
    x = input_ids.clone()
    x[:, P:][masked | later] = mask_id
    logits = model(input_ids=x, attention_mask=attention_mask).logits              # (B, S, V)
    logits = logits[:, P - 1:-1] if shift else logits[:, P:]                       # (B, G, V)
    target = input_ids[:, P:]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                         reduction="none").view(B, G)
    loss = ((ce * masked).sum(1) / k).mean()     # = mean_b (1/G) sum_masked CE / t_b
    correct = logits.argmax(-1) == target
    return loss, masked, correct, t


def arm_loss(model, input_ids, attention_mask, P: int):
    """Next-token loss on the answer region (position P-1 predicts P, ...). Returns (loss, correct (B,G))."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, P - 1:-1]  # (B, G, V)
    target = input_ids[:, P:]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))
    return loss, logits.argmax(-1) == target


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model, tok, problems, cfg: TrainConfig, batch_size: int = 100) -> dict:
    """Exact-answer accuracy (unmasked decoding) and, for the DLM, one-pass token accuracy with
    the whole answer masked (the signal that precedes exact answers)."""
    if cfg.kind == "dual":
        from sinklens.train.dual import evaluate_dual
        return evaluate_dual(model, tok, problems, cfg, batch_size)
    model.eval()
    correct, full_mask_hits, full_mask_total, samples = 0, 0, 0, []
    correct_one_block = 0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        ids, am = encode_prompts(tok, [p.question for p in chunk])
        if cfg.diffusion:
            ans = dlm_generate(model, ids, am, gen_length=cfg.gen_length, mask_id=tok.mask_token_id,
                               block_length=cfg.block_length or None, shift=cfg.shift)
            if cfg.block_length and cfg.block_length != cfg.gen_length:   # also one whole-answer block
                one = dlm_generate(model, ids, am, gen_length=cfg.gen_length, mask_id=tok.mask_token_id,
                                   shift=cfg.shift)
                correct_one_block += sum(parse_answer(t) == p.answer for p, t in zip(chunk, decode_answers(tok, one)))
            b = encode_batch(tok, chunk, cfg.gen_length)
            x = b.input_ids.clone()
            x[:, b.prompt_len:] = tok.mask_token_id
            logits = model(input_ids=x, attention_mask=b.attention_mask).logits
            P = b.prompt_len
            pred = (logits[:, P - 1:-1] if cfg.shift else logits[:, P:]).argmax(-1)
            real = torch.arange(cfg.gen_length)[None] < b.answer_len[:, None]          # (B, G)
            full_mask_hits += int(((pred == b.input_ids[:, b.prompt_len:]) & real).sum())
            full_mask_total += int(real.sum())
        else:
            ans = arm_generate(model, ids, am, gen_length=cfg.gen_length, eos_id=tok.eos_token_id)
        texts = decode_answers(tok, ans)
        for p, text in zip(chunk, texts):
            ok = parse_answer(text) == p.answer
            correct += ok
            if len(samples) < 3:
                samples.append({"question": p.question, "output": text, "ok": bool(ok)})
    model.train()
    out = {"exact_acc": correct / len(problems), "n": len(problems), "samples": samples}
    if cfg.diffusion and cfg.block_length and cfg.block_length != cfg.gen_length:
        out["exact_acc_one_block"] = correct_one_block / len(problems)
    if full_mask_total:
        out["full_mask_token_acc"] = full_mask_hits / full_mask_total
    return out


# ---------------------------------------------------------------- checkpoints

def _save_ckpt(model, opt, step: int, cfg: TrainConfig, ckpt: Path, tokens: int) -> None:
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    sd = opt.state_dict()
    tensors = {f"{idx}.{k}": (v if torch.is_tensor(v) else torch.tensor(v)).contiguous()
               for idx, st in sd["state"].items() for k, v in st.items()}
    save_file(tensors, str(tmp / "optim.safetensors"))
    (tmp / "state.json").write_text(json.dumps(
        {"step": step, "tokens": tokens, "config": cfg.to_dict(), "param_groups": sd["param_groups"]}, indent=1))
    if ckpt.exists():
        old = ckpt.with_name(ckpt.name + ".old")
        ckpt.rename(old)
        tmp.rename(ckpt)
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    else:
        tmp.rename(ckpt)


def _load_tokens(ckpt: Path) -> int:
    return int(json.loads((ckpt / "state.json").read_text())["tokens"])


def _load_ckpt(model, opt, ckpt: Path) -> int:
    state = json.loads((ckpt / "state.json").read_text())
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
    flat = load_file(str(ckpt / "optim.safetensors"))
    per: dict[int, dict] = {}
    for key, v in flat.items():
        idx, name = key.split(".", 1)
        per.setdefault(int(idx), {})[name] = v
    opt.load_state_dict({"state": per, "param_groups": state["param_groups"]})
    return int(state["step"])


# ---------------------------------------------------------------- main loop

def _init_weights(init_from: str, tok_dir: Path) -> dict:
    """The weights a run starts from: another run's checkpoint (its --out) or an exported ARM
    folder, such as the shipped twin `story-arm-4l` (by name; Llama names, fp16 -> fp32). The
    token ids must mean the same thing, so the tokenizers must be equal."""
    src = init_weights_path(init_from)
    run_ckpt = src / "ckpt" / "model.safetensors"
    weights, their_tok = ((run_ckpt, src / "tokenizer" / "tokenizer.json") if run_ckpt.is_file()
                          else (src / "model.safetensors", src / "tokenizer.json"))
    vocab = lambda f: json.loads(f.read_text())["model"]   # noqa: E731
    if vocab(their_tok) != vocab(tok_dir / "tokenizer.json"):
        raise ValueError(f"init_from: {src} has another tokenizer (different data settings or vocab size)")
    return {k: v.float() for k, v in load_file(str(weights)).items()}


def _check_resumable(saved: TrainConfig, cfg: TrainConfig, ckpt: Path) -> None:
    """Only the schedule-free bookkeeping may change on resume (steps changes the LR schedule:
    allowed, but it is the caller's choice)."""
    free = dict(steps=1, stop_after=0, eval_every=1, log_every=1, ckpt_every=1, out="")
    if replace(saved, **free) != replace(cfg, **free):
        a, b = saved.to_dict(), cfg.to_dict()
        diff = {k: (a[k], b[k]) for k in a if a[k] != b[k] and k not in free}
        raise ValueError(f"{ckpt} was written with a different config {diff}; use a new --out")


def export(model, tok, cfg: TrainConfig, folder: Path) -> None:
    """Write the shippable folder (fp16): LLaDA format for the DLM, Dream format for the shifted
    DLM (Dream's sampler applies the shift), Llama format for the ARM."""
    if cfg.kind == "dual":
        from sinklens.train.dual import save_dual_folder
        save_dual_folder(model, folder, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                         mask_id=tok.mask_token_id, block=cfg.block_length)
    elif cfg.kind == "dlm":
        save_llada_folder(model, cfg.model, folder, mask_id=tok.mask_token_id,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    elif cfg.kind == "dlm-shift":
        save_dream_folder(model, cfg.model, folder, mask_id=tok.mask_token_id,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    else:
        save_llama_folder(model, folder, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    save_tokenizer(tok, folder)


def snapshot(run: str | Path) -> Path:
    """Export the latest checkpoint of a run (one still training, too) to `<run>/snapshot/export`,
    with the checkpoint's `state.json` and the curves so far beside it: what ship() ships from a
    run not yet finished."""
    run = Path(run)
    ckpt, folder = run / "ckpt", run / "snapshot"
    cfg = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
    while True:     # the trainer may replace ckpt/ meanwhile: read until the state is the same before and after
        state = (ckpt / "state.json").read_text()
        weights = load_file(str(ckpt / "model.safetensors"))
        if (ckpt / "state.json").read_text() == state:
            break
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(run / "tokenizer"))
    model = build_model(cfg.model, diffusion=cfg.diffusion, seed=cfg.seed)
    model.load_state_dict(weights)
    export(model, tok, cfg, folder / "export")
    (folder / "state.json").write_text(state)
    plot_curves(run / "log.jsonl", folder / "curves.png", cfg.kind)
    return folder


@torch.enable_grad()   # a caller (or a test module) may have switched autograd off globally
def train(cfg: TrainConfig, *, progress: bool = True) -> dict:
    """Train (or resume) the run in `cfg.out`; a second process on the same folder is refused
    (RunDirBusy) before it reads or writes anything there."""
    with RunLock(cfg.out, who="sinklens train"):
        return _train(cfg, progress)


def _prepare(cfg: TrainConfig, out: Path):
    """The run's tokenizer (trained on first use) and its config with the tokenizer's vocabulary;
    a resume must keep the settings that shape the run (_check_resumable)."""
    tok_dir, ckpt = out / "tokenizer", out / "ckpt"
    if not (tok_dir / "tokenizer.json").exists():
        save_tokenizer(train_tokenizer(cfg.vocab_size, cfg.data, seed=cfg.seed), tok_dir)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    cfg = replace(cfg, model=replace(cfg.model, vocab_size=len(tok)))
    if (ckpt / "state.json").exists():
        _check_resumable(TrainConfig.from_dict(json.loads((ckpt / "state.json").read_text())["config"]), cfg, ckpt)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    return cfg, tok


def _model_and_optimizer(cfg: TrainConfig, out: Path):
    """(model, AdamW, step, tokens): fresh (or from --init-from), or as the checkpoint left them."""
    ckpt = out / "ckpt"
    model = build_model(cfg.model, diffusion=cfg.diffusion, seed=cfg.seed)
    if cfg.init_from and not (ckpt / "state.json").exists():
        # Dream's recipe: the DLM starts from the trained ARM's weights (same shape and tokenizer).
        model.load_state_dict(_init_weights(cfg.init_from, out / "tokenizer"))
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8)
    if not (ckpt / "state.json").exists():
        return model, opt, 0, 0
    return model, opt, _load_ckpt(model, opt, ckpt), _load_tokens(ckpt)


def _open_log(out: Path, step: int, cfg: TrainConfig) -> Path:
    """log.jsonl as of `step` (lines written after the checkpoint resumed from are dropped: they
    will be written again) and every invocation appended to command.txt, as the command line
    that rebuilds `cfg` (however it was called: the CLI or `train()`)."""
    log_path = out / "log.jsonl"
    if step == 0 and log_path.exists():
        log_path.unlink()
    if step > 0 and log_path.exists():
        lines = [l for l in log_path.read_text().splitlines() if json.loads(l)["step"] <= step]
        log_path.write_text("".join(l + "\n" for l in lines))
    with (out / "command.txt").open("w" if step == 0 else "a") as f:
        f.write(f"# from step {step}\n" + " ".join(["sinklens", "train", *command_flags(cfg, always=("kind", "out"))]) + "\n")
    return log_path


class _Meter:
    """Training metrics between two log lines: mean loss, the DLM's masked-token accuracy per
    mask-ratio bucket, the ARM's next-token accuracy, seconds per step."""

    def __init__(self):
        self.loss, self.n, self.t0 = 0.0, 0, time.time()
        self.hit, self.cnt = torch.zeros(BUCKETS), torch.zeros(BUCKETS)
        self.tok_hit, self.tok_cnt = 0, 0

    def add(self, loss: float, correct: torch.Tensor, masked: torch.Tensor | None, t: torch.Tensor | None):
        self.loss += loss
        self.n += 1
        if masked is None:                                                     # ARM
            self.tok_hit += int(correct.sum())
            self.tok_cnt += correct.numel()
            return
        bucket = (t * BUCKETS).long().clamp(max=BUCKETS - 1)                  # (B,)
        self.hit.index_add_(0, bucket, (correct & masked).sum(1).float())
        self.cnt.index_add_(0, bucket, masked.sum(1).float())

    def record(self, diffusion: bool) -> dict:
        r = {"loss": self.loss / self.n, "sec_per_step": (time.time() - self.t0) / self.n}
        if diffusion:
            r["masked_acc_by_ratio"] = (self.hit / self.cnt.clamp(min=1)).tolist()
            r["masked_acc"] = float(self.hit.sum() / self.cnt.sum().clamp(min=1))
        else:
            r["token_acc"] = self.tok_hit / max(1, self.tok_cnt)
        return r


def _step(model, opt, tok, b, step: int, cfg: TrainConfig, meter: _Meter) -> float:
    """One optimizer step on batch `b` (the DLM's masks drawn from (seed, step)); returns the
    gradient norm before clipping."""
    for g in opt.param_groups:
        g["lr"] = lr_at(step, cfg)
    if cfg.kind == "dual":   # next-token + block diffusion, 1 : 1 (train/dual.py); the meter shows the AR half
        from sinklens.train.dual import block_diffusion_loss
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        (loss, correct), masked, t = arm_loss(model, b.input_ids, b.attention_mask, b.prompt_len), None, None
        loss = loss + block_diffusion_loss(model, b.input_ids, b.attention_mask, b.prompt_len, tok.mask_token_id,
                                           cfg.block_length, gen)[0]
    elif cfg.diffusion:
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        loss, masked, correct, t = dlm_loss(model, b.input_ids, b.attention_mask, b.prompt_len,
                                            tok.mask_token_id, gen, shift=cfg.shift, block=cfg.mask_block)
    else:
        (loss, correct), masked, t = arm_loss(model, b.input_ids, b.attention_mask, b.prompt_len), None, None
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    meter.add(loss.item(), correct, masked, t)
    return float(gnorm)


def _evaluate_heldout(model, tok, heldout: dict, cfg: TrainConfig, step: int) -> dict:
    """Each held-out kind's evaluation, by log key, with one line per kind on the console."""
    out = {}
    for key, problems in heldout.items():
        ev = out[key] = evaluate(model, tok, problems, cfg)
        tqdm.write(f"step {step}: {key}: held-out exact {ev['exact_acc']:.3f}"
                   + (f", full-mask token acc {ev['full_mask_token_acc']:.3f}" if "full_mask_token_acc" in ev else "")
                   + f" | {ev['samples'][0]['output']!r}")
    return out


def _train(cfg: TrainConfig, progress: bool) -> dict:
    torch.set_num_threads(1)     # one thread per process: faster than two on a loaded 2-core CPU
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, tok = _prepare(cfg, out)
    model, opt, step, tokens = _model_and_optimizer(cfg, out)   # tokens: seen in training (prompt + answer region)
    log_path = _open_log(out, step, cfg)
    stream, heldout, meter = ProblemStream(cfg.seed, cfg.data), heldout_sets(cfg), _Meter()
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc=f"train {cfg.kind}", dynamic_ncols=True)
    stop = min(cfg.stop_after or cfg.steps, cfg.steps)
    while step < stop:
        b = encode_batch(tok, stream.batch(step, cfg.batch_size), cfg.gen_length)
        tokens += b.input_ids.numel()
        gnorm = _step(model, opt, tok, b, step, cfg, meter)
        step += 1
        bar.update(1)
        record = {"step": step}
        if step % cfg.log_every == 0 or step == cfg.steps:
            record.update(meter.record(cfg.diffusion), lr=lr_at(step - 1, cfg), grad_norm=gnorm, tokens=tokens)
            bar.set_postfix(loss=f"{record['loss']:.3f}")
            meter = _Meter()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            record.update(_evaluate_heldout(model, tok, heldout, cfg, step))
        if len(record) > 1:
            with log_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if step % cfg.ckpt_every == 0 or step in (cfg.steps, stop):
            _save_ckpt(model, opt, step, cfg, out / "ckpt", tokens)
            if "eval" in record:
                plot_curves(log_path, out / "curves.png", cfg.kind)
    bar.close()
    if step < cfg.steps:
        return {"step": step, "out": str(out), "finished": False}
    export(model, tok, cfg, out / "export")
    plot_curves(log_path, out / "curves.png", cfg.kind)
    return {"step": step, "out": str(out), "finished": True}


# The log's key for each held-out kind (data.py's splits): "eval" (new number combinations,
# training wordings) kept from the first logs, "eval_wording" (new wordings and new numbers).
EVAL_KEYS = {"eval": "heldout", "eval_wording": "heldout-wording"}


def heldout_sets(cfg: TrainConfig) -> dict:
    """The held-out problems evaluated during training, by log key (the story style has one wording)."""
    keys = [k for k, split in EVAL_KEYS.items() if cfg.data.style == "short" or split == "heldout"]
    return {k: generate(cfg.eval_n, seed=cfg.seed, split=EVAL_KEYS[k], cfg=cfg.data) for k in keys}


def plot_curves(log_path: Path, png: Path, kind: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    recs = [json.loads(l) for l in Path(log_path).read_text().splitlines()]
    tr = [r for r in recs if "loss" in r]
    ev = [r for r in recs if "eval" in r]
    wd = [r for r in recs if "eval_wording" in r]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([r["step"] for r in tr], [r["loss"] for r in tr])
    axes[0].set(title=f"{kind}: training loss", xlabel="step", yscale="log")
    if kind in ("dlm", "dlm-shift"):
        for k in range(BUCKETS):
            axes[1].plot([r["step"] for r in tr], [r["masked_acc_by_ratio"][k] for r in tr],
                         label=f"t in [{k / BUCKETS:.1f}, {(k + 1) / BUCKETS:.1f})")
        axes[1].set(title="masked-token accuracy by mask ratio t", xlabel="step")
        axes[1].legend(fontsize=7)
    else:
        axes[1].plot([r["step"] for r in tr], [r["token_acc"] for r in tr])
        axes[1].set(title="next-token accuracy (answer region)", xlabel="step")
    axes[2].plot([r["step"] for r in ev], [r["eval"]["exact_acc"] for r in ev], "o-",
                 label="exact answer (held-out numbers)")
    if wd:
        axes[2].plot([r["step"] for r in wd], [r["eval_wording"]["exact_acc"] for r in wd], "^-",
                     label="exact answer (held-out wordings)")
    if kind in ("dlm", "dlm-shift"):
        axes[2].plot([r["step"] for r in ev], [r["eval"].get("full_mask_token_acc", float("nan")) for r in ev],
                     "s--", label="token acc, whole answer masked")
    axes[2].set(title="held-out", xlabel="step", ylim=(0, 1))
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
