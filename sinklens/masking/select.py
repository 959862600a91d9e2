"""Which keys to block at the next step, from one step's received attention (pure array math).

Input: the ranking source of step t − 1, `received` (L, B, H, S) column sums of the attention
the keys *would* have received (the softmax before any blocking; see
`AttentionRequest.received_unblocked`), and per batch row the rule's `Coverage` of the step (which
keys the summed query rows could see, per layer). Output: (L, B, H, S) bool keys blocked at step t.

The rule is sinklens/rule/np_rule.py, the very functions the report applies to a saved trace, so
the masking's Eq. 3 sinks and the report's are one computation on one step's attention. It runs
in numpy on the CPU: a step's ranking is a few dozen small array operations, and numpy's are
several times cheaper than torch's at these sizes (on a 1.9M-parameter twin the ranking had been
a sixth of a step; docs/benchmarks.md). The default selection (steps 1 and 4 at K = 1, every
key of the scope a candidate) is one call of the compiled kernel where it builds
(`_compiled_top1`), bit for bit the numpy path: inside a generation each kind of numpy operation
costs its first run's cache misses, and in place `select` takes ~120 µs this way against ~185 µs in numpy.

1. Scores in the configured units (rule/spec.py; default `scaled_sum`, the same as the report's).
2. Eq. 3 sinks: score_j − mean of the other visible keys ≥ ε.
3. Candidates: visible keys in scope ("all" | "prompt" | "generated"); Eq. 3 sinks only under
   the `eq3` protocol; scores ≥ threshold when one is set.
4. Selection: the top-K candidates per (layer, head) (or K positions ranked by the mean over
   layers and heads, `ranking="global"`); K is a count, or a share of the visible keys.
5. Control (`control="random"`): as many keys per (layer, head) as step 4 selected, drawn from
   the visible in-scope keys that are neither Eq. 3 sinks nor selected, by a random priority
   fixed for the whole generation (so the control persists the way a persistent sink would).
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np
import torch

from sinklens.attention.routes import build
from sinklens.rule import np_rule


@dataclass
class Selection:
    blocked: torch.Tensor  # (L, B, H, S) bool keys to block next step
    scores: np.ndarray  # (L, B, H, S) float32 the ranking source in the configured units, 0 off the visible keys
    visible: np.ndarray  # (L, B, 1, S) bool keys the summed query rows could see (Eq. 3 compares these)
    eps: float  # Eq. 3's ε in those units
    shortfall: int = 0  # random control: keys that could not be matched (too few non-sink keys)
    _sinks: np.ndarray | None = None  # (L, B, H, S) bool, once computed
    _wide: np.ndarray | None = None  # (L, B, H, S + room) bool: `blocked` and the next step's new keys (select's room)

    def blocked_keys(self, S: int) -> torch.Tensor:
        """(L, B, H, S) bool keys to block at a step of S keys, S at least this step's: the keys this step
        did not have (an ARM's newest token) are not blocked."""
        have = self.blocked.shape[-1]
        if S < have:
            raise ValueError(f"a step of {S} keys cannot block the keys of a step of {have}")
        if S == have:
            return self.blocked
        if self._wide is not None and self._wide.shape[-1] == S:   # made with room for them: no pad
            return torch.from_numpy(self._wide)
        return torch.nn.functional.pad(self.blocked, (0, S - have))

    @property
    def sink_array(self) -> np.ndarray:
        """(L, B, H, S) bool Eq. 3 sinks of the ranking source. Computed when first asked for: under
        the default top-K protocol only the record of what was blocked reads them, and it does so
        for many steps at once (masking/stats.py)."""
        if self._sinks is None:
            self._sinks = np_rule.is_sink(self.scores, self.visible, self.eps)
        return self._sinks

    @property
    def sinks(self) -> torch.Tensor:
        """(L, B, H, S) bool Eq. 3 sinks of the ranking source (for the record)."""
        return torch.from_numpy(self.sink_array)


@functools.lru_cache(maxsize=64)
def _positions(S: int) -> np.ndarray:
    """(S,) 0 .. S − 1, read-only: made once per length (each numpy call counts on a tiny model's step)."""
    a = np.arange(S)
    a.flags.writeable = False
    return a


def _top(key: np.ndarray, ok: np.ndarray, k) -> np.ndarray:
    """(..., S) bool: the k highest `key` among `ok` keys (k an int, or an array broadcast over the
    leading dims). Ties go to the lower position (stable sort), as in the analysis' top_k."""
    key = np.where(ok, key, -np.inf)
    if type(k) is int and k == 1:   # the default: argmax takes the first of equal maxima, as the stable sort
        return (_positions(key.shape[-1]) == key.argmax(-1)[..., None]) & ok
    order = np.argsort(-key, axis=-1, kind="stable")   # descending, ties in position order
    return (np.argsort(order, axis=-1) < k) & ok       # each key's place in that order


def _select_row(received: np.ndarray, cov: np_rule.Coverage, scope: np.ndarray, cfg, priority):
    """One batch row: received (L, H, S), cov its coverage ((L, S) arrays), scope (S,) bool,
    priority (L, H, S) or None -> (chosen (L, H, S) bool, scores (L, H, S), sinks or None, shortfall)."""
    L, H, S = received.shape
    score = np_rule.to_scores(received, cfg.units, cov)                  # (L, H, S)
    visible = cov.visible[:, None, :]                                    # (L, 1, S)
    need_sinks = cfg.sinks == "eq3" or cfg.control != "none" or cfg.ranking == "global"
    sinks = np_rule.is_sink(score, visible, cfg.sink_eps) if need_sinks else None
    in_scope = visible & scope                                           # (L, 1, S)
    if cfg.fraction is not None:
        k = np.maximum(np.ceil(cfg.fraction * cov.n_visible), 1).astype(np.int64)[:, None, None]   # (L, 1, 1)
    else:
        k = cfg.mask_k

    if cfg.ranking == "global":
        # One ranking per row: the score averaged over layers and heads (invisible keys count 0),
        # Eq. 3 on that average over the keys some layer sees.
        seen = cov.visible.any(0)                                        # (S,)
        mean = score.mean(axis=(0, 1))                                   # (S,)
        cand = seen & scope
        if cfg.sinks == "eq3":
            cand = cand & np_rule.is_sink(mean, seen, cfg.sink_eps)
        if cfg.threshold is not None:
            cand = cand & (mean >= cfg.threshold)
        chosen = cand if cfg.threshold is not None else _top(mean, cand, k if np.ndim(k) == 0 else int(k.max()))
        chosen = np.broadcast_to(chosen, (L, H, S)).copy()
    else:
        cand = in_scope if cfg.sinks != "eq3" else in_scope & sinks       # (L, 1 | H, S)
        if cfg.threshold is not None:
            chosen = np.broadcast_to(cand & (score >= cfg.threshold), (L, H, S)).copy()
        else:
            chosen = _top(score, cand, k)                                # (L, H, S)

    if cfg.layers is not None:
        keep = np.zeros(L, bool)
        keep[list(cfg.layers)] = True
        chosen &= keep[:, None, None]
    if cfg.control == "none":
        return chosen, score, sinks, 0

    # Random control: the same number of keys per (layer, head), none of them a sink.
    n = chosen.sum(-1, keepdims=True)                                    # (L, H, 1)
    eligible = in_scope & ~sinks & ~chosen
    control = _top(priority[..., :S], eligible, n)
    return control, score, sinks, int((n[..., 0] - control.sum(-1)).sum())


def select(received: np.ndarray, coverages: list[np_rule.Coverage], scope: np.ndarray, cfg,
           priority: np.ndarray | None = None, room: int = 0) -> Selection:
    """Keys to block next step (module docstring). received (L, B, H, S) float32; coverages one
    per batch row; scope (B, S) bool; cfg: a MaskingConfig; priority (L, B, H, S) random
    priorities for the control; room: keys the next step adds after these S (an ARM's next token),
    made unblocked with the selection (`Selection.blocked_keys`: a pad per step cost a tiny model's
    step ~35 us, docs/design.md)."""
    if is_default_top1(cfg):
        fast = _compiled_top1(received, coverages, scope, cfg.sink_eps, room)
        if fast is not None:
            return fast
    rows = [_select_row(received[:, b], cov, scope[b], cfg, None if priority is None else priority[:, b])
            for b, cov in enumerate(coverages)]
    sinks = None if rows[0][2] is None else _stack([r[2] for r in rows])
    L, H, S = rows[0][0].shape
    wide = np.zeros((L, len(rows), H, S + room), bool)
    for b, r in enumerate(rows):
        wide[:, b, :, :S] = r[0]
    return _selection(wide, room, coverages, _stack([r[1] for r in rows]), cfg.sink_eps,
                      shortfall=sum(r[3] for r in rows), _sinks=sinks)


def _selection(wide: np.ndarray, room: int, coverages: list[np_rule.Coverage], scores: np.ndarray, eps: float,
               **more) -> Selection:
    """The Selection of keys `wide` (L, B, H, S + room) bool, whose last `room` keys are the next step's
    (kept for `Selection.blocked_keys`); scores (L, B, H, S); `more`: its other fields."""
    S = wide.shape[-1] - room
    return Selection(blocked=torch.from_numpy(wide[..., :S] if room else wide), scores=scores,
                     visible=_stack([cov.visible[:, None, :] for cov in coverages]), eps=eps,
                     _wide=wide if room else None, **more)


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    """Per-row (L, ...) arrays -> (L, B, ...) (one row: a view, the common case)."""
    if len(rows) == 1:
        return rows[0].reshape(rows[0].shape[:1] + (1,) + rows[0].shape[1:])
    return np.stack(rows, axis=1)


def is_default_top1(cfg) -> bool:
    """Whether `cfg` asks for the default selection: the top-1 key per (layer, head) in scaled_sum
    units, no threshold, share, layer restriction or control (what `_compiled_top1` computes)."""
    return (cfg.sinks == "topk" and type(cfg.mask_k) is int and cfg.mask_k == 1 and cfg.threshold is None
            and cfg.fraction is None and cfg.ranking == "per_head" and cfg.control == "none" and cfg.layers is None
            and cfg.units == "scaled_sum")


_TOP1_ARGS = [ctypes.c_int] * 6 + [ctypes.c_void_p] * 6   # sl_top1's signature, made once (it runs every masked step)


def _top1_kernel():
    """The compiled kernel's `sl_top1` (attention/routes/onepass.c), or None where the kernel does not build."""
    return build.function("sl_top1", _TOP1_ARGS)


def _compiled_top1(received: np.ndarray, coverages: list[np_rule.Coverage], scope: np.ndarray, eps: float,
                   room: int) -> Selection | None:
    """`select` under the default selection (`is_default_top1`) as one call of the compiled kernel per
    batch row: the same scores and keys as the numpy path (tests/test_masking_select.py); a masked
    tiny-arm step 30–64 µs shorter in three paired runs (benchmarks/bench_step_switch.py). None where
    the kernel is not built, or the source is not float32."""
    top1 = _top1_kernel()
    if top1 is None or received.dtype != np.float32:   # (another dtype's product is not made from float32)
        return None
    L, B, H, S = received.shape
    r, scope = _contiguous(received, np.float32), _contiguous(scope, np.bool_)
    scores = np.empty((L, B, H, S), np.float32)
    wide = np.zeros((L, B, H, S + room), bool)
    for b, cov in enumerate(coverages):
        scale, visible = _coverage_addresses(cov)
        top1(L, B, H, S, S + room, b, r.ctypes.data, scale, visible, scope[b].ctypes.data, scores.ctypes.data,
             wide.ctypes.data)
    return _selection(wide, room, coverages, scores, eps)


# id(coverage) -> (coverage, its scale and visible arrays as C reads them, their addresses): a coverage
# recurs at every step of a DLM and with every prefix length of an ARM (the policy caches it), and an
# array's address (`ndarray.ctypes`, Python code) taken anew cost a tiny model's step ~5-7 us in place
_ADDRESSES: dict[int, tuple] = {}


def _coverage_addresses(cov: np_rule.Coverage) -> tuple[int, int]:
    """The addresses of `cov`'s scale (L,) float64 and visible (L, S) bool, C-contiguous."""
    got = _ADDRESSES.get(id(cov))
    if got is None or got[0] is not cov:
        if len(_ADDRESSES) >= 1024:
            _ADDRESSES.clear()
        scale, visible = _contiguous(cov.scale, np.float64), _contiguous(cov.visible, np.bool_)
        got = _ADDRESSES[id(cov)] = (cov, scale, visible, scale.ctypes.data, visible.ctypes.data)
    return got[3], got[4]


def _contiguous(a: np.ndarray, dtype) -> np.ndarray:
    """`a` as a C-contiguous array of `dtype` for C (itself where it is one already: a flag test, no call)."""
    return a if a.dtype == dtype and a.flags.c_contiguous else np.ascontiguousarray(a, dtype)
