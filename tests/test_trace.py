"""Trace file: round trip, truncation, foreign / other-version / corrupt files, plain-pyarrow access."""
import json

import numpy as np
import pyarrow as pa
import pytest

import sinklens
from sinklens.trace import SCHEMA_VERSION, TraceFormatError, TraceWriter, open_trace
from sinklens.trace.schema import build_schema

B, L, H, S, G, T = 2, 3, 4, 10, 2, 5


def _steps(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for t in range(T):
        out.append(dict(
            tokens=rng.integers(0, 500, (B, S)),
            is_masked=rng.random((B, S)) < 0.5,
            revealed=rng.random((B, S)) < 0.2,
            attention_mask=np.array([[False] * 2 + [True] * (S - 2), [True] * S]),
            received=rng.random((B, L, H, S)) * S,
            received_groups=rng.random((B, G, L, H, S)) * S,
            blocked=rng.random((B, L, H, S)) < 0.05,
            maps={(1, 2): rng.random((B, S, S)), (0, 0): rng.random((B, S, S))},
        ))
    return out


def _write(path, steps, dtype="float16", close=True, **writer_args):
    meta = {"family": "llada", "sampler": {"name": "llada", "args": {"steps": T}}, "prompt": "hi",
            "query_groups": ["masked", "unmasked"], "seed": 7}
    w = TraceWriter(path, meta, received_dtype=dtype, decode=lambda ids: [f"tok{i}" for i in ids], **writer_args)
    for t, s in enumerate(steps):
        w.write_step(t, **s)
    if close:
        w.close()
    else:
        w.abandon()
    return w


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_round_trip(tmp_path, dtype):
    steps = _steps()
    path = tmp_path / "t.arrow"
    _write(path, steps, dtype)
    t = sinklens.open_trace(path)
    assert not t.truncated
    assert (t.num_steps, t.num_layers, t.num_heads, t.batch_size, t.seq_len) == (T, L, H, B, S)
    m = t.meta
    assert m["schema_version"] == SCHEMA_VERSION and m["units"] == "sum" and m["received_dtype"] == dtype
    assert m["sampler"] == {"name": "llada", "args": {"steps": T}} and m["prompt"] == "hi" and m["seed"] == 7
    np_dtype = np.float16 if dtype == "float16" else np.float32
    for step, s in enumerate(steps):
        for row in range(B):
            np.testing.assert_array_equal(t.tokens(step, row), s["tokens"][row])
            np.testing.assert_array_equal(t.is_masked(step, row), s["is_masked"][row])
            np.testing.assert_array_equal(t.revealed(step, row), s["revealed"][row])
            np.testing.assert_array_equal(t.attention_mask(step, row), s["attention_mask"][row])
            np.testing.assert_array_equal(t.query_positions(step, row), np.flatnonzero(s["attention_mask"][row]))
            rec = t.received(step, row)
            assert rec.dtype == np.float32 and rec.shape == (L, H, S)
            np.testing.assert_array_equal(rec, s["received"][row].astype(np_dtype).astype(np.float32))
            np.testing.assert_array_equal(t.received_groups(step, row),
                                          s["received_groups"][row].astype(np_dtype).astype(np.float32))
            np.testing.assert_array_equal(t.blocked(step, row), np.argwhere(s["blocked"][row]))
            np.testing.assert_array_equal(t.map(step, 1, 2, row), s["maps"][(1, 2)][row].astype(np.float32))
    with pytest.raises(KeyError, match=r"\(0, 0\), \(1, 2\)"):
        t.map(0, 2, 2)
    with pytest.raises(KeyError, match="step 99"):
        t.tokens(99)
    allr = t.received_all(row=1, layers=[2], heads=[0, 3])
    assert allr.shape == (T, 1, 2, S)
    np.testing.assert_array_equal(allr[3], steps[3]["received"][1][[2]][:, [0, 3]].astype(np_dtype).astype(np.float32))
    # the vocabulary covers every id of every step (later ids come from per-batch metadata)
    ids = np.unique(np.concatenate([s["tokens"].ravel() for s in steps]))
    assert t.decode(ids) == [f"tok{i}" for i in ids]


@pytest.mark.parametrize("flush_steps", [1, 2, T])
def test_steps_read_the_same_whatever_the_record_batches(tmp_path, flush_steps):
    """Schema 3 writes one record batch per group of steps (schema 1 and 2: one per step, as
    flush_steps=1 still does): every step's cells, its new token strings and the checksums read the
    same either way, and a group's steps share one batch."""
    steps = _steps()
    path = tmp_path / "t.arrow"
    _write(path, steps, flush_steps=flush_steps)
    with pa.OSFile(str(path), "rb") as f:
        assert sum(1 for _ in pa.ipc.open_stream(f)) == -(-T // flush_steps)
    t = open_trace(path)
    t.verify()
    assert t.steps == list(range(T))
    for step, s in enumerate(steps):
        for row in range(B):
            np.testing.assert_array_equal(t.tokens(step, row), s["tokens"][row])
            np.testing.assert_array_equal(t.blocked(step, row), np.argwhere(s["blocked"][row]))
            np.testing.assert_array_equal(t.received(step, row), s["received"][row].astype(np.float16).astype(np.float32))
            assert t.decode(s["tokens"][row]) == [f"tok{i}" for i in s["tokens"][row]]
        with pytest.raises(IndexError, match="batch size 2"):
            t.tokens(step, B)


def test_float16_is_half_the_bytes(tmp_path):
    steps = _steps()
    _write(tmp_path / "a.arrow", steps, "float16")
    _write(tmp_path / "b.arrow", steps, "float32")
    assert (tmp_path / "a.arrow").stat().st_size < (tmp_path / "b.arrow").stat().st_size


def test_plain_pyarrow_reads_it(tmp_path):
    steps = _steps()
    _write(tmp_path / "t.arrow", steps)
    table = pa.ipc.open_stream(str(tmp_path / "t.arrow")).read_all()
    assert table.num_rows == T * B
    meta = json.loads(table.schema.metadata[b"sinklens"])
    rec = np.asarray(table.column("received")[2 * B + 1].values, dtype=np.float32).reshape(meta["num_layers"], meta["num_heads"], -1)
    np.testing.assert_array_equal(rec, steps[2]["received"][1].astype(np.float16).astype(np.float32))


def test_cut_in_the_middle_keeps_complete_steps(tmp_path):
    """A file cut anywhere keeps every step written before the cut (here each step is written as it
    ends, flush_steps=1, as a step slower than the flush bound is: a group is one record batch)."""
    steps = _steps()
    path = tmp_path / "t.arrow"
    _write(path, steps, flush_steps=1)
    data = path.read_bytes()
    sizes = []  # file size after each step, measured by writing prefixes
    for k in range(1, T + 1):
        p = tmp_path / f"p{k}.arrow"
        _write(p, steps[:k], close=False, flush_steps=1)
        sizes.append(p.stat().st_size)
    for cut_after in range(T):  # cut in the middle of step `cut_after`
        lo = sizes[cut_after - 1] if cut_after else sizes[0] // 4
        cut = (lo + sizes[cut_after]) // 2
        (tmp_path / "cut.arrow").write_bytes(data[:cut])
        t = open_trace(tmp_path / "cut.arrow")
        assert t.truncated
        assert t.num_steps == cut_after
        if cut_after:
            np.testing.assert_array_equal(t.tokens(cut_after - 1, 1), steps[cut_after - 1]["tokens"][1])
        t.close()
    # a run that stopped between steps (no end-of-stream marker) also reads as truncated
    t = open_trace(tmp_path / "p3.arrow")
    assert t.truncated and t.num_steps == 3


def test_interrupted_run_inside_with_block_is_truncated(tmp_path):
    steps = _steps()
    with pytest.raises(RuntimeError, match="boom"):
        with TraceWriter(tmp_path / "t.arrow", {}) as w:
            w.write_step(0, **steps[0])
            w.write_step(1, **steps[1])
            raise RuntimeError("boom")
    t = open_trace(tmp_path / "t.arrow")
    assert t.truncated and t.steps == [0, 1]


def test_other_schema_version_is_a_clear_error(tmp_path):
    schema = build_schema({"schema_version": SCHEMA_VERSION + 1})
    path = tmp_path / "v2.arrow"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, schema):
        pass
    with pytest.raises(TraceFormatError, match=rf"schema_version {SCHEMA_VERSION + 1}.*schema_version 1, 2 or 3\)"):
        open_trace(path)


def test_schema2_stores_received_only_when_not_the_sum_of_groups(tmp_path):
    """Lean traces: with the masked / unmasked split, received is derivable and not stored; the
    reader still returns it. A received that is not the sum (other query rows) is kept."""
    rng = np.random.default_rng(3)
    groups = rng.random((B, G, L, H, S)).astype(np.float32)
    lean, full = tmp_path / "lean.arrow", tmp_path / "full.arrow"
    for path, received in ((lean, groups.sum(1)), (full, groups.sum(1) + 1.0)):
        with TraceWriter(path, {}) as w:
            for t in range(T):
                w.write_step(t, tokens=np.zeros((B, S), int), received=received, received_groups=groups)
    t_lean, t_full = open_trace(lean), open_trace(full)
    assert t_lean.table().column("received").null_count == B * T
    assert t_full.table().column("received").null_count == 0
    for row in range(B):
        np.testing.assert_allclose(t_lean.received(2, row), groups[row].astype(np.float16).astype(np.float32).sum(0))
        np.testing.assert_array_equal(t_full.received(2, row), (groups[row].sum(0) + 1).astype(np.float16).astype(np.float32))
    # bytes per step ~ the float16 bound of what is stored: G arrays of L*H*S, not G + 1
    bound = T * B * G * L * H * S * 2
    assert lean.stat().st_size < full.stat().st_size
    assert t_lean.table().column("received_groups").nbytes <= 1.05 * bound + T * B * 8


def test_schema1_traces_still_read(tmp_path):
    """A version-1 trace (received always stored) reads as before."""
    path = tmp_path / "v1.arrow"
    rng = np.random.default_rng(4)
    received = rng.random((B, L, H, S))
    with TraceWriter(path, {}) as w:
        w.meta["schema_version"] = 1
        w.write_step(0, tokens=np.zeros((B, S), int), received=received)
    t = open_trace(path)
    assert t.meta["schema_version"] == 1
    np.testing.assert_array_equal(t.received(0, 1), received[1].astype(np.float16).astype(np.float32))


def test_foreign_and_corrupt_files_are_clear_errors(tmp_path):
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"this is not arrow at all" * 10)
    with pytest.raises(TraceFormatError, match="not an Arrow IPC stream"):
        open_trace(junk)
    foreign = tmp_path / "foreign.arrow"
    with pa.OSFile(str(foreign), "wb") as f, pa.ipc.new_stream(f, pa.schema([("x", pa.int32())])):
        pass
    with pytest.raises(TraceFormatError, match="not a sinklens trace"):
        open_trace(foreign)
    # a closed file (end marker present) whose middle was overwritten is corrupt, not truncated
    path = tmp_path / "t.arrow"
    _write(path, _steps())
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="corrupt"):  # found when the damaged step is read
        t = open_trace(path)
        for step in t.steps:
            t.received(step, 1)
    with pytest.raises(TraceFormatError, match="corrupt"):
        open_trace(path).verify()
    with pytest.raises(FileNotFoundError):
        open_trace(tmp_path / "missing.arrow")


def test_bad_shapes_are_clear_errors(tmp_path):
    w = TraceWriter(tmp_path / "t.arrow", {})
    with pytest.raises(ValueError, match="is_masked must have shape"):
        w.write_step(0, np.zeros((2, 5), int), is_masked=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="received must have shape"):
        w.write_step(0, np.zeros((2, 5), int), received=np.zeros((2, 3, 4, 6)))
    with pytest.raises(TypeError, match="JSON-serialisable"):
        TraceWriter(tmp_path / "u.arrow", {"x": object()}).write_step(0, np.zeros((1, 3), int))


def test_steps_reach_the_disk_in_groups_and_an_error_keeps_them(tmp_path):
    """Steps are written in groups (flush_steps / flush_seconds): what is on disk before the end is
    every finished group, a writer with flush_seconds=0 (a step slower than the bound) writes each
    step at once, and abandoning after an error writes the steps still held."""
    steps = _steps()
    path = tmp_path / "t.arrow"
    w = TraceWriter(path, {}, flush_steps=2, flush_seconds=3600)
    on_disk = []
    for t, s in enumerate(steps):
        w.write_step(t, **s)
        on_disk.append(open_trace(path).num_steps if path.stat().st_size else 0)  # Arrow writes the schema with the first batch
    assert on_disk == [0, 2, 2, 4, 4]
    w.abandon()
    t = open_trace(path)
    assert t.truncated and t.steps == list(range(T))
    np.testing.assert_array_equal(t.tokens(4, 1), steps[4]["tokens"][1])

    w = TraceWriter(tmp_path / "u.arrow", {}, flush_seconds=0.0)
    for t, s in enumerate(steps):
        w.write_step(t, **s)
        assert open_trace(tmp_path / "u.arrow").num_steps == t + 1
    w.close()


def test_a_step_held_in_memory_is_not_changed_by_the_callers_buffers(tmp_path):
    """A step waits in memory for its group: the caller may reuse its arrays (a sampler's tensor,
    a numpy buffer) for the next step without changing what the trace holds."""
    steps = _steps()
    tokens, received = steps[0]["tokens"].copy(), steps[0]["received"].copy()
    with TraceWriter(tmp_path / "t.arrow", {}) as w:
        for t in range(3):
            tokens[:] = steps[t]["tokens"]
            received[:] = steps[t]["received"]
            w.write_step(t, tokens=tokens, received=received)
    t = open_trace(tmp_path / "t.arrow")
    for step in range(3):
        np.testing.assert_array_equal(t.tokens(step, 1), steps[step]["tokens"][1])
        np.testing.assert_array_equal(t.received(step, 0), steps[step]["received"][0].astype(np.float16).astype(np.float32))


def test_a_trace_holds_only_the_readout_columns_its_run_records(tmp_path):
    """The schema has a mechanism-readout column only where the run records it (declared in the
    metadata's `readouts`, or present at the first step): a plain trace has none, and the reader
    answers None for an absent column as for one never written. A readout first given after the
    first step of an undeclared run is refused in one line."""
    from sinklens.trace.readouts import COLUMN_NAMES

    steps = _steps()
    plain = tmp_path / "plain.arrow"
    _write(plain, steps)
    t = open_trace(plain)
    assert not set(COLUMN_NAMES) & set(t.schema.names)
    assert t.readout("value_norm", 0) is None and t.readouts(0) == {}

    declared = tmp_path / "declared.arrow"
    w = TraceWriter(declared, {"readouts": {"diagonal": True}})
    diag = np.arange(B * L * H, dtype=np.float32).reshape(B, L, H)
    for step, s in enumerate(steps):
        w.write_step(step, s["tokens"], received=s["received"], readouts={"diagonal": diag + step})
    w.close()
    t = open_trace(declared)
    assert [n for n in COLUMN_NAMES if n in t.schema.names] == ["diagonal"]
    np.testing.assert_array_equal(t.readout("diagonal", 3, 1), diag[1] + 3)

    late = TraceWriter(tmp_path / "late.arrow", {})
    late.write_step(0, steps[0]["tokens"], received=steps[0]["received"])
    with pytest.raises(ValueError, match=r"\['diagonal'\] were not recorded at the first step"):
        late.write_step(1, steps[1]["tokens"], received=steps[1]["received"], readouts={"diagonal": diag})


# ---- a sampler's steps (the writer as the sampler's hook: `after_step`) --------------------------

def _events(seed=0, steps=T, grow=False, name_rows=True, split=True):
    """StepEvents as a sampler hands them over: (B, S) canvas tensors, a request whose captures were
    recorded layer by layer (received, the masked / unmasked groups, what blocking took, maps, a
    learned sink, two readouts), padding in row 0, the query rows named per row. grow: step t's
    canvas is S + t long (an ARM's canvas gains a token a step); name_rows=False: no query rows named
    (the real positions are the rows); split=False: no query groups (an ARM's trace: received stored
    at every step)."""
    import torch

    from sinklens.attention.request import AttentionRequest
    from sinklens.samplers.capture import masked_unmasked_groups
    from sinklens.samplers.hooks import StepEvent

    g = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        S = globals()["S"] + (t if grow else 0)
        real = torch.tensor([[False] * 2 + [True] * (S - 2), [True] * S])
        is_masked = torch.rand(B, S, generator=g) < 0.5
        # every other step a query row is in no group: received is then not the groups' sum and is
        # stored; else the file leaves it out
        query_groups = masked_unmasked_groups(is_masked, real)
        query_groups[1, -1] = -1 if t % 2 else query_groups[1, -1]
        req = AttentionRequest(capture=True, map_slices=((1, 2),), query_mask=real,
                               query_groups=query_groups if split else None, num_groups=G if split else 0)
        req.blocked = torch.rand(L, B, H, S, generator=g) < 0.1
        for layer in range(L):
            groups = torch.rand(B, G, H, S, generator=g)
            received = groups.sum(1) + (0.5 if t % 2 else 0.0)
            req.record(layer, received=received, unblocked=received + 1, groups=groups if split else None,
                       maps={2: torch.rand(B, S, S, generator=g)} if layer == 1 else None,
                       learned_sink=torch.rand(B, H, generator=g))
            req.record_readout("value_norm", layer, torch.rand(B, H, S, generator=g))
            req.record_readout("diagonal", layer, torch.rand(B, H, generator=g), aligned=False)
        out.append(StepEvent(step=t, tokens=torch.randint(0, 500, (B, S), generator=g),
                             is_masked=is_masked, revealed=torch.rand(B, S, generator=g) < 0.2,
                             logits=None, attention=req, attention_mask=real,
                             query_positions=[torch.nonzero(r).squeeze(1) for r in real] if name_rows else None,
                             edited=torch.rand(B, S, generator=g) < 0.1))
    return out


def _traced(path, events, hook=True, **writer_args):
    from sinklens.trace.writer import event_arrays

    meta = {"family": "llada", "query_groups": ["masked", "unmasked"], "readouts": {"value_norms": True, "diagonal": True}}
    with TraceWriter(path, meta, decode=lambda ids: [f"tok{i}" for i in ids], **writer_args) as w:
        for e in events:
            w.after_step(e) if hook else w.write_step(e.step, **event_arrays(e))
    return path


@pytest.mark.parametrize("grow,name_rows,split", [(False, True, True), (True, True, True), (True, False, True),
                                                  (True, True, False)],
                         ids=["one-length", "growing", "growing-real-rows", "growing-no-groups"])
@pytest.mark.parametrize("flush_steps", [1, 2, T])
def test_a_samplers_steps_are_written_as_write_step_writes_them(tmp_path, flush_steps, grow, name_rows, split):
    """The hook holds a sampler's tensors and converts a whole group when it writes it (steps of one
    length: one stack per column; steps whose canvas grows, as an ARM's: one concatenation); the file
    is the one `write_step` writes from the same steps converted one by one, byte for byte: every
    column (received left out exactly where it is the groups' sum), the token strings, the record
    batches and their checksums."""
    events = _events(grow=grow, name_rows=name_rows, split=split)
    held = _traced(tmp_path / "held.arrow", events, flush_steps=flush_steps)
    each = _traced(tmp_path / "each.arrow", events, hook=False, flush_steps=flush_steps)
    assert held.read_bytes() == each.read_bytes()
    t = open_trace(held)
    t.verify()
    # received is left out at the steps where it is the groups' sum (without groups: never)
    assert t.table().column("received").null_count == (B * len(range(0, T, 2)) if split else 0)
    e = events[3]
    if split:
        np.testing.assert_array_equal(t.received_groups(3, 1), e.attention.received_groups[:, 1].transpose(0, 1)
                                      .numpy().astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(t.blocked(3, 0), np.argwhere(e.attention.blocked[:, 0].numpy()))
    np.testing.assert_array_equal(t.query_positions(3, 0), np.arange(2, e.tokens.shape[1]))
    np.testing.assert_array_equal(t.edited(3, 1), e.edited[1].numpy())
    np.testing.assert_array_equal(t.readout("diagonal", 3, 1), e.attention.readout("diagonal")[:, 1].numpy())
    np.testing.assert_array_equal(t.map(3, 1, 2, 1), e.attention.maps[(1, 2)][1].numpy())
    for e in events:   # each step as the sampler held it, at its own length
        for row in range(B):
            np.testing.assert_array_equal(t.tokens(e.step, row), e.tokens[row].numpy())
            np.testing.assert_array_equal(t.is_masked(e.step, row), e.is_masked[row].numpy())
            if e.step % 2 or not split:   # stored (where it is the groups' sum the reader sums the groups)
                np.testing.assert_array_equal(t.received(e.step, row), e.attention.received[:, row].numpy()
                                              .astype(np.float16).astype(np.float32))


def test_a_held_step_is_not_changed_by_the_sampler_changing_its_tensors(tmp_path):
    """A step waits in memory for its group, but a sampler may change its canvas (and a hook its
    request) in place at the next step: the trace holds what the step had."""
    import torch

    events = _events(seed=1, steps=2)
    with TraceWriter(tmp_path / "t.arrow", {}) as w:
        for e in events:
            w.after_step(e)
            snapshot = {name: getattr(e, name).clone() for name in ("tokens", "is_masked", "revealed", "attention_mask")}
            received, groups = e.attention.received.clone(), e.attention.received_groups.clone()
            for name in snapshot:
                getattr(e, name).fill_(1)
            e.query_positions[0].fill_(0)
            e.attention.blocked.fill_(True)
            for layer in range(L):          # a request reused: the next forward records anew into it
                e.attention.record(layer, received=torch.full((B, H, S), 7.0), groups=torch.ones(B, G, H, S))
            e.snapshot, e.received_at_step, e.groups_at_step = snapshot, received, groups
    t = open_trace(tmp_path / "t.arrow")
    for e in events:
        for name, value in e.snapshot.items():
            np.testing.assert_array_equal(getattr(t, name)(e.step, 0), value[0].numpy())
        np.testing.assert_array_equal(t.query_positions(e.step, 0), np.arange(2, S))
        assert len(t.blocked(e.step, 1)) < L * H * S
        np.testing.assert_array_equal(t.received_groups(e.step, 1), e.groups_at_step[:, 1].transpose(0, 1)
                                      .numpy().astype(np.float16).astype(np.float32))
        if e.step % 2:  # stored (not the groups' sum): the values of the step
            np.testing.assert_array_equal(t.received(e.step, 1),
                                          e.received_at_step[:, 1].numpy().astype(np.float16).astype(np.float32))


def test_a_canvas_tensor_passed_again_is_held_as_it_was_at_each_step(tmp_path):
    """Samplers pass some canvas tensors (the padding mask, a canvas edited in place) as the same
    object step after step; the writer keeps one copy while such a tensor is unchanged, and each
    step's own values once it changes in place."""
    import torch

    events = _events(seed=2, steps=4)
    shared, tokens = events[0].attention_mask.clone(), events[0].tokens.clone()
    expected_mask, expected_tokens = [], []
    with TraceWriter(tmp_path / "t.arrow", {}) as w:
        for t, e in enumerate(events):
            if t == 2:                     # changed in place between steps
                shared[0, :3] = True
                tokens[1, 0] += 1
            e.attention_mask, e.tokens = shared, tokens
            expected_mask.append(shared.clone())
            expected_tokens.append(tokens.clone())
            w.after_step(e)
        tokens.fill_(0)                    # after the last step: nothing held may change
        shared.fill_(False)
    trace = open_trace(tmp_path / "t.arrow")
    for t in range(4):
        for row in range(B):
            np.testing.assert_array_equal(trace.attention_mask(t, row), expected_mask[t][row].numpy())
            np.testing.assert_array_equal(trace.tokens(t, row), expected_tokens[t][row].numpy())
    assert not np.array_equal(trace.attention_mask(1, 0), trace.attention_mask(2, 0))


def test_a_samplers_held_steps_reach_the_disk_by_group_time_and_bytes(tmp_path, monkeypatch):
    """What is on disk while a run goes on (what a kill -9 leaves): every finished group; each step at
    once where steps are slower than flush_seconds or where the held captures pass FLUSH_BYTES; an
    error writes the steps still held."""
    from sinklens.trace import writer

    events = _events(seed=2)

    def on_disk_after_each_step(path, **writer_args):
        w, seen = TraceWriter(path, {}, **writer_args), []
        for e in events:
            w.after_step(e)
            seen.append(open_trace(path).num_steps if path.stat().st_size else 0)
        return w, seen

    w, seen = on_disk_after_each_step(tmp_path / "a.arrow", flush_steps=2, flush_seconds=3600)
    assert seen == [0, 2, 2, 4, 4]
    w.abandon()
    t = open_trace(tmp_path / "a.arrow")
    assert t.truncated and t.steps == list(range(T))
    assert on_disk_after_each_step(tmp_path / "b.arrow", flush_seconds=0.0)[1] == [1, 2, 3, 4, 5]
    req = events[0].attention   # what a step holds: its captures (the canvas is a few bytes)
    step_bytes = sum(x.nbytes for x in (req.received, req.received_groups, req.received_unblocked, req.blocked,
                                        req.learned_sink, *map(req.readout, req.readout_names), *req.maps.values()))
    monkeypatch.setattr(writer, "FLUSH_BYTES", int(1.5 * step_bytes))   # passed with the second step held
    assert on_disk_after_each_step(tmp_path / "c.arrow", flush_seconds=3600)[1] == [0, 2, 2, 4, 4]
    monkeypatch.setattr(writer, "FLUSH_BYTES", int(0.5 * step_bytes))
    assert on_disk_after_each_step(tmp_path / "d.arrow", flush_seconds=3600)[1] == [1, 2, 3, 4, 5]


KILLED_RUN = """
import sys, time
import torch
import sinklens
from sinklens.experiments.twins import LOAD, dlm_sampler, heldout_prompt
from sinklens.trace import TraceWriter

def hook(event):  # runs before the writer sees the step
    print(event.step, flush=True)
    if event.step == 9:
        time.sleep(600)

m = sinklens.load("tiny-dlm", **LOAD)
writer = TraceWriter(sys.argv[1], flush_steps=4, flush_seconds=3600)
m.generate(torch.tensor([m.apply_chat_template(heldout_prompt(0))]), trace=writer, hook=hook, **dlm_sampler())
"""


@pytest.mark.slow
def test_a_killed_generation_keeps_every_written_group(tmp_path):
    """kill -9 in the middle of a traced generation (groups of 4 steps; the writer has held steps 0-8
    when the run stops at step 9): the file holds the two finished groups, steps 0-7, and reads as
    truncated; only the group still held (step 8) is lost."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "killed.arrow"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        for line in child.stdout:
            if line.strip() == "9":
                break
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    t = open_trace(path)
    assert t.truncated and t.steps == list(range(8))
    assert t.meta["family"] == "llada" and t.received_groups(7).shape[0] == 2


def _doc_block(doc: str, after: str) -> str:
    """The first ```python block of docs/`doc` after the line containing `after`."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / doc).read_text()
    rest = text[text.index(after):]
    start = rest.index("```python\n") + len("```python\n")
    return rest[start:rest.index("```", start)]


@pytest.mark.parametrize("summable", [True, False], ids=["groups-only", "received-stored"])
def test_documented_plain_pyarrow_recipe_gives_received(tmp_path, summable):
    """docs/samplers.md's plain-pyarrow recipe, run as written, reads what `t.received` reads, both
    when the writer stores `received` and when it stores only the groups (what a DLM run writes:
    `received` is their sum, left null in the file)."""
    rng = np.random.default_rng(3)
    path = tmp_path / "run.arrow"
    w = TraceWriter(path, {"family": "llada", "query_groups": ["masked", "unmasked"]})
    for t in range(12):
        groups = rng.random((1, G, L, H, S)).astype(np.float16).astype(np.float32)
        received = groups.sum(axis=1) if summable else rng.random((1, L, H, S))
        w.write_step(t, rng.integers(0, 50, (1, S)), received=received, received_groups=groups)
    w.close()
    assert pa.ipc.open_stream(str(path)).read_all()["received"][10].is_valid is not summable
    code = _doc_block("samplers.md", "Reading with plain pyarrow").replace('"run.arrow"', repr(str(path)))
    scope = {}
    exec(code, scope)
    np.testing.assert_array_equal(scope["received"], open_trace(path).received(10))


def test_an_empty_file_and_a_step_that_is_not_a_number_say_so(tmp_path):
    empty = tmp_path / "empty.arrow"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="is empty .0 bytes.: the run writing it stopped before its first step"):
        open_trace(empty)
    _write(tmp_path / "t.arrow", _steps())
    t = open_trace(tmp_path / "t.arrow")
    with pytest.raises(TypeError, match="step must be an int.*got '3'"):
        t.received("3")
    assert t.received(np.int64(3)).shape == (L, H, S)


def test_a_trace_path_in_a_new_folder_is_written(tmp_path):
    """generate(trace="newdir/x.arrow") in Python: the path's folder is made, as the CLI's --out is
    (it failed with pyarrow's 'Failed to open local file')."""
    import numpy as np

    from sinklens.trace.writer import TraceWriter
    path = tmp_path / "new" / "deeper" / "run.arrow"
    import sinklens
    with TraceWriter(path, {"family": "test"}) as w:
        w.write_step(0, tokens=np.arange(4)[None])
    assert sinklens.open_trace(path).num_steps == 1


def test_a_corpus_file_opened_as_a_trace_says_what_it_is(tmp_path):
    import pytest

    import sinklens
    from sinklens.trace.reader import TraceFormatError
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"kind": "header"}\n')
    with pytest.raises(TraceFormatError, match="JSON lines .*open_corpus"):
        sinklens.open_trace(path)
    garbage = tmp_path / "x.arrow"
    garbage.write_bytes(b"\x01\x02not arrow")
    with pytest.raises(TraceFormatError, match="not an Arrow IPC stream"):
        sinklens.open_trace(garbage)


def test_a_bfloat16_or_grad_capture_is_held_and_written_as_float():
    """numpy has no bfloat16: such a capture (and one that requires grad) reaches the file as float32
    values, equal to the tensor's; a CPU float32 tensor is viewed, not copied."""
    import torch

    from sinklens.trace.arrays import _np
    x = torch.randn(2, 5).to(torch.bfloat16)
    np.testing.assert_array_equal(_np(x), x.float().numpy())
    assert _np(x).dtype == np.float32
    g = torch.randn(3, requires_grad=True)
    np.testing.assert_array_equal(_np(g), g.detach().numpy())
    f = torch.randn(4)
    assert np.shares_memory(_np(f), f.numpy())


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "per-step"])
def test_new_token_strings_are_found_alike_in_small_and_large_groups(tmp_path, monkeypatch, stacked):
    """A group's new token ids (whose strings the batch stores) are found by Python sets in a small
    group and by numpy in a large one: both give the same ids in the same order (by the step that
    first holds them, ascending within it; never an id seen before or a negative one), group after
    group, and that order is a step at a time's."""
    import sinklens.trace.writer as writer_module

    rng = np.random.default_rng(0)
    groups = []
    for g in range(6):
        steps = [rng.integers(-3, 40 + 30 * g, size=(2, 5 + (0 if stacked else t))) for t in range(4)]
        groups.append(np.stack(steps) if stacked else steps)
    found = {}
    for name, small in (("sets", 2**62), ("numpy", -1)):
        monkeypatch.setattr(writer_module, "SMALL_IDS", small)
        w = TraceWriter(tmp_path / f"{name}.arrow", decode=lambda ids: [str(i) for i in ids])
        found[name] = [w._new_ids(group) for group in groups]
        w.close()
    assert found["sets"] == found["numpy"]
    seen, want = set(), []
    for group in groups:   # a step at a time, by hand
        new = []
        for step in group:
            fresh = sorted({int(i) for i in np.ravel(step)} - seen - set(range(-3, 0)))
            new += fresh
            seen |= set(fresh)
        want.append(new)
    assert found["sets"] == want and any(want[1:]) and sum(map(len, want)) == len(seen)


class _Keep:
    """A hook that keeps each step's received attention as the capture recorded it. rows: it asks to
    sum every other query row; groups: it puts every other row in a group and leaves the rest out."""

    wants_attention = True

    def __init__(self, rows=False, groups=False, every=False):
        self.rows, self.groups, self.every, self.received = rows, groups, every, []

    def before_step(self, step, tokens, is_masked, attention_mask=None):
        import torch

        from sinklens.attention.request import AttentionRequest
        even = (torch.arange(tokens.shape[1]) % 2 == 0)[None].expand_as(tokens)   # (B, S)
        if self.every:   # the padding rows too, which no group holds
            return AttentionRequest(query_mask=torch.ones_like(even))
        if self.rows:    # every other real row
            return AttentionRequest(query_mask=even & attention_mask.bool())
        if self.groups:
            return AttentionRequest(query_groups=torch.where(even, is_masked.long(), -1), num_groups=2)
        return None

    def after_step(self, event):
        self.received.append(event.attention.received.clone())   # (L, B, H, S)


@pytest.mark.parametrize("hook", ["none", "rows", "groups", "padding"])
def test_a_diffusion_trace_reads_back_the_received_attention_the_capture_recorded(tmp_path, hook):
    """With the masked / unmasked split (the default for a diffusion model) the file leaves `received`
    out where it is the groups' sum, and what the reader reads is what the capture recorded, at every
    step: the sampler's groups (every summed row in one), a hook's own query rows (every other row,
    each in the sampler's groups: still their sum), and rows no group holds: a hook's own groups that
    leave half the rows out, or a hook summing the padding rows too (received is stored)."""
    import torch

    from sinklens.experiments.twins import LOAD, dlm_sampler, heldout_prompt

    m = sinklens.load("tiny-dlm", **LOAD)
    keep = _Keep(rows=hook == "rows", groups=hook == "groups", every=hook == "padding")
    a, b = m.apply_chat_template(heldout_prompt(0)), m.apply_chat_template(heldout_prompt(1))
    P = max(len(a), len(b))   # two prompts, left-padded: the padding rows are in no group
    ids = torch.tensor([[m.pad_id] * (P - len(p)) + p for p in (a, b)])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in (a, b)])
    assert len(a) != len(b)
    out = m.generate(ids, attention_mask=mask, trace=tmp_path / "t.arrow", hook=keep, **dlm_sampler())
    t = open_trace(tmp_path / "t.arrow")
    assert len(t.steps) == out.num_steps == len(keep.received)
    stored = hook in ("groups", "padding")
    assert t.table().column("received").null_count == (0 if stored else 2 * out.num_steps)
    for step, rec in zip(t.steps, keep.received):
        for row in range(2):
            want = rec[:, row].numpy().astype(np.float16).astype(np.float32)   # (L, H, S), stored as float16
            np.testing.assert_allclose(t.received(step, row), want, rtol=2e-3, atol=1e-3)
