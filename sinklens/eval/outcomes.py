"""Outcomes beyond accuracy: how far a masked generation moved from the unmasked one.

Readouts that need no correct answer, so they read even on a model that never learned the
task. Each masked (or random-key control) sample is compared with the *unmasked* run's sample of
the same id in the same eval (`k0/`, same seed: `seed + index`):

- `edit_distance`: Levenshtein distance between the two generated token-id lists (each cut at
  its first end token, as the text is), divided by the longer length (0: identical, 1: nothing shared);
- `similarity`: 1 - edit_distance;
- `same_position`: share of positions (of the longer output) holding the same token in both;
- `flip`: the extracted answer differs (tasks without an extracted answer: the verdict differs);
- `kl`: mean over generated positions of KL(unmasked || masked) between the distributions each
  position was *committed from* (its final step: a DLM's logits row at the step that revealed
  it, an ARM's row that produced it), nats/position. The unmasked run keeps, per sample, the top
  `TOP` log-probabilities of those rows (`commit_logp/<index>.pt`, ~ positions x TOP x 8 bytes);
  the masked run keeps its log-probs of those tokens while the sample runs. KL is taken over the
  unmasked top-TOP tokens plus one bucket for the rest: exact when the vocabulary has <= TOP
  tokens, otherwise a lower bound of the full KL (merging tokens never raises a KL);
- `deferred` (diffusion samplers): the share of the unmasked run's commits that the masked run
  makes at a later step or never, and `commit_prob_change`: the masked run's mean probability of
  the tokens it committed at those positions minus the unmasked run's (the paper's §5.2: "when a
  sink is masked, the model likely becomes less confident about those tokens ... and therefore
  not consider them for unmasking"). Each record keeps its run's commits (`commits`: per
  generated position the step it was committed at, -1 never, and that token's probability then;
  sinklens.trace.commits).
"""
from __future__ import annotations

import errno
import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
from sinklens.eval import records

# torch is imported where a tensor is made: `sinklens eval-summary` reads the readouts without it

TOP = 64                     # unmasked log-probs kept per generated position
FLOOR = -100.0               # log-probs below (a sampler's -inf for EOS) count as this: KL stays finite
READOUTS = ("edit_distance", "similarity", "same_position", "flip", "kl", "deferred", "commit_prob_change")


class CommitLogits:
    """Hook: the log-softmax of the logits row each generated position was committed from, kept
    small as it comes (the full rows of a 256-token LLaDA generation would be ~130 MB):
    unmasked run (`ref` None): its top TOP tokens; masked run: its log-probs of the unmasked
    run's top tokens at that position (`ref`: the unmasked `top()`). `rows[pos]`: (k,) float32
    log-probs (with `ids[pos]` (k,) when unmasked); an ARM commits each position once, a DLM too, except
    where a sampler rewrites a committed token (LLaDA2.1's editing, `event.edited`; SDAR's quota
    reaching unmasked positions): the row kept is that of its last commit, the one its final token came from."""

    def __init__(self, prompt_len: int, arm: bool, ref: dict | None = None):
        self.prompt_len, self.arm = prompt_len, arm
        self.ref = None if ref is None else {p: ids.long() for p, ids in zip(ref["pos"].tolist(), ref["ids"])}
        self.rows: dict[int, "torch.Tensor"] = {}
        self.ids: dict[int, "torch.Tensor"] = {}

    def after_step(self, event) -> None:
        import torch
        logits = event.logits[0]                                       # (S_q, V), batch of one
        if self.arm:                                                   # the last row chose the token at S
            self._keep(event.tokens.shape[1], logits[-1])
            return
        qpos = None if event.query_positions is None else event.query_positions[0].tolist()
        committed = event.revealed[0] if event.edited is None else event.revealed[0] | event.edited[0]
        for pos in torch.nonzero(committed).squeeze(1).tolist():   # a DLM: positions revealed (or rewritten) now
            self._keep(pos, logits[pos if qpos is None else qpos.index(pos)])  # full canvas, or the block's rows

    def _keep(self, pos: int, row: "torch.Tensor") -> None:
        import torch
        if pos < self.prompt_len or (self.ref is not None and pos not in self.ref):
            return
        logp = torch.log_softmax(row.float(), dim=-1).clamp_min(FLOOR).cpu()   # (V,)
        if self.ref is None:
            self.rows[pos], self.ids[pos] = logp.topk(min(TOP, logp.shape[0]))
        else:
            self.rows[pos] = logp[self.ref[pos]]

    def top(self) -> dict:
        """What the unmasked run keeps: positions (N,), token ids (N, k), log-probs (N, k)."""
        import torch
        pos = sorted(self.rows)
        if not pos:
            return {"pos": torch.zeros(0, dtype=torch.int32), "ids": torch.zeros(0, 0, dtype=torch.int32),
                    "logp": torch.zeros(0, 0)}
        return {"pos": torch.tensor(pos, dtype=torch.int32), "ids": torch.stack([self.ids[p] for p in pos]).int(),
                "logp": torch.stack([self.rows[p] for p in pos])}


def kl_to_unmasked(ref: dict, masked_rows: dict) -> float | None:
    """Mean KL(unmasked || masked) over the positions both runs committed (nats), or None if none.
    ref: `CommitLogits.top()` of the unmasked run; masked_rows: `CommitLogits(..., ref=ref).rows`
    of the masked run, its log-probs of the same tokens."""
    kls = []
    for i, pos in enumerate(ref["pos"].tolist()):
        if pos not in masked_rows:
            continue
        lp_u = ref["logp"][i].double()                                 # (k,) unmasked top-k
        lp_m = masked_rows[pos].double()                               # (k,) masked, same tokens
        p_u = lp_u.exp()
        kl = float((p_u * (lp_u - lp_m)).sum())
        rest_u = max(0.0, 1.0 - float(p_u.sum()))                      # the bucket of every other token
        rest_m = max(0.0, 1.0 - float(lp_m.exp().sum()))
        if rest_u > 1e-12:
            kl += rest_u * (math.log(rest_u) - math.log(max(rest_m, math.exp(FLOOR))))
        kls.append(max(kl, 0.0))                                       # rounding can dip below 0
    return sum(kls) / len(kls) if kls else None


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance (insert, delete, substitute: 1 each); O(len(a) * len(b)) time, O(len(b)) memory."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def _answer(rec: dict):
    return rec["extracted"] if "extracted" in rec else rec.get("verdict", rec.get("correct"))


def commit_record(commits, prompt_len: int) -> dict:
    """A run's commits over its generated positions, as a record stores them (JSON: null for NaN)."""
    step = commits.step[prompt_len:].tolist()
    prob = [None if p != p else round(float(p), 5) for p in commits.prob[prompt_len:].tolist()]
    return {"step": step, "prob": prob}


def commit_readouts(unmasked: dict | None, masked: dict | None) -> dict:
    """`deferred` and `commit_prob_change` of two records' `commits` (None where either has none)."""
    if not unmasked or not masked:
        return {"deferred": None, "commit_prob_change": None}
    import numpy as np

    from sinklens.trace.commits import Commits, deferrals
    as_commits = lambda c: Commits(np.asarray(c["step"], np.int64),  # noqa: E731
                                   np.asarray([np.nan if p is None else p for p in c["prob"]], np.float32))
    d = deferrals(as_commits(unmasked), as_commits(masked))
    change = d.prob_masked - d.prob_unmasked
    return {"deferred": d.deferred_share if d.commits else None, "commit_prob_change": change if change == change else None}


def compare(unmasked: dict, masked: dict, kl: float | None = None) -> dict:
    """Every readout of one masked sample against its unmasked record (both need `output_ids`)."""
    a, b = unmasked["output_ids"], masked["output_ids"]
    n = max(len(a), len(b))
    dist = edit_distance(a, b) / n if n else 0.0
    same = sum(x == y for x, y in zip(a, b)) / n if n else 1.0
    return {"edit_distance": dist, "similarity": 1.0 - dist, "same_position": same,
            "flip": float(_answer(unmasked) != _answer(masked)), "kl": kl,
            **commit_readouts(unmasked.get("commits"), masked.get("commits"))}


def logp_path(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, "commit_logp", f"{index}.pt")


def save_top(run_dir: str, index: int, top: dict) -> None:
    """Written (temporary file + rename) before the sample's record line, so a record implies its file."""
    path = logp_path(run_dir, index)
    import torch
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(top, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:          # disk full / size limit: the run's one clear write error
        if os.path.exists(tmp):
            os.remove(tmp)
        raise records.WriteError(path, e if isinstance(e, OSError) else OSError(errno.EIO, str(e))) from e


def load_top(run_dir: str, index: int) -> dict | None:
    import torch
    path = logp_path(run_dir, index)
    return torch.load(path) if os.path.exists(path) else None
