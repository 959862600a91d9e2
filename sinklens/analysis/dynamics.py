"""Sink dynamics across denoising steps, per (layer, head) (paper §4.2).

Vocabulary and the exact rules used here:

- **largest sink** of a head at a step: the highest-scoring key flagged by Eq. 3 (none when no
  key is flagged). Movement is only measured where there is a sink: a *move* of the largest sink
  needs a sink at both steps ("the top-1 key changed" happens in untrained models too), and the
  old position must stop being a sink while the new one was none before; two standing sinks
  that swap rank are a *rank swap*, not a move (`largest_sink_changes`).
- **tracks**: the sinks of one head are linked from step t to step t+1 by this rule:
  1. a sink at the same position at t+1 continues its track (it *stays*);
  2. the remaining sinks of t and t+1 are paired greedily by smallest distance |p − q|
     (ties: the higher-scoring sink at t first, then the lower position), optionally only
     within `max_move` positions; each pair continues the track at the new position (a *move*);
  3. a sink at t with no partner ends its track (a *death* at t+1); a sink at t+1 with no
     partner starts a new track (a *birth*).
  So the number of sinks decides births/deaths, positions decide moves.
- **classification of a track** (T = number of steps in the trace), first rule that applies:
  1. `moving`: it changed position at least once;
  2. `static`: it lived at least `static_fraction · T` steps (default 0.5: "most of the steps");
  3. `vanishing`: it ended before the last step (short-lived, then gone);
  4. `transient`: short-lived and still present at the last step (born late).
- **head class**: `none` (no sink at any step), else `moving` if any of its tracks moved, else
  `static` if any track is static, else `vanishing`/`transient` (the most frequent of the two).
- **drift** of a move t → t+1 (positions p → q): signed distance q − p (negative = leftward),
  read against the unmasking frontier at t+1 (leftmost / rightmost still-masked position) and
  the generation blocks (LLaDA semi-autoregressive blocks of `block_length` after the prompt).
- **masked/unmasked split** at (step, layer, head): the query groups `masked` and `unmasked`
  (per-group received attention, Contract 4 `received_groups`) each have a largest Eq. 3 sink
  and the two sit at different positions. Group scores are put on the `sum` scale of a whole
  sequence: r^g_j · S_k / S_g (S_g = queries in group g = Σ_j r^g_j), i.e. multiples of uniform
  attention within the group, so the same ε applies.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sinklens.analysis.sinks import largest_sink

TRACK_KINDS = ("static", "moving", "vanishing", "transient")
MOVE_KEYS = ("moves", "rank_swaps", "vanish", "appear")   # events of the largest sink (largest_sink_moves)


@dataclass
class SinkTrack:
    """One sink followed across consecutive steps of one (layer, head). Steps are step indices."""

    layer: int
    head: int
    steps: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    kind: str = ""

    @property
    def start(self) -> int:
        return self.steps[0]

    @property
    def end(self) -> int:
        return self.steps[-1]

    @property
    def lifetime(self) -> int:
        return len(self.steps)

    @property
    def moves(self) -> int:
        return int(np.count_nonzero(np.diff(self.positions))) if len(self.positions) > 1 else 0

    def to_dict(self, num_steps: int) -> dict:
        return {"layer": self.layer, "head": self.head, "kind": self.kind, "start_step": self.start,
                "end_step": self.end, "lifetime_steps": self.lifetime, "moves": self.moves,
                "born": self.start > 0, "died": self.end < num_steps - 1,
                "positions": [int(p) for p in self.positions],
                "scores": [round(float(s), 4) for s in self.scores]}


def classify_track(track: SinkTrack, num_steps: int, static_fraction: float = 0.5) -> str:
    """The track's kind by the rule in this module's docstring."""
    return track_kind(track.moves > 0, track.lifetime, track.end, num_steps, static_fraction)


def track_kind(moved: bool, lifetime: int, end: int, num_steps: int, static_fraction: float = 0.5) -> str:
    """The kind of a track that moved or not, lived `lifetime` steps and ended at step index `end`."""
    if moved:
        return "moving"
    if lifetime >= static_fraction * num_steps:
        return "static"
    if end < num_steps - 1:
        return "vanishing"
    return "transient"


def _pair(prev: dict[int, float], new: dict[int, float], max_move: int | None) -> dict[int, int]:
    """Pairs (position at t -> position at t+1) by the linking rule (stays first, then nearest).

    Greedy by smallest distance on a line: the closest remaining (old, new) pair is always adjacent
    in the merged position order (anything between would be closer to one of them), so only
    adjacent pairs go on the heap — O(n log n) instead of all n·m candidate pairs."""
    import heapq

    pairs = {p: p for p in prev if p in new}
    items = sorted([(p, 0) for p in prev if p not in pairs] + [(q, 1) for q in new if q not in pairs])
    if not items:
        return pairs
    n = len(items)
    left, right, alive = list(range(-1, n - 1)), list(range(1, n + 1)), [True] * n
    heap: list[tuple] = []

    def push(i: int, j: int) -> None:
        if 0 <= i < n and 0 <= j < n and items[i][1] != items[j][1]:
            (a, sa), (b, _) = items[i], items[j]
            p, q = (a, b) if sa == 0 else (b, a)
            if max_move is None or abs(p - q) <= max_move:
                heapq.heappush(heap, (abs(p - q), -prev[p], p, q, i, j))

    for i in range(n - 1):
        push(i, i + 1)
    while heap:
        _, _, p, q, i, j = heapq.heappop(heap)
        if not (alive[i] and alive[j]):
            continue
        pairs[p] = q
        alive[i] = alive[j] = False
        lo, hi = left[i], right[j]             # unlink i..j (adjacent), join their neighbours
        if lo >= 0:
            right[lo] = hi
        if hi < n:
            left[hi] = lo
        push(lo, hi)
    return pairs


def track_sinks(per_step: list[tuple[np.ndarray, np.ndarray]], layer: int = 0, head: int = 0, *,
                max_move: int | None = None, static_fraction: float = 0.5) -> list[SinkTrack]:
    """Tracks of one head. per_step[t] = (positions, scores) of its sinks at step index t."""
    tracks: list[SinkTrack] = []
    open_: dict[int, SinkTrack] = {}  # position at the previous step -> its track
    for t, (pos, sc) in enumerate(per_step):
        now = {int(p): float(s) for p, s in zip(pos, sc)}
        prev = {p: tr.scores[-1] for p, tr in open_.items()}
        pairs = _pair(prev, now, max_move)
        nxt: dict[int, SinkTrack] = {}
        for p, q in pairs.items():
            tr = open_[p]
            tr.steps.append(t)
            tr.positions.append(q)
            tr.scores.append(now[q])
            nxt[q] = tr
        for q in sorted(set(now) - set(nxt)):
            tr = SinkTrack(layer, head, [t], [q], [now[q]])
            tracks.append(tr)
            nxt[q] = tr
        open_ = nxt
    for tr in tracks:
        tr.kind = classify_track(tr, len(per_step), static_fraction)
    tracks.sort(key=lambda tr: (tr.start, tr.positions[0]))
    return tracks


def head_class(tracks: list[SinkTrack]) -> str:
    """`none` / `moving` / `static` / `vanishing` / `transient` (rule in the module docstring)."""
    kinds = [tr.kind for tr in tracks]
    return class_of_kinds({k: kinds.count(k) for k in TRACK_KINDS})


def class_of_kinds(counts: dict) -> str:
    """A head's class from how many of its tracks are of each kind (rule in the module docstring)."""
    if not sum(counts.values()):
        return "none"
    for k in ("moving", "static"):
        if counts[k]:
            return k
    return "vanishing" if counts["vanishing"] >= counts["transient"] else "transient"


def largest_sink_changes(largest_pos: np.ndarray, sinks: dict) -> tuple[np.ndarray, np.ndarray]:
    """How the largest sink of each head changes between consecutive steps: (moved, swapped),
    each (T − 1, L, H) bool, over the step pairs where the head has a sink at both steps and
    its largest sink sits elsewhere at t + 1.

    moved    the old position is no sink at t + 1 and the new one was no sink at t: a sink left
             one position and appeared at another (a moving sink, as the paper means it)
    swapped  anything else: e.g. two standing sinks exchanged rank by a hair (not movement)
    largest_pos: (T, L, H), −1 = no sink; sinks: the analysis' sparse sink list (step, layer, head, pos)."""
    T, L, H = largest_pos.shape
    a, b = largest_pos[:-1], largest_pos[1:]
    change = (a >= 0) & (b >= 0) & (a != b)                                   # (T-1, L, H)
    S = int(max(largest_pos.max(), np.max(sinks["pos"], initial=0))) + 1
    key = lambda t, l, h, p: ((t.astype(np.int64) * L + l) * H + h) * S + p    # noqa: E731 one int per sink
    known = np.sort(key(sinks["step"], sinks["layer"], sinks["head"], sinks["pos"]))
    t, l, h = np.nonzero(change)
    old_stays = np.isin(key(t + 1, l, h, a[t, l, h]), known, assume_unique=True)
    new_was = np.isin(key(t, l, h, b[t, l, h]), known, assume_unique=True)
    moved, swapped = np.zeros_like(change), np.zeros_like(change)
    moved[t, l, h] = ~old_stays & ~new_was
    swapped[t, l, h] = old_stays | new_was
    return moved, swapped


def largest_sink_moves(positions: np.ndarray, moved: np.ndarray | None = None, swapped: np.ndarray | None = None) -> dict:
    """Events of the largest-sink series of one head, positions (T,) with −1 = no sink; moved /
    swapped (T − 1,) from `largest_sink_changes` (without them every position change is a move)."""
    p = np.asarray(positions)
    a, b = p[:-1], p[1:]
    both = (a >= 0) & (b >= 0)
    if moved is None:
        moved, swapped = both & (a != b), np.zeros(a.shape, bool)
    return {"steps_with_sink": int((p >= 0).sum()),
            "moves": int(moved.sum()),                        # a sink left its position for a new one
            "rank_swaps": int(swapped.sum()),                 # standing sinks exchanged the top rank
            "vanish": int(((a >= 0) & (b < 0)).sum()),          # sink at t, none at t+1
            "appear": int(((a < 0) & (b >= 0)).sum()),
            "distinct_positions": int(np.unique(p[p >= 0]).size)}


class DynamicsCounts:
    """The dynamics counts of a corpus part (sinklens/analysis/corpus.py `dynamics_part`), folded step
    by step with the same rules as `track_sinks` and `largest_sink_changes`, keeping O(L·H·S): per head
    its open tracks (position -> start, steps lived, moved, last score), the steps lived by the ended
    tracks that never moved and may still count as static (those shorter than static_fraction × the
    steps so far never can: at most S / static_fraction remain), and the previous step's sinks."""

    def __init__(self, num_layers: int, num_heads: int, *, max_move: int | None = None, static_fraction: float = 0.5):
        L, H = num_layers, num_heads
        self.max_move, self.fraction = max_move, static_fraction
        self.open: dict[tuple[int, int], dict[int, list]] = {}       # (l, h) -> {pos: [start, lifetime, moved, score]}
        self.ended: dict[tuple[int, int], list[int]] = {}            # (l, h) -> lifetimes of unmoved ended tracks
        self.kinds = {k: np.zeros((L, H), np.int64) for k in TRACK_KINDS}
        self.births, self.deaths = np.zeros((L, H), np.int64), np.zeros((L, H), np.int64)
        self.events = {m: np.zeros((L, H), np.int64) for m in MOVE_KEYS}
        self.prev_largest, self.prev_flagged = None, None
        self.t = 0

    def add(self, largest_pos: np.ndarray, flagged: np.ndarray, scores: np.ndarray) -> None:
        """One step: largest_pos (L, H) (−1 none), flagged (L, H, S) Eq. 3 sinks, scores (L, H, S)."""
        t = self.t
        l_, h_, j_ = np.nonzero(flagged)                                   # by head, then position
        sc = scores[l_, h_, j_].astype(np.float32)                         # as the sparse sink list keeps them
        now: dict[tuple[int, int], dict[int, float]] = {}
        for l, h, j, s in zip(l_.tolist(), h_.tolist(), j_.tolist(), sc.tolist()):
            now.setdefault((l, h), {})[j] = s
        for head in set(self.open) | set(now):
            self._link(head, now.get(head, {}), t)
        if self.prev_largest is not None:
            self._largest(self.prev_largest, largest_pos, self.prev_flagged, flagged)
        self.prev_largest, self.prev_flagged = largest_pos, flagged
        self.t += 1
        for head, lives in list(self.ended.items()):                       # too short to be static, whatever T is
            keep = [n for n in lives if n >= self.fraction * self.t]
            self.kinds["vanishing"][head] += len(lives) - len(keep)
            self.ended[head] = keep

    def _link(self, head: tuple[int, int], now: dict[int, float], t: int) -> None:
        open_ = self.open.get(head, {})
        pairs = _pair({p: tr[3] for p, tr in open_.items()}, now, self.max_move)
        nxt = {}
        for p, q in pairs.items():
            tr = open_[p]
            tr[1] += 1
            tr[2] = tr[2] or q != p
            tr[3] = now[q]
            nxt[q] = tr
        for p, tr in open_.items():
            if p not in pairs:                                             # ended at t − 1: a death
                self.deaths[head] += 1
                if tr[2]:
                    self.kinds["moving"][head] += 1
                else:
                    self.ended.setdefault(head, []).append(tr[1])
        for q in sorted(set(now) - set(nxt)):
            nxt[q] = [t, 1, False, now[q]]
            self.births[head] += t > 0
        if nxt:
            self.open[head] = nxt
        else:
            self.open.pop(head, None)

    def _largest(self, a: np.ndarray, b: np.ndarray, flagged_a: np.ndarray, flagged_b: np.ndarray) -> None:
        """largest_sink_changes + largest_sink_moves for one pair of steps (t − 1, t)."""
        change = (a >= 0) & (b >= 0) & (a != b)
        old_stays = _at(flagged_b, a) & change                             # the old position is still a sink
        new_was = _at(flagged_a, b) & change                               # the new one already was
        self.events["moves"] += change & ~old_stays & ~new_was
        self.events["rank_swaps"] += old_stays | new_was
        self.events["vanish"] += (a >= 0) & (b < 0)
        self.events["appear"] += (a < 0) & (b >= 0)

    def part(self) -> dict:
        """dynamics_part of the steps so far."""
        T = self.t
        kinds = {k: v.copy() for k, v in self.kinds.items()}
        for head, lives in self.ended.items():
            for n in lives:
                kinds[track_kind(False, n, 0, T, self.fraction)][head] += 1     # ended: end < T − 1
        for head, open_ in self.open.items():
            for start, n, moved, _ in open_.values():
                kinds[track_kind(moved, n, T - 1, T, self.fraction)][head] += 1
        out = {f"tracks_{k}": kinds[k] for k in TRACK_KINDS}
        out.update(births=self.births, deaths=self.deaths, **{f"largest_{m}": self.events[m] for m in MOVE_KEYS})
        out["head_classes"] = {}
        L, H = self.births.shape
        for l in range(L):
            for h in range(H):
                c = class_of_kinds({k: int(kinds[k][l, h]) for k in TRACK_KINDS})
                out["head_classes"][c] = out["head_classes"].get(c, 0) + 1
        return out


def _at(flagged: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """(L, H) flagged[l, h, pos[l, h]], False where pos is −1 or beyond the step's keys."""
    ok = (pos >= 0) & (pos < flagged.shape[-1])
    return np.take_along_axis(flagged, np.where(ok, pos, 0)[..., None], axis=-1)[..., 0] & ok


@dataclass
class DriftEvent:
    """A move of a tracked sink from step index t to t+1, read against the unmasking frontier."""

    layer: int
    head: int
    step: int                 # index of the step the sink moved *to*
    from_pos: int
    to_pos: int
    frontier_left: int        # leftmost masked position at `step` (−1: nothing masked)
    frontier_right: int       # rightmost masked position at `step` (−1: nothing masked)
    to_masked: bool           # the new position holds a mask token at `step`
    from_block: int | None    # generation block of the old position (−1 = prompt; None = no blocks)
    to_block: int | None

    @property
    def distance(self) -> int:
        return self.to_pos - self.from_pos   # signed, negative = leftward

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("layer", "head", "step", "from_pos", "to_pos", "frontier_left",
                                           "frontier_right", "to_masked", "from_block", "to_block")}
        d.update(distance=self.distance, direction="left" if self.distance < 0 else "right",
                 to_minus_frontier_right=(self.to_pos - self.frontier_right) if self.frontier_right >= 0 else None)
        return {k: (int(v) if isinstance(v, (np.integer,)) else bool(v) if isinstance(v, np.bool_) else v)
                for k, v in d.items()}


def block_of(pos: int, block_length: int | None, prompt_length: int | None) -> int | None:
    if not block_length or prompt_length is None:
        return None
    return -1 if pos < prompt_length else (pos - prompt_length) // block_length


def drift_events(tracks: list[SinkTrack], is_masked: np.ndarray, *, block_length: int | None = None,
                 prompt_length: int | None = None) -> list[DriftEvent]:
    """Every move of every track; is_masked (T, S_max) bool mask state per step index."""
    any_masked = is_masked.any(axis=1)                                            # (T,)
    first = np.where(any_masked, is_masked.argmax(axis=1), -1)                    # leftmost masked
    last = np.where(any_masked, is_masked.shape[1] - 1 - is_masked[:, ::-1].argmax(axis=1), -1)
    out = []
    for tr in tracks:
        for i in range(1, tr.lifetime):
            p, q, t = tr.positions[i - 1], tr.positions[i], tr.steps[i]
            if p == q:
                continue
            out.append(DriftEvent(tr.layer, tr.head, t, p, q, int(first[t]), int(last[t]), bool(is_masked[t, q]),
                                  block_of(p, block_length, prompt_length), block_of(q, block_length, prompt_length)))
    return out


def drift_summary(events: list[DriftEvent]) -> dict:
    """Direction and distance of all moves (units: positions)."""
    if not events:
        return {"moves": 0}
    d = np.array([e.distance for e in events])
    fr = [e for e in events if e.frontier_right >= 0]
    blocks = [e for e in events if e.from_block is not None]
    out = {"moves": int(d.size), "fraction_leftward": float((d < 0).mean()),
           "mean_distance_positions": float(d.mean()), "mean_abs_distance_positions": float(np.abs(d).mean()),
           "fraction_to_masked_token": float(np.mean([e.to_masked for e in events]))}
    if fr:
        out["mean_to_minus_frontier_right_positions"] = float(np.mean([e.to_pos - e.frontier_right for e in fr]))
        out["fraction_to_rightmost_masked"] = float(np.mean([e.to_pos == e.frontier_right for e in fr]))
    if blocks:
        out["fraction_crossing_block_boundary"] = float(np.mean([e.from_block != e.to_block for e in blocks]))
    return out


def drift_line(d: dict) -> str:
    """`drift_summary` as one sentence for a reader (the page's Summary, summary.md)."""
    n = d.get("moves", 0)
    if not n:
        return "no move of the largest sink"
    pct = lambda x: f"{100 * x:.0f} %"   # noqa: E731
    out = (f"{n} move{'s' if n != 1 else ''} of the largest sink: {pct(d['fraction_leftward'])} leftward, "
           f"{d['mean_abs_distance_positions']:.3g} positions on average (signed mean "
           f"{d['mean_distance_positions']:+.3g}); {pct(d['fraction_to_masked_token'])} onto a masked token")
    if "fraction_to_rightmost_masked" in d:
        out += f", {pct(d['fraction_to_rightmost_masked'])} onto the rightmost masked one"
    if "fraction_crossing_block_boundary" in d:
        out += f"; {pct(d['fraction_crossing_block_boundary'])} cross a block boundary"
    return out


@dataclass
class SplitEvent:
    """At (step, layer, head) masked and unmasked queries attend to different largest sinks."""

    step: int
    layer: int
    head: int
    masked_pos: int
    unmasked_pos: int
    masked_score: float
    unmasked_score: float

    def to_dict(self) -> dict:
        return {k: (round(float(v), 4) if isinstance(v, float) else int(v)) for k, v in self.__dict__.items()}


def group_scores(received_groups: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """(G, L, H, S) per-group column sums -> the rule's `scaled_sum` within each group:
    r^g_j · K / S_g, K = the layer's visible keys (`visible` (L, S)), S_g = Σ_j r^g_j = the
    group's queries (0 for an empty group)."""
    vis = visible[None, :, None, :]                       # (1, L, 1, S)
    rg = np.where(vis, received_groups, 0.0)
    n_q = rg.sum(axis=-1, keepdims=True)                 # (G, L, H, 1) queries per group
    out = np.zeros_like(rg)
    np.divide(rg * visible.sum(-1)[None, :, None, None], n_q, out=out, where=n_q > 0.5)
    return out


def split_events(step: int, received_groups: np.ndarray, group_names, visible: np.ndarray,
                 eps: float) -> list[SplitEvent]:
    """Splits at one step (rule in the module docstring); [] when the groups are not recorded.
    visible: (L, S) keys the step's queries could see (rule/np_rule.py)."""
    names = list(group_names)
    if received_groups is None or "masked" not in names or "unmasked" not in names:
        return []
    g = group_scores(received_groups, visible)
    keys = visible[:, None, :]                                                 # (L, 1, S)
    pos_m, sc_m = largest_sink(g[names.index("masked")], eps, keys)          # (L, H)
    pos_u, sc_u = largest_sink(g[names.index("unmasked")], eps, keys)
    hit = (pos_m >= 0) & (pos_u >= 0) & (pos_m != pos_u)
    return [SplitEvent(step, int(l), int(h), int(pos_m[l, h]), int(pos_u[l, h]), float(sc_m[l, h]), float(sc_u[l, h]))
            for l, h in zip(*np.nonzero(hit))]
