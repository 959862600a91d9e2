"""Synthetic traces with planted sinks, built from real softmax attention maps.

Each head's attention map at each step is softmax(noise + planted logits): the planted keys get a
large logit from a chosen set of queries (all, only masked, only unmasked). Column sums, per-group
column sums and the maps themselves are then computed exactly as the attention function does, so
the analysis sees what a model would produce. The plan (which key is a sink where) is the ground
truth the tests compare against; it is written down here, not computed by the code under test.
"""
from __future__ import annotations

import numpy as np

T, L, H, S = 12, 2, 3, 32
PROMPT, BLOCK = 16, 8
MASK_ID = 99
# masked positions per step: the last n of the canvas; reveal schedule avoids borderline sink sizes
MASKED_COUNT = [16, 12, 8, 6, 2, 0, 0, 0, 0, 0, 0, 0]

VOCAB = {0: "<|startoftext|>", 1: "Ġ", 2: "Ċ", 3: ".", 4: "the", 5: "cat", 6: ",", 7: "+", MASK_ID: "<|mdm_mask|>"}


def base_tokens() -> np.ndarray:
    """(S,) canvas before masking: chosen so every planted position has a known category."""
    tok = np.full(S, 5)          # "cat": other
    tok[0] = 0                   # special
    tok[3] = 1                   # Ġ whitespace
    tok[7] = 3                   # "." punctuation
    tok[10] = 4                  # "the" other
    tok[20] = 6                  # "," punctuation
    tok[31] = 2                  # Ċ whitespace
    tok[5:8] = [7, 7, 3]         # "+", "+", "."
    tok[26:29] = [6, 6, 6]
    return tok


def masked_at(t: int) -> np.ndarray:
    m = np.zeros(S, bool)
    if MASKED_COUNT[t]:
        m[S - MASKED_COUNT[t]:] = True
    return m


def plan(t: int) -> dict[tuple[int, int], list[tuple[int, str, float]]]:
    """(layer, head) -> planted (key, query set, logit) at step t."""
    p = {
        (0, 0): [(0, "all", 8.0)],                                     # static at 0
        (0, 1): [(10, "all", 8.0)] if t < 5 else [(20, "all", 8.0)] if t < 9 else [],  # moving 10 -> 20, dies
        (0, 2): [(31, "all", 9.0)] + ([(7, "all", 7.5)] if t in (3, 4) else []),     # static 31 + vanishing 7
        (1, 0): [(3, "unmasked", 8.0), (25, "masked", 8.0)],           # masked / unmasked split
        (1, 1): [],                                                    # no sink
        (1, 2): [(5 + min(t, 2), "all", 9.0), (28 - min(t, 2), "all", 7.5)],  # two sinks moving apart, then stay
    }
    return p


def expected_sinks(t: int) -> dict[tuple[int, int], set[int]]:
    """Ground truth: positions that must be Eq. 3 sinks (ε = 3, sums) at step t."""
    exp = {}
    for lh, planted in plan(t).items():
        keys = set()
        for key, who, _ in planted:
            if who == "masked" and MASKED_COUNT[t] < 6:   # fewer than 6 masked queries: r < ~4, no sink
                continue
            keys.add(key)
        exp[lh] = keys
    return exp


def build(seed: int = 0, with_maps: bool = True) -> dict:
    """Arrays of one batch row: received (T, L, H, S), received_groups (T, 2, L, H, S), tokens,
    is_masked, maps {(t, l, h): (S, S)} for head (1, 0)."""
    rng = np.random.default_rng(seed)
    received = np.zeros((T, L, H, S), np.float32)
    groups = np.zeros((T, 2, L, H, S), np.float32)
    tokens = np.zeros((T, S), np.int64)
    is_masked = np.zeros((T, S), bool)
    maps = {}
    for t in range(T):
        m = masked_at(t)
        is_masked[t] = m
        tokens[t] = np.where(m, MASK_ID, base_tokens())
        for (l, h), planted in plan(t).items():
            logits = rng.normal(0.0, 0.3, size=(S, S))                 # (S_q, S_k)
            for key, who, big in planted:
                rows = {"all": np.ones(S, bool), "masked": m, "unmasked": ~m}[who]
                logits[rows, key] += big
            A = np.exp(logits - logits.max(-1, keepdims=True))
            A /= A.sum(-1, keepdims=True)                              # rows sum to 1
            received[t, l, h] = A.sum(0)
            groups[t, 0, l, h] = A[m].sum(0)                           # "masked" queries
            groups[t, 1, l, h] = A[~m].sum(0)                          # "unmasked" queries
            if with_maps and (l, h) == (1, 0) and t in (0, 3, 11):
                maps[(t, l, h)] = A.astype(np.float32)
    return dict(received=received, received_groups=groups, tokens=tokens, is_masked=is_masked, maps=maps)


def source(seed: int = 0, with_maps: bool = True, **kw):
    from sinklens.analysis import ArraySource

    d = build(seed, with_maps)
    return ArraySource(d["received"], d["tokens"], is_masked=d["is_masked"], received_groups=d["received_groups"],
                       group_names=("masked", "unmasked"), maps=d["maps"], vocab=VOCAB, mask_id=MASK_ID,
                       special_ids=(0,), block_length=BLOCK, prompt_length=PROMPT, label=kw.pop("label", "planted"),
                       **kw)


def arm_source(label: str = "arm"):
    """Causal: a prefill step summing 8 query rows, then 5 decoding steps of one row each."""
    rng = np.random.default_rng(0)
    T, S0 = 6, 8
    S = S0 + T - 1
    received = np.zeros((T, 1, 2, S), np.float32)
    tokens = np.full((T, S), -1)
    qpos = []
    for t in range(T):
        n = S0 + t
        rows = n if t == 0 else 1
        A = rng.dirichlet(np.ones(n), size=rows)                    # rows of attention over n keys
        received[t, 0, :, :n] = A.sum(0)
        tokens[t, :n] = np.arange(n) % 7
        qpos.append(np.arange(n) if t == 0 else np.array([n - 1]))
    key_mask = tokens >= 0
    from sinklens.analysis import ArraySource

    return ArraySource(received, np.where(key_mask, tokens, 0), key_mask=key_mask, query_positions=qpos,
                       causal=True, vocab={i: f"t{i}" for i in range(7)}, prompt_length=S0, label=label)
