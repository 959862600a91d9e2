"""The two capture routes (exact, lse) and the automatic chunk size, against transformers.

References: transformers' own `sdpa_attention_forward` (the lse route's output must be the
same bits), its eager attention with `output_attentions=True` (column sums), and generations
without any capture (token-identical when observed through the lse route).
"""
import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from sinklens.attention import ATTENTION_NAME, AttentionRequest
from sinklens.attention.fused import fused_sdpa_with_lse
from test_attention import B, S, V, padding, run, tiny_model  # tests/ is on sys.path (like _planted)


def fake_module(h, h_kv, causal):
    return types.SimpleNamespace(num_key_value_groups=h // h_kv, is_causal=causal, layer_idx=0)


FUSED = [(dt, kv, causal, pad, s_q) for dt in (torch.float32, torch.bfloat16) for kv in (1, 2, 6)
         for causal in (True, False) for pad in (False, True) for s_q in (1, 7, 19)]


@pytest.mark.parametrize("dtype,kv,causal,pad,s_q", FUSED)
def test_fused_output_is_bitwise_transformers_sdpa(dtype, kv, causal, pad, s_q):
    g = torch.Generator().manual_seed(0)
    h, s_k, d = 6, 19, 16
    q = torch.randn(2, h, s_q, d, generator=g).to(dtype)
    k, v = (torch.randn(2, kv, s_k, d, generator=g).to(dtype) for _ in range(2))
    mask = None
    if pad:  # what sdpa_mask hands the attention: bool, left padding in row 0
        mask = torch.ones(2, 1, s_q, s_k, dtype=torch.bool)
        mask[0, ..., :3] = False
        if causal:
            mask &= torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q)
    ref, _ = sdpa_attention_forward(fake_module(h, kv, causal), q, k, v, mask, scaling=0.3)
    out, lse = fused_sdpa_with_lse(q, k, v, mask, 0.3, causal)
    assert torch.equal(out, ref)
    if not (causal and s_q > 1 and mask is None and s_k > s_q):  # (that case crops keys, as transformers does)
        allowed = torch.ones(s_q, s_k, dtype=torch.bool) if mask is None else mask
        if causal and mask is None and s_q > 1:
            allowed = torch.ones(s_q, s_k, dtype=torch.bool).tril()
        s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float().repeat_interleave(h // kv, 1)) * 0.3
        expect = torch.logsumexp(s.masked_fill(~allowed, float("-inf")), dim=-1)
        seen = allowed.expand(2, 1, s_q, s_k).any(-1).expand_as(lse)  # rows with no key have no lse
        torch.testing.assert_close(lse[seen], expect[seen], atol=1e-4, rtol=1e-4)


def test_fused_one_row_with_a_per_head_mask_is_bitwise_transformers_sdpa():
    """A decoding row whose blocked keys differ per head (mask (B, H, 1, S_k)) under GQA: transformers packs
    the query heads and the mask per kv head; so does the lse route's kernel call."""
    g = torch.Generator().manual_seed(2)
    h, kv, s_k, d = 6, 2, 19, 16
    q = torch.randn(2, h, 1, d, generator=g)
    k, v = (torch.randn(2, kv, s_k, d, generator=g) for _ in range(2))
    mask = torch.ones(2, h, 1, s_k, dtype=torch.bool)
    mask[:, torch.arange(h), 0, torch.arange(h) * 3] = False
    ref, _ = sdpa_attention_forward(fake_module(h, kv, True), q, k, v, mask, scaling=0.3)
    out, _ = fused_sdpa_with_lse(q, k, v, mask, 0.3, True)
    assert torch.equal(out, ref)


ROUTE_CASES = [(k, c, p, g) for k in ("llama", "qwen2") for c in (True, False) for p in ("none", "left") for g in (1, 4)]


@pytest.mark.parametrize("kind,causal,pad,kv", ROUTE_CASES)
def test_lse_route_logits_are_plain_and_sums_are_eager(kind, causal, pad, kv):
    model = tiny_model(kind, causal, kv)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
    am = padding(pad)
    real = am.bool()
    eager = run(model, "eager", ids, am, output_attentions=True)
    plain = run(model, ATTENTION_NAME, ids, am).logits

    groups = torch.where(real, torch.arange(S) % 2, -1)
    req = AttentionRequest(capture=True, query_mask=real, query_groups=groups, num_groups=2,
                           map_slices=((1, 3),), query_chunk=5, route="lse")
    logits = run(model, ATTENTION_NAME, ids, am, sinklens=req).logits
    assert torch.equal(logits, plain)  # observing changes nothing, to the bit

    expected = torch.stack([(a * real[:, None, :, None]).sum(2) for a in eager.attentions])  # (L, B, H, S)
    assert (req.received - expected).abs().max() < 1e-5
    for g in (0, 1):
        rows = (real & (groups == g))[:, None, :, None]
        exp_g = torch.stack([(a * rows).sum(2) for a in eager.attentions])
        assert (req.received_groups[:, :, g] - exp_g).abs().max() < 1e-5
    m = req.maps[(1, 3)]  # (B, S, S): exact on real rows
    assert (m - eager.attentions[1][:, 3])[real].abs().max() < 1e-5


@pytest.mark.parametrize("route", ["exact", "lse"])
@pytest.mark.parametrize("causal", [True, False])
def test_blocked_keys_both_routes(route, causal):
    """Capture + blocking: the model's output equals mask-only mode (sdpa with the keys blocked,
    bit-identical in the lse route), received is 0 on the blocked key, and received_unblocked
    equals a run without blocking."""
    model = tiny_model("llama", causal, 2)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(3))
    am = padding("left")
    blocked = torch.zeros(3, B, 4, S, dtype=torch.bool)
    blocked[1, :, 2, 5] = True
    masked_only = run(model, ATTENTION_NAME, ids, am, sinklens=AttentionRequest(blocked=blocked)).logits
    req = AttentionRequest(capture=True, query_mask=am.bool(), blocked=blocked, query_chunk=4, route=route)
    logits = run(model, ATTENTION_NAME, ids, am, sinklens=req).logits
    real = am.bool()
    if route == "lse":
        assert torch.equal(logits, masked_only)
    else:
        assert (logits - masked_only)[real].abs().max() < 1e-5
    assert (req.received[1, :, 2, 5] == 0).all()
    # layer 1's unblocked sums = its sums in a run where layer 0 is the same and nothing is blocked
    free = AttentionRequest(capture=True, query_mask=real, route=route)
    run(model, ATTENTION_NAME, ids, am, sinklens=free)
    assert (req.received_unblocked[:2] - free.received[:2]).abs().max() < 1e-5


def test_bf16_column_sums_within_1e3_of_fp32():
    """bf16 inputs: both routes' column sums vs a float32 softmax of the same bf16 q, k."""
    from sinklens.attention.function import sinklens_attention
    g = torch.Generator().manual_seed(0)
    h, kv, s, d = 8, 2, 300, 64
    q = (torch.randn(1, h, s, d, generator=g) * 2).bfloat16()
    k = (torch.randn(1, kv, s, d, generator=g) * 2).bfloat16()
    v = torch.randn(1, kv, s, d, generator=g).bfloat16()
    for causal, route in ((True, "lse"), (False, "lse"), (True, "exact"), (False, "exact")):
        req = AttentionRequest(capture=True, route=route)
        sinklens_attention(fake_module(h, kv, causal), q, k, v, None, sinklens=req)
        scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float().repeat_interleave(h // kv, 1)) / d**0.5
        if causal:
            scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
        ref = scores.softmax(-1).sum(2)  # (1, H, S)
        rel = ((req.received[0] - ref).abs() / ref.abs().clamp(min=1e-6)).max()
        assert rel < 1e-3, (causal, route, rel)


def test_auto_chunk_matches_tiny_chunks():
    model = tiny_model("llama", True, 2)
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(4))
    auto, tiny = AttentionRequest(capture=True), AttentionRequest(capture=True, query_chunk=1)
    for req in (auto, tiny):
        run(model, ATTENTION_NAME, ids, None, sinklens=req)
    assert (auto.received - tiny.received).abs().max() < 1e-5


def test_bad_route_is_one_clear_line():
    with pytest.raises(ValueError, match="route must be one of auto, compiled, exact, lse, triton"):
        AttentionRequest(route="fast")


@pytest.mark.slow
def test_smollm2_generation_token_identical_when_traced_through_lse(smollm2, tmp_path):
    """64 greedy tokens, untraced vs traced (lse route): the same tokens."""
    from sinklens.samplers import CaptureOptions
    ids = torch.tensor([smollm2.apply_chat_template("Name three rivers in Europe and say where they flow.")])
    plain = smollm2.generate(ids, max_new_tokens=64).sequences
    traced = smollm2.generate(ids, max_new_tokens=64, trace=str(tmp_path / "t.arrow"),
                              capture=CaptureOptions(route="lse")).sequences
    assert torch.equal(plain, traced)


def test_tiny_dlm_generation_token_identical_when_traced_through_lse(tmp_path):
    import sinklens
    from sinklens.samplers import CaptureOptions
    from sinklens.experiments.twins import LOAD, dlm_sampler, heldout_prompt
    m = sinklens.load("tiny-dlm", **LOAD)
    ids = torch.tensor([m.apply_chat_template(heldout_prompt(0))])
    plain = m.generate(ids, **dlm_sampler()).sequences
    traced = m.generate(ids, trace=str(tmp_path / "t.arrow"), capture=CaptureOptions(route="lse"),
                        **dlm_sampler()).sequences
    assert torch.equal(plain, traced)


WHOLE_CASES = [(kv, causal, pad, s_q, block, groups) for kv in (1, 3) for causal in (True, False)
               for pad in (False, True) for s_q in (1, 9) for block in (False, True) for groups in (False, True)]


@pytest.mark.parametrize("kv,causal,pad,s_q,block,groups", WHOLE_CASES)
def test_small_layer_whole_equals_the_chunk_loop(kv, causal, pad, s_q, block, groups):
    """A small layer is captured in one pass (`exact_whole.capture_whole`, the exact route at these sizes); forcing
    the chunk loop (query_chunk) must give the same output and the same received / groups /
    unblocked sums, with GQA, a causal mask, left padding (a padded query sees no key: the whole
    pass hands it to the loop), one query row (ARM decoding) and blocked keys."""
    from sinklens.attention.function import sinklens_attention
    from sinklens.attention.routes.exact_whole import SMALL_SCORES

    g = torch.Generator().manual_seed(3)
    h, s_k, d = 6, 13, 8
    assert 2 * h * s_q * s_k <= SMALL_SCORES
    q = torch.randn(2, h, s_q, d, generator=g)
    k, v = (torch.randn(2, kv, s_k, d, generator=g) for _ in range(2))
    mask = None
    if pad or causal:
        mask = torch.ones(2, 1, s_q, s_k, dtype=torch.bool)
        if pad:
            mask[0, ..., :3] = False
        if causal:
            mask &= torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q)
    qmask = torch.ones(2, s_q, dtype=torch.bool)
    qmask[1, 0] = False
    blocked = None
    if block:  # (L=1, B, H, S_k): a key per head, nothing in head 0 of row 1
        blocked = torch.zeros(1, 2, h, s_k, dtype=torch.bool)
        blocked[0, :, torch.arange(h), torch.arange(h) % s_k] = True
        blocked[0, 1, 0] = False

    def run_one(chunk):
        req = AttentionRequest(capture=True, query_mask=qmask, blocked=blocked, query_chunk=chunk, route="exact",
                               query_groups=torch.arange(s_q).remainder(2).expand(2, s_q) if groups else None,
                               num_groups=2 if groups else 0)
        out, _ = sinklens_attention(fake_module(h, kv, causal), q, k, v, mask, scaling=0.4, sinklens=req)
        return out, req

    whole, r_whole = run_one(None)
    loop, r_loop = run_one(4)
    torch.testing.assert_close(whole, loop, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(r_whole.received, r_loop.received, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(r_whole.received_unblocked, r_loop.received_unblocked, atol=1e-6, rtol=1e-5)
    if groups:
        torch.testing.assert_close(r_whole.received_groups, r_loop.received_groups, atol=1e-6, rtol=1e-5)
    if block and not causal:  # a blocked key receives nothing (a causal row left with only blocked keys keeps them)
        assert r_whole.received[0][blocked[0]].abs().max() == 0


@pytest.mark.parametrize("all_keys", [False, True])
def test_one_decoding_row_blocked_in_the_whole_pass_equals_the_chunk_loop(all_keys):
    """One query row that sees every key (ARM decoding): the whole-layer pass takes the softmax over the
    keys left; a head whose every key is blocked keeps them all (as the chunk loop: never 0/0)."""
    from sinklens.attention.function import sinklens_attention

    g = torch.Generator().manual_seed(5)
    h, s_k, d = 4, 11, 8
    q = torch.randn(2, h, 1, d, generator=g) * 3
    k, v = (torch.randn(2, h, s_k, d, generator=g) for _ in range(2))
    blocked = torch.zeros(1, 2, h, s_k, dtype=torch.bool)
    blocked[0, :, :, 2] = True
    blocked[0, 1, 3, 7] = True
    if all_keys:
        blocked[0, 0, 1] = True   # row 0, head 1: every key blocked

    def run_one(chunk):
        req = AttentionRequest(capture=True, blocked=blocked, query_chunk=chunk, route="exact")
        out, _ = sinklens_attention(fake_module(h, h, True), q, k, v, None, scaling=0.4, sinklens=req)
        return out, req

    whole, r_whole = run_one(None)
    loop, r_loop = run_one(4)
    torch.testing.assert_close(whole, loop, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(r_whole.received, r_loop.received, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(r_whole.received_unblocked, r_loop.received_unblocked, atol=1e-6, rtol=1e-5)
    kept_all = blocked[0].clone()
    if all_keys:
        kept_all[0, 1] = False   # that head kept its keys
    assert r_whole.received[0][kept_all].abs().max() == 0
    assert torch.allclose(r_whole.received[0].sum(-1), torch.ones(2, h))


def _eager_module(kind: str, h: int, h_kv: int, causal: bool, sinks: torch.Tensor | None):
    """A layer whose plain route is its modeling file's eager function (what transformers runs for
    softcapping and sink logits): the sinklens attention finds it by the module's class."""
    import importlib

    name = f"transformers.models.{kind}.modeling_{kind}"
    importlib.import_module(name)
    cls = type(f"Fake{kind}", (), {"__module__": name})
    module = cls()
    module.num_key_value_groups, module.is_causal, module.layer_idx, module.training = h // h_kv, causal, 0, False
    module.sinks = sinks
    return module


# (model, causal): sdpa under Dream's mask (a pad's row sees no key) and under a causal mask with left padding
# (a left pad sees no key); a softcapping model (Gemma2's eager) and one with learned sink logits (gpt-oss')
EMPTY_MODELS = [("sdpa", False), ("sdpa", True), ("gemma2", False), ("gpt_oss", True)]
# the capture routes, without and with blocked keys, and the masking's blocked path without capture
EMPTY_ROUTES = [(r, b) for b in (False, True) for r in ("whole", "chunks", "lse", "compiled")] + [("mask-only", True)]


@pytest.mark.parametrize("route,blocking", EMPTY_ROUTES, ids=[f"{r}-{'blocked' if b else 'free'}" for r, b in EMPTY_ROUTES])
@pytest.mark.parametrize("model,causal", EMPTY_MODELS)
def test_a_row_with_no_key_gets_the_plain_output_and_adds_nothing(model, causal, route, blocking, monkeypatch):
    """A query row that may see no key: every capture route (the whole-layer pass, the chunk loop, the
    lse route, the compiled kernel) and the masking's blocked path give it what the model's own attention gives it (sdpa: 0,
    from transformers' sdpa_attention_forward; eager: its modeling file's function under the additive
    mask transformers' eager mask holds), and it adds nothing to any column sum: received equals the
    eager maps summed over the rows that see a key, with no query mask to hide the others."""
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward as qwen2_eager

    import sinklens.attention.function as function
    import sinklens.attention.routes.exact as exact
    from sinklens.attention.routes.plain import own_eager

    g = torch.Generator().manual_seed(5)
    h, kv, s, d = 4, 2, 10, 8
    q = torch.randn(2, h, s, d, generator=g)
    k, v = (torch.randn(2, kv, s, d, generator=g) for _ in range(2))
    real = torch.ones(2, s, dtype=torch.bool)
    real[0, 6:] = False  # right padding
    real[1, :2] = False  # left padding
    if causal:  # the left pads of row 1 see no key
        mask = real[:, None, None, :] & torch.ones(s, s, dtype=torch.bool).tril()
    else:  # Dream's own mask: every pad's row sees no key
        mask = real[:, None, :, None] & real[:, None, None, :]
    empty = ~mask.any(-1)  # (B, 1, S)
    assert empty.any()
    blocked = None
    allowed = mask
    if blocking:  # keys 3 and 7 in head 1, key 4 in head 2 of row 1: no row loses every key it sees
        blocked = torch.zeros(1, 2, h, s, dtype=torch.bool)
        blocked[0, :, 1, [3, 7]] = True
        blocked[0, 1, 2, 4] = True
        allowed = mask & ~blocked[0][:, :, None, :]  # (B, H, S, S)
    sinks = torch.randn(h, generator=g) * 2 if model == "gpt_oss" else None
    kwargs = {"softcap": 3.0} if model == "gemma2" else {"s_aux": sinks} if model == "gpt_oss" else {}
    module = fake_module(h, kv, causal) if model == "sdpa" else _eager_module(model, h, kv, causal, sinks)
    module.training = False  # (the eager functions read it)

    # the plain route's output: the model's own attention over the allowed keys
    bias = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    if model == "sdpa":
        ref, _ = sdpa_attention_forward(module, q, k, v, allowed, scaling=0.4)
    else:
        ref, _ = own_eager(module)(module, q, k, v, bias, scaling=0.4, **kwargs)
    # the probabilities every summed row spends (transformers' eager maps; softcap / sinks as the model has them)
    eager_of = qwen2_eager if model == "sdpa" else own_eager(module)
    _, maps = eager_of(module, q, k, v, bias, scaling=0.4, **kwargs)
    _, free_maps = eager_of(module, q, k, v, torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min),
                            scaling=0.4, **kwargs)
    seen = (~empty)[..., None].float()  # (B, 1, S, 1)

    if route == "whole" and model != "gpt_oss":  # learned sinks take the chunk loop
        monkeypatch.setattr(exact, "capture", lambda *a, **kw: pytest.fail("the whole-layer pass fell back"))
    if route == "compiled":
        pytest.importorskip("scipy")
        monkeypatch.setattr(exact, "capture", lambda *a, **kw: pytest.fail("the compiled route fell back"))
    req = AttentionRequest(capture=route != "mask-only", blocked=blocked,
                           route=route if route in ("lse", "compiled") else "exact",
                           query_chunk=None if route == "whole" else 4)
    out, _ = function.sinklens_attention(module, q, k, v, mask, scaling=0.4, sinklens=req, **kwargs)

    rows = empty[:, 0]  # (B, S): the rows that see no key
    if model == "sdpa":
        assert torch.equal(out[rows], torch.zeros_like(out[rows]))  # sdpa's own: 0, not uniform, not NaN
        assert torch.equal(ref[rows], out[rows])
    else:
        torch.testing.assert_close(out[rows], ref[rows], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out[~rows], ref[~rows], atol=1e-5, rtol=1e-5)
    if route == "mask-only":
        return
    torch.testing.assert_close(req.received[0], (maps * seen).sum(2), atol=1e-5, rtol=1e-5)
    # every row that sees a key spends 1 (on keys or on the learned sink); the others spend nothing
    spent = req.received[0].sum(-1) + (0 if req.learned_sink is None else req.learned_sink[0])
    torch.testing.assert_close(spent, (~empty[:, 0]).sum(-1, keepdim=True).float().expand(2, h))
    if blocking:
        torch.testing.assert_close(req.received_unblocked[0], (free_maps * seen).sum(2), atol=1e-5, rtol=1e-5)
