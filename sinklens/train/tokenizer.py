"""A small BPE tokenizer for the synthetic word problems, saved as a plain transformers folder.

Digits are always single tokens (so arithmetic is digit by digit, and the vocabulary need not
cover numbers); words become whole tokens after a few hundred merges. A small vocabulary keeps
the LM head cheap. The saved `tokenizer.json` + `tokenizer_config.json` load with
`AutoTokenizer.from_pretrained(folder)` / `PreTrainedTokenizerFast` and no remote code.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from sinklens.train.data import DataConfig, generate
from sinklens.train.wordings import EXAMPLES, vocabulary

WORD = re.compile(r"[A-Za-z]+")
KNOWN_WORDS = {w.lower() for text in vocabulary() for w in WORD.findall(text)}

# Fixed ids 0..4, so every tokenizer built here agrees on the special tokens.
PAD, EOS, MASK, USER, ASSISTANT = "<|pad|>", "<|eos|>", "<|mask|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = [PAD, EOS, MASK, USER, ASSISTANT]

# One user turn, one assistant turn ended by EOS; no system prompt, no newlines (short prompts).
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}" + EOS +
    "{% else %}{{ raise_exception('roles must be user or assistant, got ' + m['role']) }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def train_tokenizer(vocab_size: int = 256, cfg: DataConfig = DataConfig(), n_texts: int = 4000,
                    seed: int = 0) -> PreTrainedTokenizerFast:
    """Train the BPE on generated problems (train split only) and wrap it for transformers."""
    if vocab_size <= len(SPECIAL_TOKENS) + 16:
        raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS) + 16}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    # Digits split one by one first; then spaces become "▁" attached to the following word.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    texts = [t for p in generate(n_texts, seed=seed, split="train", cfg=cfg)
             for t in (p.question, p.solution)]
    # All ASCII printables in the alphabet, so unseen characters (e.g. a user's '*') still encode.
    alphabet = [chr(c) for c in range(33, 127)] + ["▁"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                   mask_token=MASK, additional_special_tokens=[USER, ASSISTANT],
                                   model_max_length=512, padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tok: PreTrainedTokenizerFast, folder: str | Path) -> None:
    tok.save_pretrained(str(folder))


UNFAMILIAR_LIMIT = 3      # more unknown words than this: the prompt is far outside the twin's vocabulary


def unfamiliar_words(text: str) -> list[str]:
    """The words of `text` no short problem uses (numbers are digits: always known): the model
    meets them as pieces it never saw in use."""
    return [w for w in WORD.findall(text) if w.lower() not in KNOWN_WORDS]


def vocabulary_note(folder: str | Path, prompt: str) -> str | None:
    """One line with prompts a twin was trained on, when `prompt` is far outside its vocabulary;
    None when it is not, or when `folder` is no short-problem twin trained here."""
    conf = Path(folder) / "training" / "train_config.json"
    try:
        style = json.loads(conf.read_text())["data"]["style"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    unknown = unfamiliar_words(prompt)
    if style != "short" or len(unknown) <= UNFAMILIAR_LIMIT:
        return None
    return (f"note: {len(unknown)} words of this prompt are outside what the twin was trained on "
            f"({', '.join(unknown[:5])}...); it answers one-step word problems such as: "
            + " | ".join(repr(e) for e in EXAMPLES))
