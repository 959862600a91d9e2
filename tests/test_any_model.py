"""Any transformers model whose attention runs through its AttentionInterface: one tiny random
checkpoint per architecture (float32, 2 layers, built here, saved as safetensors, loaded through
`sinklens.load(folder)`), each checked against transformers' own code:

- captured received attention (exact and lse routes) == the column sums over real query rows of
  transformers' *eager* attention maps (`output_attentions=True`), every layer and head, |Δ| <= 1e-5,
  on a left-padded batch; gpt-oss: received + learned sink = the number of query rows;
- plain logits (no request) bit-identical to the model's default attention (sdpa, or eager where
  transformers has no sdpa for it: softcapping, sink logits);
- traced greedy generation == transformers' own `generate` (ARMs);
- `attention_windows` == where transformers' own masks put exact zeros.

The "supported models" table of docs/models.md is rendered from ARCHS (`python tests/test_any_model.py`
prints it; a test checks the page holds it).
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import sinklens
from sinklens.attention import AttentionRequest

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
WINDOW = 4  # sliding window of the tiny configs: shorter than the test sequences (12 tokens)
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=128, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
TWO_KINDS = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW)

# name -> (model_type, config beyond SMALL, what it exercises). Order = the docs table's.
ARCHS = {
    "llama": ("llama", {}, "GQA"),
    "qwen2": ("qwen2", {}, "q/k/v biases"),
    "qwen3": ("qwen3", {}, "QK-norm"),
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32), "QK-norm, MoE"),
    "mistral": ("mistral", dict(sliding_window=WINDOW), "sliding window on every layer"),
    "gemma2": ("gemma2", dict(TWO_KINDS, attn_logit_softcapping=3.0, query_pre_attn_scalar=24),
               "logit softcapping, query_pre_attn_scalar scaling, sliding + full layers"),
    "gemma3": ("gemma3_text", dict(TWO_KINDS, query_pre_attn_scalar=24), "sliding + full layers, QK-norm, query_pre_attn_scalar"),
    "phi3": ("phi3", {}, "fused qkv projection"),
    "olmo2": ("olmo2", {}, "QK-norm"),
    "granite": ("granite", dict(attention_multiplier=0.3), "non-standard scaling (attention_multiplier)"),
    "gpt_oss": ("gpt_oss", dict(TWO_KINDS, num_local_experts=4, num_experts_per_tok=2),
                "learned sink logits, sliding + full layers, MoE"),
    "bert": ("bert", dict(num_key_value_heads=None, head_dim=None), "encoder, absolute positions"),
    "modernbert": ("modernbert", dict(num_key_value_heads=None, head_dim=None, local_attention=2 * WINDOW,
                                      global_attn_every_n_layers=2, cls_token_id=1, sep_token_id=2),
                   "encoder, local (bidirectional sliding) + global layers"),
}
ENCODERS = ("bert", "modernbert")


def config_of(name: str):
    from transformers import AutoConfig

    model_type, extra, _ = ARCHS[name]
    kw = {k: v for k, v in {**SMALL, **extra}.items() if v is not None}
    return AutoConfig.for_model(model_type, **kw)


_BUILT: dict[str, Path] = {}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> folder of a tiny random checkpoint saved by transformers (built on first use)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    def build(name: str) -> Path:
        if name not in _BUILT:
            torch.manual_seed(0)
            config = config_of(name)
            config.initializer_range = 0.2  # peaked logits: greedy decoding has no near-ties
            # ModernBERT with its masked-LM head (dropped at load); BERT as BertModel (a masked-LM
            # BERT has no pooler, which a headless BertModel would miss)
            cls = {"bert": AutoModel, "modernbert": AutoModelForMaskedLM}.get(name, AutoModelForCausalLM)
            model = cls.from_config(config)
            for mod in model.modules():  # gpt-oss: sink logits large enough to take a visible share
                if isinstance(getattr(mod, "sinks", None), torch.nn.Parameter):
                    mod.sinks.data = torch.randn(mod.sinks.shape) * 2
            folder = tmp_path_factory.mktemp(name)
            model.save_pretrained(folder, safe_serialization=True)
            _BUILT[name] = folder
        return _BUILT[name]

    return build


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(2, 12) ids with row 0 left-padded by 3, and its attention mask."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, SMALL["vocab_size"], (2, 12), generator=g)
    am = torch.ones_like(ids)
    ids[0, :3], am[0, :3] = 0, 0
    return ids, am


def reference(folder: Path, name: str, attn: str | None):
    """transformers' own model for the folder: `attn` = "eager", or None for its default attention."""
    from transformers import AutoModel, AutoModelForCausalLM

    cls = AutoModel if name in ENCODERS else AutoModelForCausalLM
    kw = {} if attn is None else {"attn_implementation": attn}
    return cls.from_pretrained(str(folder), **kw).eval()


def run(model, m, ids, am, **kw):
    """The reference's forward on the inputs sinklens feeds (its position ids under left padding)."""
    pos = m.position_ids_for(am)
    extra = {} if pos is None else {"position_ids": pos}
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=am, **extra, **kw)


@pytest.mark.parametrize("name", list(ARCHS))
def test_capture_equals_eager_and_plain_equals_default(name, folders):
    folder = folders(name)
    m = sinklens.load(folder)
    assert m.family.name == ARCHS[name][0] and m.family.causal == (name not in ENCODERS)
    ids, am = batch()
    eager = run(reference(folder, name, "eager"), m, ids, am, output_attentions=True)
    rows = am.float()  # real query rows (B, S)
    expected = torch.stack([torch.einsum("bhqk,bq->bhk", a.float(), rows) for a in eager.attentions])  # (L, B, H, S)
    forward = m.encode if name in ENCODERS else m.forward_logits
    for route in ("exact", "lse"):
        req = AttentionRequest(capture=True, route=route)
        forward(ids, am, attention=req)
        got = req.received
        assert got.shape == expected.shape
        for b in range(2):  # keys at pad positions: eager spreads a pad row's nothing there; compare real keys
            real = am[b].bool()
            delta = (got[:, b][..., real] - expected[:, b][..., real]).abs().max().item()
            assert delta <= 1e-5, f"{name} route {route} row {b}: max |received - eager| = {delta:.2e}"
        if name == "gpt_oss":  # the sinks' share is what eager's rows miss of 1
            sink = req.learned_sink  # (L, B, H)
            assert sink is not None and sink.min() > 0.01
            total = got.sum(-1) + sink  # every query row's probabilities, sink included, sum to 1
            torch.testing.assert_close(total, rows.sum(-1)[None, :, None].expand_as(total), atol=1e-4, rtol=0)
            torch.testing.assert_close(sink, rows.sum(-1)[None, :, None] - expected.sum(-1), atol=1e-4, rtol=0)
        else:
            assert req.learned_sink is None

    # transformers' own output_attentions=True through the sinklens attention: eager's maps (real query rows)
    ours = run(m.model, m, ids, am, output_attentions=True).attentions
    for layer, (a, e) in enumerate(zip(ours, eager.attentions)):
        delta = (a - e).abs()[rows.bool()[:, None, :, None].expand_as(a)].max().item()
        assert delta <= 1e-5, f"{name} layer {layer}: output_attentions differs from eager by {delta:.2e}"

    default = run(reference(folder, name, None), m, ids, am)
    if name in ENCODERS:
        assert torch.equal(m.encode(ids, am), default.last_hidden_state.float())
    else:
        assert torch.equal(m.forward_logits(ids, am), default.logits.float())


@pytest.mark.parametrize("name", [n for n in ARCHS if n not in ENCODERS])
def test_traced_greedy_generation_equals_transformers(name, folders, tmp_path):
    folder = folders(name)
    m = sinklens.load(folder)
    ids, am = batch()
    ref = reference(folder, name, None)
    with torch.no_grad():
        want = ref.generate(input_ids=ids, attention_mask=am, max_new_tokens=6, do_sample=False, eos_token_id=None,
                            pad_token_id=0)
    out = m.generate(ids, am, max_new_tokens=6, eos_token_id=[], trace=tmp_path / "t.arrow")
    assert torch.equal(out.sequences, want)
    trace = sinklens.open_trace(tmp_path / "t.arrow")
    assert trace.num_steps == 6 and trace.num_layers == 2


@pytest.mark.parametrize("name", list(ARCHS))
def test_attention_windows_match_transformers_masks(name, folders):
    """Each layer's window, as `attention_windows` states it, is exactly where transformers' own
    eager maps are zero (unpadded row; beyond the window and, for causal layers, the future)."""
    folder = folders(name)
    m = sinklens.load(folder)
    ids, am = batch()
    eager = run(reference(folder, name, "eager"), m, ids, am, output_attentions=True)
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    windows = m.attention_windows  # None: no layer slides
    sliding = "mistral" in name or "sliding_attention" in ARCHS[name][1].get("layer_types", ()) or name == "modernbert"
    assert (windows is not None) == sliding
    windows = windows or (None,) * m.num_layers
    assert len(windows) == 2 and any(w is None for w in windows) == (name != "mistral")
    for layer, w in enumerate(windows):
        if m.family.causal:
            seen = (j <= i) & (True if w is None else j > i - w)
        else:
            seen = torch.ones(12, 12, dtype=torch.bool) if w is None else (i - j).abs() <= w
        zero = eager.attentions[layer][1] == 0  # (H, S, S) row 1 has no padding
        assert torch.equal(zero, ~seen.expand_as(zero)), f"{name} layer {layer}: window {w} is not transformers' mask"


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_blocked_keys_keep_softcapping_and_sinks(name, folders):
    """Sink masking on models sdpa cannot express: mask only (the model's own eager function with
    the blocked keys in its additive mask) and capture agree (lse route: bit for bit, it takes that
    output); blocked keys receive 0, every row still sums to 1 with the learned sink, and the
    unblocked ranking source of layer 0 is the unblocked capture."""
    m = sinklens.load(folders(name))
    ids, am = batch()
    blocked = torch.zeros(2, 2, 4, 12, dtype=torch.bool)  # (L, B, H, S_k): key 6 in every layer and head
    blocked[..., 6] = True
    masked = m.forward_logits(ids, am, attention=AttentionRequest(blocked=blocked))
    assert (masked - m.forward_logits(ids, am)).abs().max() > 1e-3  # blocking changed the model
    free = AttentionRequest(capture=True, route="exact")
    m.forward_logits(ids, am, attention=free)
    rows = am.float().sum(-1)[None, :, None]  # (1, B, 1) real query rows
    for route in ("exact", "lse"):
        req = AttentionRequest(capture=True, blocked=blocked, route=route)
        logits = m.forward_logits(ids, am, attention=req)
        if route == "lse":
            assert torch.equal(logits, masked)
        real = am.bool()  # logits at pad rows mean nothing (docs/models.md)
        torch.testing.assert_close(logits[real], masked[real], atol=1e-5, rtol=0)
        assert req.received[..., 6].max() == 0
        sink = 0.0 if req.learned_sink is None else req.learned_sink
        torch.testing.assert_close(req.received.sum(-1) + sink, rows.expand(2, 2, 4), atol=1e-5, rtol=0)
        torch.testing.assert_close(req.received_unblocked[0], free.received[0], atol=1e-6, rtol=0)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton (extra gpu) is not installed")
@pytest.mark.parametrize("name", ["gemma2", "gpt_oss"])
def test_triton_route_falls_back_for_softcapping_and_sinks(name, folders):
    """The fused kernel has neither; an unpadded call (where it would apply) takes the lse route."""
    m = sinklens.load(folders(name))
    ids = batch()[0][1:]  # the unpadded row
    got, want = AttentionRequest(capture=True, route="triton"), AttentionRequest(capture=True, route="lse")
    assert torch.equal(m.forward_logits(ids, attention=got), m.forward_logits(ids, attention=want))
    assert torch.equal(got.received, want.received)


# ---- refusals ------------------------------------------------------------------------------

def test_a_model_that_bypasses_the_attention_interface_is_refused_in_one_line(tmp_path):
    """BLOOM computes ALiBi attention in its own code: sinklens would see nothing, so it refuses."""
    from transformers import BloomConfig, BloomForCausalLM

    BloomForCausalLM(BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=64)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^BloomForCausalLM computes its attention in its own code, not through "
                                         r"transformers' AttentionInterface[^\n]*$"):
        sinklens.load(tmp_path)


def test_layers_that_are_not_softmax_attention_are_refused_in_one_line(tmp_path):
    """MiniMax routes its softmax layers through the interface, but its linear-attention layers
    have no attention map: a trace of it would miss layers, so it is refused."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("minimax", **{**SMALL, "intermediate_size": 32}, num_local_experts=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^MiniMaxForCausalLM has layers of type \['linear_attention'\]: sinklens "
                                         r"captures softmax attention over all keys or a sliding window only"):
        sinklens.load(tmp_path)


def test_an_attention_argument_sinklens_does_not_implement_is_refused(folders):
    """An argument the attention function would have to honour (here DeepSeek-V3.2's sparse `indices`)
    is refused, not dropped."""
    from sinklens.attention.function import sinklens_attention

    m = sinklens.load(folders("llama"))
    attn = m.model.model.layers[0].self_attn
    q, k = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 3, 16)
    with pytest.raises(ValueError, match=r"^LlamaAttention \(layer 0\) passes indices=a Tensor to its attention "
                                         r"function, which the sinklens attention does not implement$"):
        sinklens_attention(attn, q, k, k, None, indices=torch.zeros(3))


def test_a_sliding_layer_without_its_mask_is_refused(folders):
    from sinklens.attention.function import sinklens_attention

    m = sinklens.load(folders("mistral"))
    attn = m.model.model.layers[0].self_attn
    q, k = torch.zeros(1, 4, 1, 16), torch.zeros(1, 2, WINDOW + 1, 16)
    with pytest.raises(ValueError, match="sliding window of 4 but got no mask over 5 keys"):
        sinklens_attention(attn, q, k, k, None, sliding_window=WINDOW)


# ---- the docs table ---------------------------------------------------------------------------

def table() -> str:
    """The "supported models" table of docs/models.md, rendered from ARCHS."""
    lines = ["| architecture | `model_type` (family name) | kind | exercised |", "|---|---|---|---|"]
    for name, (model_type, _, what) in ARCHS.items():
        kind = "encoder" if name in ENCODERS else "ARM"
        lines.append(f"| {name} | `{model_type}` | {kind} | {what} |")
    return "\n".join(lines)


def test_docs_table_is_this_list():
    page = (REPO / "docs" / "models.md").read_text()
    found = re.search(r"<!-- supported-models:begin -->\n(.*?)\n<!-- supported-models:end -->", page, re.S)
    assert found, "docs/models.md lacks the supported-models table markers"
    assert found.group(1) == table(), "docs/models.md's table differs: regenerate with python tests/test_any_model.py"


if __name__ == "__main__":
    print(table())


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_the_sink_rule_sees_what_the_window_lets_through(name, folders, tmp_path):
    """The trace records each layer's window; at every step the sink rule's visible keys are
    exactly the keys the summed query rows' attention reached (the newest row of a decoding step
    sees only its window), so keys beyond the window are never in Eq. 3's mean."""
    import numpy as np

    from sinklens.analysis.analyze import step_scores
    from sinklens.analysis.source import as_source
    from sinklens.samplers import CaptureOptions

    m = sinklens.load(folders(name))
    ids, _ = batch()
    out = m.generate(ids[1:], max_new_tokens=6, eos_token_id=[], trace=tmp_path / "t.arrow",
                     capture=CaptureOptions(received_dtype="float32"))
    src = as_source(out.trace_path)
    assert src.layout.windows == m.attention_windows and src.layout.window_kind == "causal"
    vis = src.layout.visibilities(src.num_layers)
    hidden = 0
    for t in range(src.num_steps):
        d = src.step_data(t)
        _, visible = step_scores(d, "scaled_sum", vis)                       # (L, S)
        np.testing.assert_array_equal(visible, d.received.sum(1) > 0)
        hidden += int((~visible & d.key_mask).sum())
    assert hidden > 0                                                        # the window did hide keys
