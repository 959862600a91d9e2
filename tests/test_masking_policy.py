"""Sink masking policy on tiny random models: blocked keys get exactly 0 at the next step,
against transformers' eager attention with the same keys masked out."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sinklens.attention import ATTENTION_NAME, AttentionRequest
from sinklens.masking.policy import MaskingConfig, SinkMaskingPolicy

torch.set_num_threads(1)   # 2 shared cores: one thread is several times faster than two under load
L, H, S, V = 3, 4, 10, 64


def tiny(causal: bool):
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=L,
                                     num_attention_heads=H, num_key_value_heads=2, max_position_embeddings=64))
    m.config.is_causal = causal
    m.config._attn_implementation = ATTENTION_NAME
    return m.eval()


def steps(model, policy, tokens, n):
    """A minimal stand-in for a sampler: same canvas each step, the hook around each forward."""
    reqs = []
    for t in range(n):
        req = policy.before_step(t, tokens, torch.zeros_like(tokens, dtype=torch.bool))
        model(tokens, sinklens=req)
        policy.after_step(SimpleNamespace(step=t, attention=req))
        reqs.append(req)
    return reqs


def ids(seed=1, b=1, s=S):
    return torch.randint(0, V, (b, s), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k", [1, 3])
def test_blocked_keys_receive_zero_per_head(k):
    model, x = tiny(False), ids(b=2)
    pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=k), num_layers=L)
    r0, r1 = steps(model, pol, x, 2)
    # the blocked keys of step 1 are the top-k of step 0 per (layer, row, head), ranked independently
    rec0 = r0.received.numpy()
    expected = np.zeros_like(rec0, dtype=bool)
    for l, b, h in np.ndindex(rec0.shape[:3]):
        expected[l, b, h, np.argsort(-rec0[l, b, h], kind="stable")[:k]] = True
    assert np.array_equal(r1.blocked.numpy(), expected)
    assert r0.blocked is None                                   # step 0: unmasked by default
    got = r1.received
    assert (got[r1.blocked] == 0).all()                         # exactly 0, not "small"
    assert (got[~r1.blocked] > 0).all()
    torch.testing.assert_close(got.sum(-1), torch.full((L, 2, H), float(S)))  # rows still sum to 1
    assert pol.summary()["steps_masked"] == 1 and pol.summary()["blocked_entries"] == L * 2 * H * k  # both rows


def test_global_ranking_matches_eager_with_masked_columns():
    """Global ranking blocks the same positions in every layer and head, which an additive 4-D mask
    reproduces in transformers' eager attention: the captures must agree."""
    model, x = tiny(False), ids()
    pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=2, ranking="global"), num_layers=L)
    r0, r1 = steps(model, pol, x, 2)
    pos = r0.received.sum(dim=(0, 2)).topk(2).indices[0]        # (2,)
    assert r1.blocked[:, 0, :, pos].all() and r1.blocked.sum() == L * H * 2
    bias = torch.zeros(1, 1, S, S)
    bias[..., pos] = torch.finfo(torch.float32).min
    model.config._attn_implementation = "eager"
    eager = model(x, attention_mask=bias, output_attentions=True).attentions
    model.config._attn_implementation = ATTENTION_NAME
    ref = torch.stack([a.sum(2) for a in eager])                # (L, B, H, S)
    assert (r1.received - ref).abs().max() < 1e-5


def test_unblocked_layers_unchanged_and_k0_is_plain():
    model, x = tiny(False), ids()
    plain = steps(model, SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=0), num_layers=L), x, 2)
    last = steps(model, SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=1, layers=(L - 1,)), num_layers=L), x, 2)
    assert plain[1].blocked is None
    assert torch.equal(plain[1].received, plain[0].received)
    assert torch.equal(last[1].received[: L - 1], plain[1].received[: L - 1])   # nothing blocked there
    assert not torch.equal(last[1].received[L - 1], plain[1].received[L - 1])
    assert (last[1].received[L - 1][last[1].blocked[L - 1]] == 0).all()


def test_keep_self_and_threshold():
    model, x = tiny(False), ids()
    r = steps(model, SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=1, keep_self=True), num_layers=L), x, 2)[1]
    assert (r.received[r.blocked] > 0).all()                     # its own query still attends to it
    r = steps(model, SinkMaskingPolicy(MaskingConfig(sinks="topk", threshold=1.5), num_layers=L), x, 2)
    assert torch.equal(r[1].blocked, r[0].received >= 1.5)


def test_causal_probe_never_empties_a_row():
    """Causal prefill with step0='probe': key 0 is the sink, yet query 0 (which sees only key 0) keeps it."""
    model, x = tiny(True), ids()
    wrapper = SimpleNamespace(forward_logits=lambda t, attention_mask=None, attention=None:
                              model(t, attention_mask=attention_mask, sinklens=attention).logits)
    pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=1, step0="probe", arm_rule="prefix"), num_layers=L,
                            is_diffusion=False, model=wrapper)
    req = pol.before_step(0, x, torch.zeros_like(x, dtype=torch.bool))
    assert req.blocked is not None
    logits = model(x, sinklens=req).logits
    assert torch.isfinite(logits).all() and torch.isfinite(req.received).all()
    torch.testing.assert_close(req.received.sum(-1), torch.full((L, 1, H), float(S)))


def test_probe_respects_left_padding():
    """The probe pass sees the batch's padding: a left-padded row gets the same sinks as the
    same tokens alone (bidirectional, key padding only), and no padded key is ever blocked."""
    model, x = tiny(False), ids(s=S - 3)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], dim=1)  # (1, S)
    am = torch.cat([torch.zeros(1, 3, dtype=torch.bool), torch.ones_like(x, dtype=torch.bool)], dim=1)
    wrapper = SimpleNamespace(forward_logits=lambda t, attention_mask=None, attention=None:
                              model(t, attention_mask=attention_mask, sinklens=attention).logits)

    def probe_blocked(tokens, mask):
        pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=2, step0="probe"), num_layers=L, model=wrapper)
        return pol.before_step(0, tokens, torch.zeros_like(tokens, dtype=torch.bool), attention_mask=mask).blocked

    alone = probe_blocked(x, torch.ones_like(x, dtype=torch.bool))  # (L, 1, H, S - 3)
    with_pad = probe_blocked(padded, am)  # (L, 1, H, S)
    assert not with_pad[..., :3].any()
    # RoPE is relative, so shifting every real token by 3 positions leaves the ranking unchanged
    assert torch.equal(with_pad[..., 3:], alone)


def test_arm_newest_rule_and_growing_sequence():
    model, x = tiny(True), ids()
    pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=2), num_layers=L, is_diffusion=False)
    r0 = pol.before_step(0, x, torch.zeros_like(x, dtype=torch.bool))
    assert r0.query_mask[0].tolist() == [False] * (S - 1) + [True]   # the newest row only
    model(x, sinklens=r0)
    pol.after_step(SimpleNamespace(attention=r0))
    torch.testing.assert_close(r0.received.sum(-1), torch.ones(L, 1, H))
    x2 = torch.cat([x, ids(2, s=1)], dim=1)
    r1 = pol.before_step(1, x2, torch.zeros_like(x2, dtype=torch.bool))
    assert r1.blocked.shape == (L, 1, H, S + 1) and not r1.blocked[..., -1].any()
    assert torch.equal(r1.blocked[..., :S], pol.stats._held[0][0].blocked)   # the ranked keys, one key more


def test_a_selections_keys_for_a_longer_step_are_its_own_and_never_the_new_ones():
    from sinklens.masking.select import select
    from sinklens.rule import np_rule
    from sinklens.rule.spec import layer_visibilities

    rng = np.random.default_rng(0)
    received = rng.random((L, 2, H, S)).astype(np.float32)
    real = np.ones(S, bool)
    cov = np_rule.coverage(np.arange(S), real, layer_visibilities(L, causal=True))
    cfg = MaskingConfig(sinks="topk", mask_k=2)
    scope = np.ones((2, S), bool)
    plain, roomy = select(received, [cov, cov], scope, cfg), select(received, [cov, cov], scope, cfg, room=1)
    assert torch.equal(plain.blocked, roomy.blocked) and (plain.scores == roomy.scores).all()
    assert plain.blocked.sum() == L * 2 * H * 2
    for sel in (plain, roomy):
        assert sel.blocked_keys(S) is sel.blocked
        for more in (1, 3):   # the room the selection was made with, and more than it
            wider = sel.blocked_keys(S + more)
            assert torch.equal(wider, torch.nn.functional.pad(plain.blocked, (0, more)))
        with pytest.raises(ValueError, match="cannot block"):
            sel.blocked_keys(S - 1)


def test_bad_inputs():
    model, x = tiny(False), ids()
    pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=S + 1), num_layers=L)
    with pytest.raises(ValueError, match="larger than the sequence"):
        steps(model, pol, x, 2)
    with pytest.raises(ValueError, match="mask_k"):
        MaskingConfig(sinks="topk", mask_k=-1)
    with pytest.raises(ValueError, match="probe"):
        SinkMaskingPolicy(MaskingConfig(step0="probe"), num_layers=L)
    with pytest.raises(ValueError, match="out of range"):
        SinkMaskingPolicy(MaskingConfig(layers=(L,)), num_layers=L)


# --- through the real samplers: what was masked goes into the trace -------------------------

def _check_trace(path, k):
    from sinklens import open_trace
    t = open_trace(path)
    assert t.blocked(0).shape == (0, 3)                          # step 0 unmasked
    for step in range(1, t.num_steps):
        prev, cur, blocked = t.received_unblocked(step - 1), t.received(step), t.blocked(step)
        L, H, S_prev = prev.shape
        assert blocked.shape == (L * H * k, 3)                   # K per (layer, head)
        # the blocked keys are the previous step's top-K of that head ...
        for l, h in np.ndindex(L, H):
            pos = sorted(blocked[(blocked[:, 0] == l) & (blocked[:, 1] == h), 2].tolist())
            assert pos == sorted(np.argsort(-prev[l, h], kind="stable")[:k].tolist()), (step, l, h)
        # ... and receive exactly nothing at this step
        assert (cur[blocked[:, 0], blocked[:, 1], blocked[:, 2]] == 0).all()
    return t


@pytest.mark.parametrize("family,kwargs", [("llada", dict(gen_length=8, steps=8, block_length=4)),
                                           ("dream", dict(max_new_tokens=8, steps=8, temperature=0.0))])
def test_dlm_sampler_trace_records_blocked(fixtures_dir, tmp_path, family, kwargs):
    import sinklens
    from sinklens.samplers import CaptureOptions
    m = sinklens.load(str(fixtures_dir / family))
    pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=2), num_layers=m.num_layers)
    ids = torch.arange(10, 22)[None]
    m.generate(ids, hook=pol, trace=str(tmp_path / "t.arrow"), capture=CaptureOptions(received_dtype="float32"),
               **kwargs)
    t = _check_trace(str(tmp_path / "t.arrow"), 2)
    assert t.num_steps == 8 and pol.summary()["steps_masked"] == 7


def test_smollm2_arm_newest_rule_trace(smollm2, tmp_path):
    """The real ARM: sinks of the newest row at step t-1 (first-token sink) blocked at step t."""
    from sinklens.samplers import CaptureOptions
    m = smollm2
    pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=1), num_layers=m.num_layers, is_diffusion=False)
    ids = m.apply_chat_template("What is 2 + 3?")
    m.generate(torch.tensor([ids]), hook=pol, trace=str(tmp_path / "t.arrow"),
               capture=CaptureOptions(received_dtype="float32"), max_new_tokens=3)
    _check_trace(str(tmp_path / "t.arrow"), 1)
    top = dict(pol.summary()["top_positions"])
    assert max(top, key=top.get) == 0                            # SmolLM2's position-0 sink is blocked most


def test_smollm2_arm_prefix_rule_keeps_query0_row(smollm2, tmp_path):
    """Prefix rule: ranked by column sums over every prefix row. Key 0 (the sink) is blocked for all
    queries except query 0, which sees no other key and keeps its row: key 0 then receives exactly 1."""
    from sinklens import open_trace
    from sinklens.samplers import CaptureOptions
    m = smollm2
    pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=1, arm_rule="prefix"), num_layers=m.num_layers, is_diffusion=False)
    ids = m.apply_chat_template("What is 2 + 3?")
    m.generate(torch.tensor([ids]), hook=pol, trace=str(tmp_path / "t.arrow"),
               capture=CaptureOptions(received_dtype="float32", capture_prefix=True), max_new_tokens=2)
    t = open_trace(str(tmp_path / "t.arrow"))
    blocked, cur = t.blocked(1), t.received(1)
    at0 = blocked[:, 2] == 0
    assert at0.sum() > 0 and (~at0).sum() > 0
    got0 = cur[blocked[at0, 0], blocked[at0, 1], 0]
    np.testing.assert_allclose(got0, 1.0, atol=1e-5)
    assert (cur[blocked[~at0, 0], blocked[~at0, 1], blocked[~at0, 2]] == 0).all()


def test_masking_alone_skips_the_query_split_and_changes_nothing_else(fixtures_dir):
    """A masking run without a trace does not compute the masked / unmasked query split (the policy
    ranks on all rows); a trace, or any other hook that reads the attention, still gets it. The
    generation and what was blocked are the same either way."""
    import sinklens
    m = sinklens.load(str(fixtures_dir / "llada"))
    ids = torch.arange(10, 22)[None]
    kwargs = dict(gen_length=8, steps=8, block_length=4)
    seen = {}

    class Reader:
        wants_attention = True

        def __init__(self, name):
            self.name = name

        def after_step(self, event):
            seen.setdefault(self.name, []).append(event.attention.received_groups is not None)

    class Lean(Reader):
        wants_query_groups = False

    runs = {}
    for name, extra in (("alone", []), ("reader", [Reader("reader")]), ("lean", [Lean("lean")])):
        pol = SinkMaskingPolicy(MaskingConfig(sinks="topk", mask_k=1), num_layers=m.num_layers)
        out = m.generate(ids, hook=[pol, *extra], **kwargs)
        runs[name] = (out.sequences, pol.summary())
    assert seen["reader"] == [True] * 8 and seen["lean"] == [False] * 8
    assert all(torch.equal(runs["alone"][0], s) and runs["alone"][1] == summ for s, summ in runs.values())
    assert runs["alone"][1]["steps_masked"] == 7


def test_a_steps_layout_gives_the_ranking_its_visibilities_and_a_new_layout_new_ones():
    """rank_event reads a step's own layout (SDAR's blocks); the policy keeps its visibilities per layout
    object, and a different layout (another block size) is read anew, never served the last one's."""
    from sinklens.trace.layout import TraceLayout

    policy = SinkMaskingPolicy(MaskingConfig(mask_k=1), num_layers=L, is_diffusion=True)
    own = TraceLayout(causal=False)
    assert policy._layout_visibilities(own) is policy.visibilities   # the model's own: the policy's list
    blocks4, blocks2 = TraceLayout(causal=False, attention_block=4), TraceLayout(causal=False, attention_block=2)
    got4 = policy._layout_visibilities(blocks4)
    assert got4 == blocks4.visibilities(L) and got4 != policy.visibilities
    assert policy._layout_visibilities(blocks4) is got4
    assert policy._layout_visibilities(blocks2) == blocks2.visibilities(L) != got4


def test_arm_scope_prompt_and_generated_as_the_canvas_grows(tmp_path):
    """An ARM's canvas grows a key a step past its prompt: scope "prompt" blocks only prompt keys,
    "generated" only the new ones, at every step (the trace's blocked keys), and the record agrees."""
    import sinklens
    from sinklens import open_trace
    from sinklens.experiments.twins import LOAD, arm_sampler, heldout_prompt
    m = sinklens.load("tiny-arm", **LOAD)
    ids = torch.tensor([m.apply_chat_template(heldout_prompt(0))])
    P = ids.shape[1]
    for scope in ("prompt", "generated"):
        pol = SinkMaskingPolicy(MaskingConfig(mask_k=1, scope=scope), num_layers=m.num_layers, is_diffusion=False)
        path = str(tmp_path / f"{scope}.arrow")
        m.generate(ids, hook=pol, trace=path, **dict(arm_sampler(), eos_token_id=[], max_new_tokens=8))
        t = open_trace(path)
        keys = np.concatenate([t.blocked(step)[:, 2] for step in range(2, t.num_steps)])
        assert keys.size and ((keys < P).all() if scope == "prompt" else (keys >= P).all()), scope
        views = [pol._prompt_mask(1, S) for S in (P, P + 3, 4 * P)]   # grown past its room: a new buffer
        assert all(not v.flags.writeable and v.shape == (1, S) and v[0, :P].all() and not v[0, P:].any()
                   for v, S in zip(views, (P, P + 3, 4 * P)))
        assert pol.summary()["prompt_share"] == (1.0 if scope == "prompt" else 0.0)
