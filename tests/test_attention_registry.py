"""Every registered capture route against the chunked exact route, and the compiled kernel's build.

The reference is the exact route forced into its chunk loop (itself tested against transformers'
eager attention in test_attention.py and test_attention_routes.py). Each route runs every case its
declaration (`Records`) covers and must really run it (not decline to another route); a case it
declares it cannot record must not be offered to it.

Tolerances (max abs difference against the reference):
- float32: output 2e-5, every column sum / readout 2e-5 (a column sum adds up to S_q probabilities);
- bfloat16 inputs: column sums 2e-5 (every route takes its softmax in float32 from the same bf16
  q and k; the lse route 1e-3 relative more: its log-sum-exp is sdpa's bf16 kernel's); output 1/64 + 1/64·|out| (rounding the same float32 result to bfloat16 along different
  paths: at most one bf16 step, 2^-7 relative, apart);
the lse and triton routes' outputs are sdpa's / the kernel's, compared with the same bounds, but
the lse route's under softcapping or learned sinks in bfloat16: the model's own eager function,
whose bf16 scores round at every step (1/16 + 1/16·|out|).
"""
import types

import pytest
import torch

from sinklens.attention import AttentionRequest
from sinklens.attention.function import sinklens_attention
from sinklens.attention.routes import BY_NAME, REGISTRY, Call, Needs, build, choose_route
from sinklens.attention.routes.base import NO_MODIFIERS, Modifiers


def fake_module(h, h_kv, causal, kind=None, sinks=None):
    """A layer; with `kind`, one of that transformers model's classes (softcap, sinks: its own eager)."""
    if kind is None:
        return types.SimpleNamespace(num_key_value_groups=h // h_kv, is_causal=causal, layer_idx=0)
    from test_attention_routes import _eager_module   # tests/ is on sys.path
    return _eager_module(kind, h, h_kv, causal, sinks)


def layout_mask(layout: str, s_q: int, s_k: int) -> tuple[torch.Tensor | None, bool]:
    """(bool mask (2, 1, S_q, S_k) or None, is_causal) of a layout; queries are the last S_q positions."""
    q_pos = torch.arange(s_k - s_q, s_k)[:, None]
    j = torch.arange(s_k)[None, :]
    if layout == "causal":
        return None, True
    if layout == "cached":  # a causal block of queries after cached keys: transformers hands over its mask
        return (j <= q_pos).expand(2, 1, s_q, s_k).contiguous(), True
    if layout == "bidirectional":
        return None, False
    if layout == "block-causal":  # SDAR / LLaDA2: blocks of 4 see themselves and every earlier block
        m = j // 4 <= q_pos // 4
    elif layout == "holes":  # causal, keys 5-9 hidden from every query (pads inside the sequence)
        m = (j <= q_pos) & ((j < 5) | (j >= 10))
    elif layout == "window":  # a causal sliding window of 5 keys
        m = (j <= q_pos) & (j > q_pos - 5)
    elif layout == "padded-causal":  # row 0 left-padded by 3: its first queries see no key
        m = (j <= q_pos).expand(2, 1, s_q, s_k).clone()
        m[0, ..., :3] = False
        return m, True
    elif layout == "padded-bidirectional":  # Dream: row 1's last 2 positions are pads, whose rows see nothing
        real = torch.ones(2, s_k, dtype=torch.bool)
        real[1, -2:] = False
        return (real[:, None, :, None] & real[:, None, None, :])[:, :, s_k - s_q:].contiguous(), False
    else:
        raise ValueError(layout)
    return m.expand(2, 1, s_q, s_k).contiguous(), True


# (layout, kv heads, S_q, extras): extras from "block" (blocked keys), "keep" (keep_self), "groups",
# "sinks", "softcap", "readouts" (diagonal and distance), "diagonal" (alone), "maps", "every" (one head
# blocks every key)
CASES = [
    ("causal", 2, 23, ()), ("causal", 6, 23, ("groups", "readouts")), ("bidirectional", 1, 23, ("block",)),
    ("block-causal", 2, 23, ("block", "groups")), ("window", 3, 23, ("readouts",)),
    ("padded-causal", 2, 23, ("block", "keep")), ("padded-bidirectional", 2, 23, ("groups", "block")),
    ("causal", 2, 1, ("block",)), ("cached", 2, 7, ("groups",)),  # a decoding row; a cached block of 7
    ("bidirectional", 2, 23, ("sinks",)), ("causal", 2, 23, ("softcap", "block")),
    ("padded-causal", 2, 23, ("sinks", "block")), ("padded-bidirectional", 2, 23, ("softcap",)),
    ("causal", 2, 23, ("block",)), ("causal", 3, 23, ("block", "keep")),  # blocking without a mask (triton's)
    ("bidirectional", 2, 23, ("block", "keep", "groups")),
    ("bidirectional", 2, 23, ("block", "every")), ("causal", 2, 1, ("block", "every")),  # one mask row per head
    ("holes", 2, 23, ("groups",)), ("holes", 2, 23, ("diagonal", "softcap")),  # masked keys inside the rows' spans
    ("causal", 2, 23, ("maps",)),  # last: test_choose_route_by_declarations reads it as the maps case
]
DTYPES = (torch.float32, torch.bfloat16)
# "compiled-packed" / "compiled-blas": the compiled route with its products as its register-blocked loops
# over packed keys / through BLAS (these layers are small enough for its plain vector loops,
# compiled.SMALL_WORK; a head size of 16 is one panel, compiled.PANEL)
ROUTES = [r.name for r in REGISTRY if r.name not in ("plain", "exact")] + ["compiled-packed", "compiled-blas"]


def make(case, dtype, seed=0, d=16, s_k=23):
    layout, kv, s_q, extras = case
    g = torch.Generator().manual_seed(seed)
    h = 6
    q = (torch.randn(2, h, s_q, d, generator=g) * 1.5).to(dtype)
    k = (torch.randn(2, kv, s_k, d, generator=g) * 1.5).to(dtype)
    v = torch.randn(2, kv, s_k, d, generator=g).to(dtype)
    mask, causal = layout_mask(layout, s_q, s_k)
    blocked = None
    if "block" in extras:  # (L=1, B, H, S_k): a few keys per head, key 0 in every head of row 0
        blocked = torch.zeros(1, 2, h, s_k, dtype=torch.bool)
        blocked[0, :, torch.arange(h), (torch.arange(h) * 3) % s_k] = True
        blocked[0, 0, :, 0] = True
        if "every" in extras:  # a row with nothing left to see keeps its keys (masks.apply_blocking)
            blocked[0, 1, 2] = True
    qmask = torch.ones(2, s_q, dtype=torch.bool)
    qmask[1, 0] = False
    kwargs = {}
    if "sinks" in extras:
        kwargs["s_aux"] = torch.randn(h, generator=g)
    if "softcap" in extras:
        kwargs["softcap"] = 2.5
    kind = "gpt_oss" if "sinks" in extras else "gemma2" if "softcap" in extras else None
    req = dict(capture=True, query_mask=qmask, blocked=blocked, keep_self="keep" in extras,
               query_groups=torch.arange(s_q).remainder(3).expand(2, s_q) - 1 if "groups" in extras else None,
               num_groups=2 if "groups" in extras else 0,
               diagonal="readouts" in extras or "diagonal" in extras, distance="readouts" in extras,
               map_slices=((0, 1),) if "maps" in extras else ())
    return fake_module(h, kv, causal, kind, kwargs.get("s_aux")), q, k, v, mask, req, kwargs


def run(route, case, dtype, chunk=None, d=16, s_k=23):
    module, q, k, v, mask, req_kw, kwargs = make(case, dtype, d=d, s_k=s_k)
    req = AttentionRequest(route="exact" if route == "exact-whole" else route, query_chunk=chunk, **req_kw)
    out, _ = sinklens_attention(module, q, k, v, mask, scaling=0.3, sinklens=req, **kwargs)
    return out.float(), req


def captures(req) -> dict:
    got = {"received": req.received, "unblocked": req.received_unblocked, "groups": req.received_groups,
           "learned_sink": req.learned_sink, "diagonal": req.readout("diagonal"), "distance": req.readout("distance")}
    got.update({f"map{k}": m for k, m in req.maps.items()})
    return {k: v for k, v in got.items() if v is not None}


def call_of(case, dtype) -> Call:
    module, q, k, v, mask, req_kw, kwargs = make(case, dtype)
    mods = Modifiers(softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux")) if kwargs else NO_MODIFIERS
    req = AttentionRequest(**req_kw)
    blocked = None if req.blocked is None else req.blocked[0]
    return Call(module, q, k, v, mask, module.is_causal, 0.3, req, mods, blocked)


def needs_of(case, dtype) -> Needs:
    return Needs.of(call_of(case, dtype))


def test_the_route_memo_key_tells_apart_every_needs():
    """choose_route remembers its routes by `Needs.key`: two calls with the same key must need the same."""
    seen = {}
    for case in CASES:
        for dtype in DTYPES:
            call = call_of(case, dtype)
            needs = Needs.of(call)
            assert seen.setdefault(Needs.key(call), needs) == needs, case
    assert len(set(seen.values())) > 10   # the cases reach many different needs


def test_one_request_remembers_the_routes_of_each_kind_of_layer():
    """One forward's layers share a request, which remembers their routes per kind of layer: layers that
    differ in their mask, what they block, their modifiers or dtype still get their own routes."""
    import dataclasses
    fresh, shared = [], []
    for keep_self in (False, True):   # (a blocked key kept for its own query: not every route can)
        base = AttentionRequest(capture=True, keep_self=keep_self, query_groups=torch.zeros(2, 7, dtype=torch.long),
                                num_groups=1)
        for case in CASES:
            for dtype in DTYPES:
                call = call_of(case, dtype)
                if call.req.query_groups is None or call.req.map_slices:
                    continue   # (the shared request's own instructions: capture and groups)
                own = choose_route(dataclasses.replace(call, req=dataclasses.replace(base, _scratch={})))
                fresh.append([r.name for r in own])
                shared.append([r.name for r in choose_route(dataclasses.replace(call, req=base))])
    assert shared == fresh and len({tuple(f) for f in fresh}) > 2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join([c[0], f"kv{c[1]}", f"q{c[2]}", *c[3]]))
@pytest.mark.parametrize("name", ROUTES)
def test_every_route_equals_the_exact_route(name, case, dtype, monkeypatch):
    if name in ("compiled-packed", "compiled-blas"):
        import sinklens.attention.routes.compiled as compiled

        monkeypatch.setattr(compiled, "SMALL_WORK", -1)
        if name == "compiled-blas":
            monkeypatch.setattr(compiled, "PANEL", 1 << 30)
        name = "compiled"
    route = BY_NAME[name]
    if not route.records.covers(needs_of(case, dtype)):
        pytest.skip(f"{name} declares it cannot record this case (choose_route never offers it)")
    if name == "compiled" and build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    if name == "triton" and not route.available(types.SimpleNamespace(query=torch.zeros(1))):
        pytest.skip("triton is not installed (extra gpu)")
    ran = []
    real_run = type(route).run
    monkeypatch.setattr(type(route), "run", lambda self, call: ran.append(out := real_run(self, call)) or out)
    out, req = run(name, case, dtype)
    # the one documented decline: the whole-layer pass leaves a row whose every visible key is blocked
    # (causal row 0 here, or a head that blocks every key) to the chunk loop
    if not (name == "exact-whole" and "block" in case[3] and (case[0] in ("causal", "padded-causal")
                                                               or "every" in case[3])):
        assert ran and ran[-1] is not None, f"{name} declined a call its declaration covers"
    ref_out, ref = run("exact", case, dtype, chunk=5)
    got, want = captures(req), captures(ref)
    assert got.keys() == want.keys()
    # the lse and triton routes' log-sum-exp comes from sdpa's bf16 kernel: their sums hold to 1e-3 relative
    rel = 1e-3 if name in ("lse", "triton") and dtype != torch.float32 else 0.0
    for key in want:
        err = (got[key] - want[key]).abs() - rel * want[key].abs()
        assert err.max() <= 2e-5, (key, err.max())
    if dtype == torch.float32:
        assert (out - ref_out).abs().max() <= 2e-5
    elif name == "lse" and ({"sinks", "softcap"} & set(case[3])):
        # the model's own eager output, whose bf16 scores and softmax round at every step
        assert ((out - ref_out).abs() <= 1 / 16 + ref_out.abs() / 16).all()
    else:
        assert ((out - ref_out).abs() <= 1 / 64 + ref_out.abs() / 64).all()


@pytest.mark.parametrize("d", [4, 12, 32, 36, 48, 72])
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[7], CASES[8]], ids=lambda c: f"{c[0]}-q{c[2]}")
@pytest.mark.parametrize("products", ["loops", "packed", "blas"])
def test_compiled_products_equal_the_exact_route_for_any_head_size(products, case, d, monkeypatch):
    """The kernel's plain products (a tiny layer: 8 keys per group, D in 8 lanes, 32 output columns per
    pass, scalar tails), its register-blocked ones (D a multiple of 16: two and three panels) and BLAS',
    at head sizes with and without those tails, with 23 keys (a group of 7 left over, a panel and a
    part) and 1, 7 and 23 query rows."""
    import sinklens.attention.routes.compiled as compiled

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    if products == "packed" and d % compiled.PANEL:
        pytest.skip("the packed products take head sizes that are multiples of 16")
    monkeypatch.setattr(compiled, "SMALL_WORK", 1 << 40 if products == "loops" else -1)
    if products == "blas":
        monkeypatch.setattr(compiled, "PANEL", 1 << 30)
    out, req = run("compiled", case, torch.float32, d=d)
    ref_out, ref = run("exact", case, torch.float32, chunk=5, d=d)
    got, want = captures(req), captures(ref)
    assert got.keys() == want.keys()
    for key in want:
        assert (got[key] - want[key]).abs().max() <= 2e-5, key
    assert (out - ref_out).abs().max() <= 2e-5


def test_the_kernels_lane_sums_without_shuffles_give_the_same_numbers(monkeypatch, tmp_path):
    """A compiler without __builtin_shufflevector builds the lane-by-lane sums (forced here by
    CC="cc -DSL_NO_SHUFFLE", into a cache of its own: the command is part of the library's key); its
    products equal the exact route's like the shuffles' do."""
    import sinklens.attention.routes.compiled as compiled

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    normal = {p.name for p in build.cache_dir().glob("onepass-*.so")}
    monkeypatch.setenv("CC", f"{' '.join(build._compiler())} -DSL_NO_SHUFFLE")
    monkeypatch.setenv("SINKLENS_CACHE", str(tmp_path))
    monkeypatch.setattr(compiled, "SMALL_WORK", 1 << 40)
    build.reset()
    try:
        assert build.load() is not None
        assert {p.name for p in build.cache_dir().glob("onepass-*.so")}.isdisjoint(normal)
        for case in (CASES[1], CASES[7], CASES[8]):
            out, req = run("compiled", case, torch.float32, d=36)
            ref_out, ref = run("exact", case, torch.float32, chunk=5, d=36)
            assert (out - ref_out).abs().max() <= 2e-5
            for key, want in captures(ref).items():
                assert (captures(req)[key] - want).abs().max() <= 2e-5, key
        # the q / k / v readouts' pass sums its lanes the same way (sl_qkv_readouts)
        from sinklens.attention import readouts as R
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 4, 19, 64, generator=g)
        k, v = torch.randn(2, 1, 2, 19, 64, generator=g)
        fast = AttentionRequest(capture=True, value_norms=True, qk_norms=True)
        assert R._compiled_vectors(fast, 0, q, k, v, None)
        monkeypatch.setattr(R, "_compiled_vectors", lambda *a: False)
        slow = AttentionRequest(capture=True, value_norms=True, qk_norms=True)
        R.record_vectors(slow, 0, q, k, v, None)
        for name in slow.readout_names:
            torch.testing.assert_close(fast.readout(name), slow.readout(name), rtol=1e-5, atol=1e-6)
    finally:
        monkeypatch.undo()
        build.reset()


def test_the_kernels_avx512_blocks_give_the_same_bits(monkeypatch, tmp_path):
    """Where the CPU has AVX-512 the packed products take 12-row blocks of 16 lanes and exp / max run on 16
    lanes; every sum keeps its order, so the outputs and captures are the 8-lane build's to the bit
    (CC="cc -DSL_NO_WIDE" builds that one here, into a cache of its own). Tiles of 23 rows: a 12-row block, a
    6-row one and single rows; 23 and 300 keys: exp and max with and without 16-lane tails."""
    import sinklens.attention.routes.compiled as compiled
    from _kernels import cpu

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    if "avx512f" not in cpu()[1]:
        pytest.skip("no AVX-512 on this CPU: the kernel is built one way only")
    monkeypatch.setattr(compiled, "SMALL_WORK", -1)
    runs = {}
    try:
        for cc in ("", " -DSL_NO_WIDE"):
            monkeypatch.setenv("CC", " ".join(build._compiler()) + cc)
            monkeypatch.setenv("SINKLENS_CACHE", str(tmp_path / (cc.strip() or "wide")))
            build.reset()
            assert build.load() is not None
            runs[cc] = [run("compiled", case, torch.float32, d=64, s_k=s_k) for case in CASES for s_k in (23, 300)]
    finally:
        monkeypatch.undo()
        build.reset()
    for (out, req), (out8, req8) in zip(runs[""], runs[" -DSL_NO_WIDE"]):
        assert torch.equal(out, out8)
        got, want = captures(req), captures(req8)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_the_packed_arguments_lie_where_the_kernel_reads_them():
    """A layer writes the kernel's `sl_args` with one struct format: each field at its ctypes offset
    (`_Args` mirrors onepass.c field for field), each value read back through the ctypes field."""
    import ctypes
    import struct

    from sinklens.attention.routes.compiled import _CODES, _PACK, _Args

    codes, values = [], []
    for i, (name, t) in enumerate(_Args._fields_):
        code = f"{t._length_}{_CODES[t._type_]}" if issubclass(t, ctypes.Array) else _CODES[t]
        prefix = "@" + "".join(codes)
        assert struct.calcsize(prefix + code) - struct.calcsize("@" + code) == getattr(_Args, name).offset, name
        codes.append(code)
        n = t._length_ if issubclass(t, ctypes.Array) else 1
        values += [float(i) + 0.5 if t is ctypes.c_float else 1000 * i + j + 1 for j in range(n)]
    args = _Args()
    _PACK.pack_into(args, 0, *values)
    read = []
    for name, t in _Args._fields_:
        x = getattr(args, name)
        read += list(x) if issubclass(t, ctypes.Array) else [x]
    assert read == values


def test_choose_route_by_declarations():
    """auto: the compiled kernel first on a float32 CPU (where it builds), the lse route (output = sdpa's
    bits) in bfloat16; a request for full maps never goes to a route that cannot keep them."""
    def first(case, dtype, **over):
        module, q, k, v, mask, req_kw, kwargs = make(case, dtype)
        req = AttentionRequest(**{**req_kw, **over})
        return [r.name for r in choose_route(Call(module, q, k, v, mask, module.is_causal, 0.3, req,
                                                  NO_MODIFIERS, None))]
    fp32 = first(CASES[0], torch.float32)
    assert fp32[0] == ("compiled" if build.load() is not None else "exact-whole") and fp32[-1] == "exact"
    assert first(CASES[0], torch.bfloat16)[0] == "lse"
    assert "compiled" not in first(CASES[-1], torch.float32)  # maps
    assert first(CASES[0], torch.float32, route="lse")[0] == "lse"
    assert [r.name for r in choose_route(Call(*make(CASES[0], torch.float32)[:5], True, 0.3,
                                              AttentionRequest(), NO_MODIFIERS, None))] == ["plain"]


def test_without_a_compiler_one_note_line_and_the_torch_routes(monkeypatch, tmp_path, capfd):
    """CC naming a missing compiler: load() gives None with the reason, says so once in one line on stderr,
    and a capture takes the exact route (the same numbers as asking for it)."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("SINKLENS_CACHE", str(tmp_path / "cache"))
    build.reset()
    try:
        assert build.load() is None and build.load() is None
        err = capfd.readouterr().err.strip().splitlines()
        assert err == [f"sinklens: capture uses the torch routes (no C compiler ({tmp_path / 'no-such-cc'}; set CC))"]
        assert "compiled" not in [r.name for r in choose_route(Call(*make(CASES[0], torch.float32)[:5], True,
                                                                    0.3, AttentionRequest(capture=True), NO_MODIFIERS,
                                                                    None))]
        out, req = run("compiled", CASES[1], torch.float32)   # named, but unavailable: the auto routes
        ref_out, ref = run("exact", CASES[1], torch.float32)
        assert torch.equal(out, ref_out) and torch.equal(req.received, ref.received)
    finally:
        monkeypatch.undo()
        build.reset()


def test_the_kernel_is_built_once_into_the_cache(monkeypatch, tmp_path):
    """The first load compiles into $SINKLENS_CACHE/kernels; the next process (here: a reset) loads that
    file without running the compiler."""
    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    monkeypatch.setenv("SINKLENS_CACHE", str(tmp_path))
    build.reset()
    try:
        assert build.load() is not None
        built = list((tmp_path / "kernels").glob("onepass-*.so"))
        assert len(built) == 1
        build.reset()
        real_version = build._identity(build._compiler())
        monkeypatch.setattr(build.subprocess, "run", lambda cmd, **kw: (
            pytest.fail("compiled again") if "--version" not in cmd else types.SimpleNamespace(returncode=0,
                                                                                              stdout=real_version)))
        assert build.load() is not None
        assert list((tmp_path / "kernels").glob("onepass-*.so")) == built
    finally:
        monkeypatch.undo()
        build.reset()



@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[5], CASES[6]], ids=lambda c: c[0])
def test_compiled_tiles_of_any_height_give_the_same_numbers(case, monkeypatch):
    """The kernel walks a layer in tiles of query rows (tall ones at these sizes: one tile); tiles of 5
    rows, each seeing its own span of keys, must give what the exact route gives."""
    import sinklens.attention.routes.compiled as compiled

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    monkeypatch.setattr(compiled, "tile_rows", lambda s_k, every_key=False: 5)
    out, req = run("compiled", case, torch.float32)
    ref_out, ref = run("exact", case, torch.float32, chunk=7)
    assert (out - ref_out).abs().max() <= 2e-5
    got, want = captures(req), captures(ref)
    assert got.keys() == want.keys()
    for key in want:
        assert (got[key] - want[key]).abs().max() <= 2e-5, key


TALL_CASES = [("causal", 2, 200, ("block", "groups", "readouts")), ("cached", 3, 150, ("block", "keep")),
              ("block-causal", 2, 200, ("block", "groups")), ("window", 2, 200, ("readouts",)),
              ("holes", 2, 200, ("groups", "softcap")), ("padded-causal", 2, 200, ("block", "sinks")),
              ("padded-bidirectional", 1, 200, ("block", "groups"))]


@pytest.mark.parametrize("d", [16, 8], ids=["packed", "blas"])
@pytest.mark.parametrize("case", TALL_CASES, ids=lambda c: c[0])
def test_compiled_tiles_of_rows_with_different_spans_give_the_same_numbers(case, d, monkeypatch):
    """A tile's products cover the keys its last rows see and each row reads its own span of them: on
    every masked layout the output and every capture are the exact route's, through BLAS with 150-200
    rows in one tile (the first seeing a few keys, the last all; D 8) and through the kernel's own
    products (D 16) in tiles of 48 rows, whose first key is rounded down to a panel of 16 and whose
    last tile holds a few rows past a multiple of 6."""
    import sinklens.attention.routes.compiled as compiled

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    monkeypatch.setattr(compiled, "SMALL_WORK", -1)
    s_k = 200
    out, req = run("compiled", case, torch.float32, d=d, s_k=s_k)
    ref_out, ref = run("exact", case, torch.float32, chunk=37, d=d, s_k=s_k)
    assert (out - ref_out).abs().max() <= 2e-5
    got, want = captures(req), captures(ref)
    assert got.keys() == want.keys()
    for key in want:
        assert (got[key] - want[key]).abs().max() <= 1e-4, key


@pytest.mark.parametrize("d", [16, 48, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_compiled_packed_products_over_thousands_of_keys(causal, d, monkeypatch):
    """The kernel's own products at a length where tiles are short (compiled.packed_rows with 512 KiB of
    L2, whatever this CPU's: 36 rows at 2800 keys causal, 84 bidirectional) and the output product walks
    the keys in blocks: many tiles, a last tile of a few rows, GQA (two query heads on one key head),
    head sizes of one to four panels; the output and the sums are the exact route's."""
    import sinklens.attention.routes.compiled as compiled

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    s = 2800
    monkeypatch.setattr(compiled, "_L2", 512 * 1024)
    rows = compiled.packed_rows(s, every_key=not causal)
    assert rows == (36 if causal else 84) and (s % rows) % 6
    g = torch.Generator().manual_seed(12)
    q = torch.randn(1, 2, s, d, generator=g)
    k, v = (torch.randn(1, 1, s, d, generator=g) for _ in range(2))
    module = fake_module(2, 1, causal, None, None)
    outs = {}
    for route in ("compiled", "exact"):
        req = AttentionRequest(capture=True, route=route)
        out, _ = sinklens_attention(module, q, k, v, None, scaling=d ** -0.5, sinklens=req)
        outs[route] = out, req.received
    assert (outs["compiled"][0] - outs["exact"][0]).abs().max() <= 2e-5
    assert (outs["compiled"][1] - outs["exact"][1]).abs().max() <= 1e-4   # sums of up to 2800 rows


@pytest.mark.parametrize("softcap", [None, 2.5], ids=["plain", "softcap"])
def test_a_causal_layer_without_a_mask_makes_no_mask_on_the_compiled_route(monkeypatch, softcap):
    """A causal capture without a mask reaches the kernel as "causal": no (S_q, S_k) bools are made
    (work that grows with S^2 in every layer), soft-capped or not (no row of it sees no key), and the
    numbers are the exact route's, which makes them."""
    import sinklens.attention.routes.base as base

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    g = torch.Generator().manual_seed(13)
    q = torch.randn(1, 2, 300, 16, generator=g)
    k, v = (torch.randn(1, 1, 300, 16, generator=g) for _ in range(2))
    module = fake_module(2, 1, True, None if softcap is None else "gemma2", None)
    kwargs = {} if softcap is None else {"softcap": softcap}
    made = []
    real = base.allowed_keys
    monkeypatch.setattr(base, "allowed_keys", lambda *a, **kw: made.append(a) or real(*a, **kw))
    outs = {}
    for route in ("compiled", "exact"):
        req = AttentionRequest(capture=True, route=route)
        out, _ = sinklens_attention(module, q, k, v, None, scaling=0.25, sinklens=req, **kwargs)
        outs[route] = out, req.received
        assert len(made) == (0 if route == "compiled" else 1)
    assert (outs["compiled"][0] - outs["exact"][0]).abs().max() <= 2e-5
    assert (outs["compiled"][1] - outs["exact"][1]).abs().max() <= 1e-4


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_compiled_tile_heights_past_512_keys(causal):
    """Through BLAS (a head size that is not a multiple of 16), past 512 keys a layer whose every row
    sees every key is walked in tiles of 512 rows, a causal one in tiles of 256 (compiled.tile_rows):
    both give what the exact route gives."""
    import sinklens.attention.routes.compiled as compiled

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    assert (compiled.tile_rows(1100, True), compiled.tile_rows(1100)) == (512, 256)
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 2, 1100, 8, generator=g)
    k, v = (torch.randn(1, 1, 1100, 8, generator=g) for _ in range(2))
    module = fake_module(2, 1, causal, None, None)
    outs = {}
    for route in ("compiled", "exact"):
        req = AttentionRequest(capture=True, route=route)
        out, _ = sinklens_attention(module, q, k, v, None, scaling=0.3, sinklens=req)
        outs[route] = out, req.received
    assert (outs["compiled"][0] - outs["exact"][0]).abs().max() <= 2e-5
    assert (outs["compiled"][1] - outs["exact"][1]).abs().max() <= 1e-4


@pytest.mark.parametrize("products", ["loops", "packed", "blas"])
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[8]], ids=lambda c: f"{c[0]}-q{c[2]}")
def test_compiled_reads_queries_keys_and_values_as_a_model_hands_them(case, products, monkeypatch):
    """A model hands the attention function views of its projections, (B, S, heads, D) seen as
    (B, heads, S, D): a head's rows heads * D apart. The kernel's plain loops read them where they lie;
    the packed and BLAS paths copy keys and values into rows D apart first (compiled._rows). Either way
    the numbers are those of the same tensors laid out densely (bit for bit through the kernel's own
    loops, plain or packed, whose order of operations does not depend on strides; within 1e-6 through
    BLAS, whose kernels are the CPU's) and the exact route's."""
    import sinklens.attention.routes.compiled as compiled

    if build.load() is None:
        pytest.skip(f"the compiled kernel is unavailable here: {build.reason()}")
    monkeypatch.setattr(compiled, "SMALL_WORK", 1 << 40 if products == "loops" else -1)
    if products == "blas":
        monkeypatch.setattr(compiled, "PANEL", 1 << 30)
    module, q, k, v, mask, req_kw, _ = make(case, torch.float32)
    as_model = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]   # equal values, model strides
    assert all(t.stride(2) == t.shape[1] * t.shape[3] for t in as_model) and torch.equal(as_model[1], k)
    got = {}
    for name, (q_, k_, v_) in {"dense": (q, k, v), "as_model": as_model}.items():
        req = AttentionRequest(route="compiled", **req_kw)
        out, _ = sinklens_attention(module, q_, k_, v_, mask, scaling=0.3, sinklens=req)
        got[name] = out, captures(req)
    same = torch.equal if products != "blas" else (lambda a, b: bool((a - b).abs().max() <= 1e-6))  # noqa: E731
    assert same(got["dense"][0], got["as_model"][0])
    assert got["dense"][1].keys() == got["as_model"][1].keys()
    for key, x in got["dense"][1].items():
        assert same(x, got["as_model"][1][key]), key
    ref_out, ref = run("exact", case, torch.float32, chunk=5)
    assert (got["as_model"][0] - ref_out).abs().max() <= 2e-5


def test_the_blas_path_hands_the_kernel_keys_in_rows_d_apart():
    """compiled._rows(dense=True) copies a (B, S, heads, D) view into rows D apart (BLAS packs a layer's
    keys anew for every tile: from rows heads * D apart a SmolLM2 forward at S = 4096 took ~4 % longer);
    without it, or where rows already lie D apart, the tensor is kept as it is."""
    import sinklens.attention.routes.compiled as compiled

    view = torch.randn(1, 40, 3, 8).transpose(1, 2)               # (B, H, S, D), rows 24 floats apart
    dense, strides = compiled._rows(view, dense=True)
    assert strides[2] == 8 and torch.equal(dense, view)
    kept, strides = compiled._rows(view)
    assert kept.data_ptr() == view.data_ptr() and strides[2] == 24
    already = torch.randn(1, 3, 40, 8)
    assert compiled._rows(already, dense=True)[0].data_ptr() == already.data_ptr()

