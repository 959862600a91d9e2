"""Mechanism readouts (sinklens/trace/readouts.py): captured in the same forward, stored in the
trace, analysed on it.

References nobody here wrote: the attention probabilities of transformers' eager attention
(`output_attentions=True`), the model's own v_proj and `output_hidden_states`, its own logits (the
logit lens at the last layer is the model's head), Python's `statistics` for the k·σ rule; and
planted ground truth: a low-norm value sink, a massive activation, a k·σ outlier, a diagonal head.
"""
import ctypes
import json
import statistics

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import _planted
from sinklens.analysis import ArraySource, analyze
from sinklens.attention import ATTENTION_NAME, AttentionRequest
from sinklens.attention.function import sinklens_attention
from sinklens.attention import readouts as R
from sinklens.attention.readouts import readout_hooks
from sinklens.rule import np_rule
from sinklens.trace.readouts import COLUMN_NAMES, ReadoutOptions

ALL = dict(value_norms=True, qk_norms=True, diagonal=True, distance=True)


class Layer(torch.nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.layer_idx, self.is_causal = 0, causal


def brute_force(q, k, v, causal: bool, weight):
    """Every readout of one layer from the full softmax matrix, written out: q (B, H, S, D), k / v
    (B, H_kv, S, D), weight (B, S) real query rows."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    S = q.shape[2]
    if causal:
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), -torch.inf)
    A = s.softmax(-1) * weight[:, None, :, None]                       # (B, H, S, S) real rows only
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    dist = torch.zeros(*A.shape[:2], S)
    for d in range(S):
        dist[..., d] = (A * ((i - j).abs() == d)).sum((-1, -2))
    cos = torch.nn.functional.cosine_similarity(q[:, :, :, None], k[:, :, None], dim=-1)   # (B, H, S_q, S_k)
    n = weight.sum(-1)[:, None]
    return {"value_norm": v.norm(dim=-1), "key_norm": k.norm(dim=-1),
            "qk_cos": (cos * weight[:, None, :, None]).sum(2) / n[..., None],
            "query_norm": (q.norm(dim=-1) * weight[:, None]).sum(-1) / n,
            "diagonal": torch.diagonal(A, dim1=-2, dim2=-1).sum(-1) / n, "distance": dist}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h_kv", [4, 2])
@pytest.mark.parametrize("chunk", [None, 3])
def test_capture_readouts_equal_the_written_out_formulas(causal, h_kv, chunk):
    torch.manual_seed(0)
    B, H, S, D = 2, 4, 9, 8
    q, k, v = torch.randn(B, H, S, D), torch.randn(B, h_kv, S, D), torch.randn(B, h_kv, S, D)
    real = torch.ones(B, S, dtype=torch.bool)
    real[1, :2] = False                                                # a padded query row is not summed
    req = AttentionRequest(capture=True, query_mask=real, query_chunk=chunk, route="exact", **ALL)
    sinklens_attention(Layer(causal), q, k, v, None, is_causal=causal, sinklens=req)
    want = brute_force(q, k, v, causal, real.float())
    for name, ref in want.items():
        got = req.readout(name)[0]
        assert got.shape == ref.shape, name
        assert torch.allclose(got, ref, atol=1e-5), (name, (got - ref).abs().max())


@pytest.mark.parametrize("h_kv,d", [(4, 8), (2, 12), (1, 64)])
@pytest.mark.parametrize("rows", ["all", "masked"])
@pytest.mark.parametrize("asked", ["both", "values", "qk"])
def test_the_compiled_qkv_pass_is_the_torch_readouts(h_kv, d, rows, asked, monkeypatch):
    """onepass.c's `sl_qkv_readouts` against the torch code it stands in for (`record_vectors`): value
    and key norms, cos(q, k) and the query norm within float32 rounding, over query groups, head
    sizes that are and are not multiples of 8, q / k / v as a model hands them (views of its
    (B, S, heads, D) projections), weighted query rows with a zero query among them, and each
    readout asked alone."""
    from sinklens.attention.routes import build

    if build.load() is None:
        pytest.skip("the compiled kernel does not build here")
    g = torch.Generator().manual_seed(1)
    B, H, S = 2, 4, 11
    q = torch.randn(B, S, H, d, generator=g).transpose(1, 2)          # (B, H, S, D) views
    k = torch.randn(B, S, h_kv, d, generator=g).transpose(1, 2)
    v = torch.randn(B, S, h_kv, d, generator=g).transpose(1, 2)
    q[0, :, 3] = 0.0                                                   # a zero query row: its direction is 0
    weight = None
    if rows == "masked":
        weight = torch.ones(B, S, dtype=torch.bool)
        weight[1, :4] = False
    options = {"both": dict(value_norms=True, qk_norms=True), "values": dict(value_norms=True),
               "qk": dict(qk_norms=True)}[asked]

    def readouts():
        req = AttentionRequest(capture=True, **options)
        R.record_vectors(req, 0, q, k, v, weight)
        return {name: req.readout(name) for name in req.readout_names}

    fast = readouts()
    monkeypatch.setattr(R, "_compiled_vectors", lambda *a: False)
    slow = readouts()
    assert fast.keys() == slow.keys() and len(fast) == {"both": 4, "values": 1, "qk": 3}[asked]
    for name in slow:
        torch.testing.assert_close(fast[name], slow[name], rtol=1e-5, atol=1e-6)


def test_planted_diagonal_head_and_low_norm_value_sink_are_read_back():
    """Head 0: each query its own key (orthogonal keys, q_i = 6 k_i): a diagonal head. Head 1: every
    query aligned with key 0, whose value is 20x shorter than the others: a low-norm value sink."""
    S, D = 8, 8
    k = torch.eye(S, D)[None, None].repeat(1, 2, 1, 1)                   # (1, 2, S, D) orthonormal keys
    q = torch.stack([6.0 * k[0, 0], 6.0 * k[0, 1, :1].expand(S, D)])[None]
    v = torch.ones(1, 2, S, D)
    v[0, 1, 0] = 0.05
    req = AttentionRequest(capture=True, route="exact", **ALL)
    sinklens_attention(Layer(False), q, k, v, None, is_causal=False, sinklens=req)
    diag = req.readout("diagonal")[0, 0]                                 # (H,)
    e = np.exp(6 * D ** -0.5)
    assert diag[0].item() == pytest.approx(e / (e + S - 1), rel=1e-5)   # planted: softmax of one raised logit
    assert diag[0] > 0.5 > diag[1]
    norms = req.readout("value_norm")[0, 0]
    assert norms[1, 0].item() == pytest.approx(0.05 * D ** 0.5) and norms[1, 1].item() == pytest.approx(D ** 0.5)

    # the same, analysed: received (1, 1, 2, S) with head 1's sink at 0, value norms and diagonal shares
    rec = req.received.numpy().transpose(1, 0, 2, 3)                   # (T=1, L, H, S)
    src = ArraySource(rec, np.zeros((1, S), int), readouts={"value_norm": norms.numpy()[None, None],
                                                            "diagonal": diag.numpy()[None, None]})
    a = analyze(src)
    assert a.sink_count[0, 0].tolist() == [0, 1]
    sv = a.sink_vectors
    assert sv.ratio("value_norm")[0, 0, 1] == pytest.approx(0.05, rel=1e-3)   # sinks carry low-norm values
    assert np.isnan(sv.ratio("value_norm")[0, 0, 0])                           # head 0 has no sink
    assert a.diagonal_heads.classes().tolist() == [["diagonal", "sink"]]


def test_planted_k_sigma_outlier_is_found_where_eq3_is_silent():
    """Key 7 gets a little more attention in every head of every layer: never ≥ ε = 3 above the rest
    in one head (Eq. 3 silent), but its mass summed over layers stands out (k·σ fires)."""
    T, L, H, S = 2, 6, 3, 40
    rng = np.random.default_rng(0)
    rec = rng.uniform(0.9, 1.1, (T, L, H, S)).astype(np.float32)
    rec[..., 7] = 2.5
    rec *= S / rec.sum(-1, keepdims=True)                                # column sums of S rows: Σ_j r_j = S
    a = analyze(ArraySource(rec, np.zeros((T, S), int)))
    assert a.sink_count.sum() == 0
    ks = a.k_sigma
    assert [p.tolist() for p in ks.positions] == [[7], [7]]
    # the threshold against Python's statistics (population σ)
    mass = rec[0].mean(1).sum(0)
    want = statistics.fmean(mass.tolist()) + 2.0 * statistics.pstdev(mass.tolist())
    assert ks.threshold[0] == pytest.approx(want, rel=1e-5)
    flagged, thr = np_rule.k_sigma_sinks(mass, np.ones(S, bool), 2.0)
    assert thr == pytest.approx(want, rel=1e-6) and np.flatnonzero(flagged).tolist() == [7]


def massive_llama():
    """A random 3-layer Llama on sinklens' attention with a planted massive activation: 400 in channel
    5 of token 3's embedding (test_analysis_massive.py uses it too)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = ATTENTION_NAME
    with torch.no_grad():
        model.model.embed_tokens.weight[3, 5] = 400.0
    return model


def test_planted_massive_activation_is_read_back_from_a_model():
    """A huge value in channel 5 of token 3's embedding rides the residual stream: every layer's
    largest channel at that position is 5, and the analysis places it."""
    model = massive_llama()
    ids = torch.tensor([[1, 2, 3, 4, 6, 7]])
    req = AttentionRequest(capture=True, hidden_norms=True)
    with torch.no_grad(), readout_hooks(model, req):
        out = model(ids, sinklens=req, output_hidden_states=True)
    top = req.readout("hidden_top_channels")[:, 0, 2, 0]                  # (L,) at position 2 (token 3)
    assert top.tolist() == [5, 5, 5]
    hs = out.hidden_states                                               # transformers' own: embeddings, layers 0..L-2, final norm
    for l in range(model.config.num_hidden_layers - 1):
        assert torch.allclose(req.readout("hidden_norm")[l, 0], hs[l + 1][0].norm(dim=-1), rtol=1e-5)
    readouts = {n: req.readout(n).numpy().transpose(1, 0, *range(2, req.readout(n).dim()))[:1] for n in
                ("hidden_norm", "hidden_top_channels", "hidden_top_values")}
    a = analyze(ArraySource(req.received.numpy().transpose(1, 0, 2, 3), ids.numpy(),
                            readouts={k: v for k, v in readouts.items()}))
    ma = a.massive_activations
    assert ma.position[0].tolist() == [2, 2, 2] and ma.channel[0].tolist() == [5, 5, 5]
    assert (ma.ratio[0] > 10).all()


@pytest.mark.parametrize("shape", [(1, 300, 576), (2, 7, 37), (1, 3, 5), (1, 4, 8)])
def test_the_compiled_hidden_pass_is_torchs_norm_topk_and_gather(shape):
    """onepass.c's `sl_hidden_top` (the hidden-state readouts on the CPU) against what it stands in for:
    torch.topk of |h| gives the same channels, in the same order, and gather the same values; the
    norm agrees within float32 rounding; the median of |h| (`sl_median_abs`) is torch.median's element.
    Widths that are and are not multiples of 8, fewer channels than HIDDEN_TOP_CHANNELS, a planted
    massive channel."""
    from sinklens.attention.routes import build

    if build.load() is None:
        pytest.skip("the compiled kernel does not build here")
    g = torch.Generator().manual_seed(0)
    h = torch.randn(*shape, generator=g)
    h[0, :, shape[2] // 2] *= 40                        # a massive activation
    k = min(R.HIDDEN_TOP_CHANNELS, shape[2])
    norm, top, values, median = R._compiled_hidden_top(h, k)
    want = h.abs().topk(k, dim=-1).indices
    assert torch.equal(top, want.int())
    assert torch.equal(values, h.gather(-1, want))
    torch.testing.assert_close(norm, h.norm(dim=-1), rtol=1e-6, atol=0)
    assert torch.equal(median, h.abs().flatten(1).median(-1).values)
    assert torch.equal(R._median_rows(h.abs().flatten(1)), h.abs().flatten(1).median(-1).values)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 1001, 70_000])
def test_the_compiled_median_is_torchs_element(n):
    """`sl_median_abs` (a radix select on the bits of |x|) against torch.median of |x|, bit for bit, on
    rows that stress a select: every value equal, zeros of both signs, many ties in one bin of the first
    pass, infinities, subnormals, magnitudes spread over the whole exponent range; odd and even lengths
    (the lower middle element)."""
    from sinklens.attention.routes import build

    if build.load() is None:
        pytest.skip("the compiled kernel does not build here")
    fn = build.function("sl_median_abs", R._MEDIAN_ARGS, ctypes.c_int)
    g = torch.Generator().manual_seed(n)
    rows = [torch.zeros(n), -torch.zeros(n), torch.full((n,), -2.5),
            torch.randn(n, generator=g), torch.randn(n, generator=g) * 1e-40,           # subnormals
            torch.exp(torch.randn(n, generator=g) * 40).clamp(max=3e38) * torch.sign(torch.randn(n, generator=g)),
            (torch.randint(0, 3, (n,), generator=g) - 1) * (1 + torch.rand(n, generator=g) * 2**-12),  # one bin's ties
            torch.where(torch.rand(n, generator=g) < 0.5, torch.tensor(float("inf")), torch.randn(n, generator=g))]
    x = torch.stack(rows).contiguous()                                           # (rows, n)
    out = torch.empty(len(rows))
    assert fn(len(rows), n, x.data_ptr(), out.data_ptr()) == 0
    assert torch.equal(out, x.abs().median(-1).values)
    x[3, n // 2] = float("nan")
    assert fn(len(rows), n, x.data_ptr(), out.data_ptr()) == 1                   # NaN: torch's path


def test_the_compiled_hidden_pass_orders_ties_by_channel_and_leaves_nan_to_torch():
    """Equal magnitudes: the lower channel first (sign apart: |-3| = |3|). A NaN anywhere: no answer,
    so the readout takes torch's path, which orders a NaN as the largest."""
    from sinklens.attention.routes import build

    if build.load() is None:
        pytest.skip("the compiled kernel does not build here")
    h = torch.zeros(1, 2, 19)
    h[0, 0, [2, 9, 11, 17]] = torch.tensor([3.0, -3.0, 1.0, 3.0])
    _, top, values, _ = R._compiled_hidden_top(h, 4)
    assert top[0, 0].tolist() == [2, 9, 17, 11] and values[0, 0].tolist() == [3.0, -3.0, 3.0, 1.0]
    assert top[0, 1].tolist() == [0, 1, 2, 3]           # all zero: the first channels
    for at in (4, 18):                                  # in a group of 8, and in the tail
        bad = h.clone()
        bad[0, 1, at] = float("nan")
        assert R._compiled_hidden_top(bad, 4) is None


def test_hidden_readouts_are_the_same_with_and_without_the_compiled_pass(monkeypatch):
    """A model's hidden-state readouts through the kernel's pass equal torch's path: channels, values
    and the median exactly, the norms within float32 rounding."""

    model = massive_llama()
    ids = torch.tensor([[1, 2, 3, 4, 6, 7, 9, 11]])

    def readouts():
        req = AttentionRequest(capture=True, hidden_norms=True)
        with torch.no_grad(), readout_hooks(model, req):
            model(ids, sinklens=req)
        return {n: req.readout(n) for n in ("hidden_norm", "hidden_top_channels", "hidden_top_values",
                                            "hidden_median_abs")}

    fast = readouts()
    monkeypatch.setattr(R, "_compiled_hidden_top", lambda *a: None)
    slow = readouts()
    for name in ("hidden_top_channels", "hidden_top_values", "hidden_median_abs"):
        assert torch.equal(fast[name], slow[name]), name
    torch.testing.assert_close(fast["hidden_norm"], slow["hidden_norm"], rtol=1e-6, atol=0)


def _eager_maps(model, ids):
    """transformers' eager attention maps (L tuples of (B, H, S, S)) of the wrapped model."""
    before = model.model.config._attn_implementation
    model.model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            return model.model(ids, output_attentions=True, use_cache=False).attentions
    finally:
        model.model.config._attn_implementation = before


def _check_against_eager(m, ids):
    """Value norms from the model's own v_proj, hidden norms from output_hidden_states, diagonal
    share and distance profile from eager attention maps."""
    req = AttentionRequest(capture=True, hidden_norms=True, **ALL)
    m.forward_logits(ids, attention=req)
    with torch.no_grad():
        hs = m.model(ids, output_hidden_states=True, use_cache=False).hidden_states
    maps = _eager_maps(m, ids)
    S = ids.shape[1]
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    layers = m.model.get_decoder().layers
    for l, layer in enumerate(layers):
        attn = layer.self_attn
        with torch.no_grad():
            vv = attn.v_proj(layer.input_layernorm(hs[l]))                # (1, S, H_kv * D)
        vv = vv.view(1, S, -1, attn.head_dim).transpose(1, 2).float().norm(dim=-1)
        vv = vv.repeat_interleave(m.num_heads // vv.shape[1], 1)
        assert torch.allclose(req.readout("value_norm")[l], vv, rtol=2e-3, atol=2e-3), l
        A = maps[l].float()
        assert torch.allclose(req.readout("diagonal")[l], torch.diagonal(A, dim1=-2, dim2=-1).sum(-1) / S,
                              atol=2e-3), l
        dist = torch.stack([(A * ((i - j).abs() == d)).sum((-1, -2)) for d in range(S)], -1)
        # float16 storage of sums up to ~S (the twin runs in float16): relative as well as absolute
        assert torch.allclose(req.readout("distance")[l], dist, rtol=5e-3, atol=5e-3), (l, (req.readout("distance")[l] - dist).abs().max())
        if l < len(layers) - 1:                                            # the last entry of hidden_states is normed
            assert torch.allclose(req.readout("hidden_norm")[l], hs[l + 1].float().norm(dim=-1), rtol=2e-3)


def test_readouts_against_eager_on_smollm2(smollm2):
    ids = smollm2.tokenizer("The sky is blue because", return_tensors="pt").input_ids
    _check_against_eager(smollm2, ids)


def test_readouts_against_eager_on_tiny_dlm():
    import sinklens

    m = sinklens.load("tiny-dlm")
    _check_against_eager(m, torch.tensor([[1, 5, 9, 14, 20, 33, 40, 41, 2]]))


def test_lens_at_the_last_layer_is_the_models_own_head(smollm2):
    ids = smollm2.tokenizer("One, two, three, four", return_tensors="pt").input_ids
    L = smollm2.num_layers
    req = AttentionRequest(capture=True, lens_layers=(L - 1,), lens_positions=(0, 3, ids.shape[1] - 1))
    logits = smollm2.forward_logits(ids, attention=req)                 # (1, S, V)
    want = logits[0, [0, 3, ids.shape[1] - 1]].softmax(-1).topk(5)
    assert req.lens["tokens"][0, 0].tolist() == want.indices.tolist()
    assert torch.allclose(req.lens["probs"][0, 0], want.values, atol=1e-4)


def test_lens_of_every_layer_is_each_layers_hidden_state_through_the_head(smollm2, monkeypatch):
    """The lens puts several layers through the LM head in one call: each layer's rows are still its
    own hidden state's, whatever the number of layers per call (LENS_LOGITS) — against the head
    applied to transformers' hidden states layer by layer."""
    from sinklens.attention import readouts

    ids = smollm2.tokenizer("One, two, three, four", return_tensors="pt").input_ids
    L, pos = smollm2.num_layers, (0, 2, ids.shape[1] - 1)
    model = smollm2.model
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states[1:]    # each layer's output; the last after the norm
        head = model.get_output_embeddings()
        want = [head(model.model.norm(h[0, list(pos)]) if l < L - 1 else h[0, list(pos)]).softmax(-1).topk(5)
                for l, h in enumerate(hs)]
    got = {}
    for per_call_logits in (1, 3 * 49152 * 4, readouts.LENS_LOGITS):   # one layer per call, four, all of them
        monkeypatch.setattr(readouts, "LENS_LOGITS", per_call_logits)
        req = AttentionRequest(capture=True, lens_layers=tuple(range(L)), lens_positions=pos)
        smollm2.forward_logits(ids, attention=req)
        got[per_call_logits] = req.lens
        assert req.lens["tokens"].shape == (1, L, len(pos), 5)
        for l in range(L):
            assert req.lens["tokens"][0, l].tolist() == want[l].indices.tolist(), l
            assert torch.allclose(req.lens["probs"][0, l], want[l].values, atol=1e-4), l
    one, *others = got.values()
    for other in others:
        assert torch.equal(one["tokens"], other["tokens"]) and torch.allclose(one["probs"], other["probs"], atol=1e-5)


@pytest.mark.slow
def test_traced_tokens_identical_and_trace_round_trip(tmp_path):
    import sinklens
    from sinklens.samplers.capture import CaptureOptions

    m = sinklens.load("tiny-dlm")
    ids = m.apply_chat_template("Tom has 3 apples and buys 4 more. How many?")
    torch.manual_seed(0)
    plain = m.generate(ids, trace=str(tmp_path / "plain.arrow"))
    capture = CaptureOptions(lens_layers=[1, 3], hidden_norms=True, **ALL)
    torch.manual_seed(0)
    traced = m.generate(ids, trace=str(tmp_path / "ro.arrow"), capture=capture)
    assert torch.equal(plain.sequences, traced.sequences)                # observing changes no token
    t, t0 = sinklens.open_trace(tmp_path / "ro.arrow"), sinklens.open_trace(tmp_path / "plain.arrow")
    step = t.steps[2]
    assert t0.readouts(step) == {}                                      # off by default: nothing stored
    got = t.readouts(step)
    assert set(got) == set(COLUMN_NAMES)
    L, H, S = t.num_layers, t.num_heads, t.seq_len
    assert got["value_norm"].shape == (L, H, S) and got["diagonal"].shape == (L, H)
    assert got["hidden_top_channels"].shape == (L, S, 4) and got["lens_tokens"].shape[:2] == (2, 8)
    assert t.meta["readouts"]["lens_layers"] == [1, 3]
    # the default lens positions are the step's sink positions: flagged by Eq. 3 in some head
    a = analyze(tmp_path / "ro.arrow")
    flagged = {int(p) for p in a.sinks["pos"][a.sinks["step"] == 2]}
    lens_pos = {int(p) for p in got["lens_positions"] if p >= 0}
    assert lens_pos and lens_pos <= flagged
    d = a.to_dict()
    for key in ("k_sigma", "absorption", "sink_vectors", "massive_activations", "diagonal_heads",
                "distance_profile", "logit_lens", "mask_query_ranking"):
        assert d[key] is not None, key
    assert np.isfinite(a.distance_profile.profile()[0]).all()
    # a corpus run streams the readouts as sums over steps: their mean is the trace's own mean
    from sinklens.analysis.corpus import prompt_part

    part = prompt_part(a)
    diag = part["diagonal_heads"]["diagonal"]
    np.testing.assert_allclose(diag["sum"] / diag["n"], np.nanmean(a.diagonal_heads.diagonal, axis=0), rtol=1e-9)
    ratio = part["massive_activations"]["ratio"]
    np.testing.assert_allclose(ratio["sum"] / ratio["n"], np.nanmean(a.massive_activations.ratio, axis=0), rtol=1e-9)
    assert part["k_sigma"]["sinks_per_step"]["sum"] == sum(len(p) for p in a.k_sigma.positions)
    # the report draws a figure of each, the plain trace (no readouts) standing in as the control
    from sinklens.report.options import ReportOptions
    from sinklens.report.readouts import FIGURES
    from sinklens.report.report import build_report

    rep = build_report([tmp_path / "ro.arrow"], tmp_path / "rep",
                       options=ReportOptions(control=str(tmp_path / "plain.arrow"), progress=False))
    assert set(FIGURES) <= set(rep.traces[0].figures), rep.traces[0].skipped
    assert "Mechanism readouts" in (tmp_path / "rep" / "index.html").read_text()
    # a stand-in control is neither called a random-init control nor silently missing the readouts
    not_random, no_readouts = rep.notes
    assert "is not a random-init control (model 'tiny-dlm'" in not_random
    assert "recorded no diagonal, distance, hidden_norms, lens_layers, qk_norms, value_norms readout" in no_readouts
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["notes"] == rep.notes
    fig = FIGURES["readout_k_sigma"](rep.traces[0].analyses[0], analyze(tmp_path / "plain.arrow"))
    labels = {ln.get_label() for ax in fig.axes for ln in ax.get_lines()}
    assert "plain (control)" in labels and not any("random init" in x for x in labels), labels


def test_mask_query_ranking_reads_the_masked_group():
    """_planted: head (1, 0) gets key 25 only from masked queries and key 3 only from unmasked ones."""
    a = analyze(_planted.source())
    steps = a.mask_query_ranking
    first = steps[0]
    rank = lambda key, top: top.index(key) if key in top else len(top)   # noqa: E731
    assert first["step"] == 0
    assert rank(25, first["masked_top"]) < rank(25, first["all_top"])   # the masked queries' sink rises
    assert rank(3, first["masked_top"]) > rank(3, first["all_top"])     # the unmasked queries' sink falls
    assert len(steps) == sum(1 for c in _planted.MASKED_COUNT if c)     # steps with a masked query row


def test_bad_readout_options_are_one_line_errors():
    with pytest.raises(ValueError, match="lens_positions needs lens_layers"):
        ReadoutOptions(lens_positions=[3])
    with pytest.raises(ValueError, match="lens_layers must be"):
        ReadoutOptions(lens_layers=[-1])


def test_every_readout_option_is_a_request_field():
    """build_request copies each ReadoutOptions field onto the AttentionRequest by name: a field the
    request lacks would be set as a stray attribute and never reach the attention function."""
    from dataclasses import fields

    options = [f.name for f in fields(ReadoutOptions)]
    assert options == list(AttentionRequest.READOUT_FIELDS)
    assert set(options) <= {f.name for f in fields(AttentionRequest)}


def test_arm_decoding_steps_read_the_cache(smollm2, tmp_path):
    """ARM decoding feeds one row against the cache: the cached keys' value norms are those of the
    prefill, the hidden-state readouts cover the fed row only, the lens reads no position it did not compute."""
    import sinklens
    from sinklens.samplers.capture import CaptureOptions

    ids = smollm2.tokenizer("Count: one, two,", return_tensors="pt").input_ids
    capture = CaptureOptions(value_norms=True, hidden_norms=True, lens_layers=[smollm2.num_layers - 1])
    smollm2.generate(ids, max_new_tokens=3, trace=str(tmp_path / "arm.arrow"), capture=capture)
    t = sinklens.open_trace(tmp_path / "arm.arrow")
    first, later = t.readouts(t.steps[0]), t.readouts(t.steps[2])
    P = ids.shape[1]
    assert first["hidden_norm"].shape == (smollm2.num_layers, P) and later["hidden_norm"].shape == (smollm2.num_layers, 1)
    np.testing.assert_allclose(later["value_norm"][..., :P], first["value_norm"], rtol=1e-3)
    S = later["value_norm"].shape[-1]
    assert all(p == -1 or p == S - 1 for p in later["lens_positions"])


@pytest.mark.slow
@pytest.mark.browser
def test_page_shows_the_readouts_panel(tmp_path):
    """headless Chromium (as tests/test_report_html.py): the readout figures get their own panel."""
    import test_report_html as page
    from sinklens.report.options import ReportOptions
    from sinklens.report.report import build_report

    why = page._have_browser()
    if why:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    rep = build_report([_planted.source(label="planted")], tmp_path / "rep", options=ReportOptions(progress=False))
    opts = webdriver.ChromeOptions()
    opts.binary_location = page.CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(page.DRIVER), options=opts)
    try:
        drv.get(rep.html.resolve().as_uri())
        titles = [e.get_attribute("textContent") for e in drv.find_elements(By.CSS_SELECTOR, ".sl-figs > summary")]
        readout_figs = [n for n in rep.traces[0].figures if n.startswith("readout_")]
        assert f"Mechanism readouts ({len(readout_figs)})" in titles and len(readout_figs) == 3
        captions = [e.get_attribute("textContent") for e in drv.find_elements(By.CSS_SELECTOR, ".sl-figs figcaption")]
        assert sorted(c for c in captions if c.startswith("readout_")) == sorted(readout_figs)
        assert page._errors(drv) == []
    finally:
        drv.quit()
