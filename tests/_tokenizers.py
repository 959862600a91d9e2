"""A tiny checkpoint fixture with a tokenizer: text in and out for the eval and the command line.

The fixtures of the 2026 families (tests/fixtures/{sdar,llada2,lladamoe}) carry no tokenizer: their
vocabularies are a few hundred ids with the end token and the mask token at the fixture's ids.
`with_tokenizer` copies one into a folder and adds a character-level BPE trained here on the
arithmetic task's problems and answers, filling exactly the ids below the end token, so any vocabulary
size works (a byte-level BPE needs 256 ids for its alphabet alone; LLaDA2's fixture has 157)."""
from __future__ import annotations

import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from sinklens.eval.arith import heldout_problems

EOS = "<|endoftext|>"


def arith_text(n: int = 400) -> list[str]:
    """Questions and worked answers of the arithmetic task, the text the tokenizer will meet."""
    return [f"{p.question} {p.solution}" for p in heldout_problems(n)]


def with_tokenizer(fixture: Path, out: Path, *, eos_id: int, mask_token: str) -> Path:
    """`fixture`'s config, weights (and generation config) in `out`, with a tokenizer whose ordinary
    tokens are ids 0..eos_id-1 (id 0 = <unk>), EOS = eos_id and `mask_token` = eos_id + 1."""
    out.mkdir(parents=True)
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        if (fixture / f).is_file():
            shutil.copy(fixture / f, out / f)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(arith_text(), trainers.BpeTrainer(vocab_size=eos_id, special_tokens=["<unk>"],
                                                              show_progress=False))
    filler = eos_id - tok.get_vocab_size()  # too little text for eos_id pieces: pad the vocabulary with unused ones
    if filler > 0:
        tok.add_tokens([f"<unused{i}>" for i in range(filler)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, unk_token="<unk>",
                                   additional_special_tokens=[mask_token])
    assert fast.convert_tokens_to_ids([EOS, mask_token]) == [eos_id, eos_id + 1]
    fast.save_pretrained(out)
    return out
