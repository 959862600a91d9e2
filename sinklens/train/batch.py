"""Problems -> tensors: left-padded prompt, then a fixed-length answer region.

Layout of every row (S = P + G):  [PAD .. PAD][<|user|> question <|assistant|>][answer EOS EOS..]
                                   ^-- left pad   ^-- prompt (never masked)       ^-- G positions
Both twins see exactly these tokens; the loss lives on the answer region only (LLaDA SFT style),
so the DLM and the ARM train on the same number of tokens.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from sinklens.train.data import Problem

ANSWER_RE = re.compile(r"####\s*(-?\d+)")


@dataclass
class Batch:
    input_ids: torch.Tensor       # (B, S) long
    attention_mask: torch.Tensor  # (B, S) long, 0 on left padding
    prompt_len: int               # P: the answer region is input_ids[:, P:]
    answer_len: torch.Tensor      # (B,) tokens of answer + first EOS (the rest is EOS filler)


def prompt_ids(tok, question: str) -> list[int]:
    enc = tok.apply_chat_template([{"role": "user", "content": question}],
                                  add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(enc["input_ids"])


def encode_prompts(tok, questions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts (B, P) and their attention mask."""
    rows = [prompt_ids(tok, q) for q in questions]
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), tok.pad_token_id, dtype=torch.long)
    am = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r)
        am[i, P - len(r):] = 1
    return ids, am


def encode_batch(tok, problems: list[Problem], gen_length: int) -> Batch:
    ids, am = encode_prompts(tok, [p.question for p in problems])
    B, P = ids.shape
    ans = torch.full((B, gen_length), tok.eos_token_id, dtype=torch.long)
    lens = torch.empty(B, dtype=torch.long)
    for i, p in enumerate(problems):
        a = tok.encode(p.solution, add_special_tokens=False)
        if len(a) + 1 > gen_length:
            raise ValueError(f"answer of {len(a)} tokens + EOS exceeds gen_length={gen_length}: {p.solution!r}")
        ans[i, :len(a)] = torch.tensor(a)
        lens[i] = len(a) + 1
    return Batch(torch.cat([ids, ans], 1), torch.cat([am, torch.ones_like(ans)], 1), P, lens)


def parse_answer(text: str) -> int | None:
    m = ANSWER_RE.search(text)
    return int(m.group(1)) if m else None


def decode_answers(tok, answer_ids: torch.Tensor) -> list[str]:
    """Answer-region ids (B, G) -> text up to the first EOS."""
    out = []
    for row in answer_ids.tolist():
        if tok.eos_token_id in row:
            row = row[:row.index(tok.eos_token_id)]
        out.append(tok.decode(row, skip_special_tokens=True))
    return out
