"""The routes people already use: `output_attentions=True`, `run_with_cache`, bertviz, circuitsvis.

References nobody here wrote: transformers' eager attention (the same weights with
`set_attn_implementation("eager")`), bertviz's own input formatting (`format_attention`,
`head_view`) and circuitsvis' renderers. Models: the shipped twins, in float32.
"""
import json
import sys

import numpy as np
import pytest
import torch

import sinklens
from sinklens import export
from sinklens.analysis import AnalysisInputError
from sinklens.attention import AttentionRequest
from sinklens.samplers import CaptureOptions


@pytest.fixture(scope="module", params=["tiny-dlm", "tiny-arm"])
def twin(request):
    return sinklens.load(request.param, dtype="float32")


def _ids(m, b=2, s=14):
    return torch.randint(3, m.model.config.vocab_size, (b, s), generator=torch.Generator().manual_seed(0))


def _eager(m, ids, am=None):
    m.model.set_attn_implementation("eager")
    try:
        return m.model(ids, attention_mask=am, output_attentions=True, use_cache=False).attentions
    finally:
        m.model.set_attn_implementation("sinklens")


def test_output_attentions_equal_eager(twin):
    ids = _ids(twin)
    am = torch.ones_like(ids)
    am[1, :3] = 0                                            # left padding in row 1
    out = twin.model(ids, attention_mask=am, output_attentions=True, use_cache=False)
    ref = _eager(twin, ids, am)
    assert len(out.attentions) == len(ref) == twin.num_layers
    real = am.bool()
    for a, e in zip(out.attentions, ref):
        assert a.shape == e.shape == (2, twin.num_heads, 14, 14)
        assert (a - e)[real[:, None, :, None].expand_as(a)].abs().max() < 1e-5   # real query rows
    plain = twin.model(ids, attention_mask=am, use_cache=False).logits
    assert (out.logits - plain)[real].abs().max() < 1e-4            # same model output either way


def test_output_attentions_keeps_a_callers_request(twin):
    """A capture request and output_attentions together: the request gets its column sums (equal
    to the returned maps summed over queries) and no maps it did not ask for."""
    ids = _ids(twin, b=1)
    req = AttentionRequest(capture=True, map_slices=((1, 2),))
    out = twin.model(ids, output_attentions=True, use_cache=False, sinklens=req)
    col = torch.stack([a.sum(2) for a in out.attentions])             # (L, B, H, S)
    assert (req.received - col).abs().max() < 1e-4
    assert set(req.maps) == {(1, 2)} and torch.allclose(req.maps[(1, 2)], out.attentions[1][:, 2])


def test_run_with_cache_names_and_values(twin):
    ids = _ids(twin, b=1)
    ref = _eager(twin, ids)
    logits, cache = twin.run_with_cache(ids)
    L = twin.num_layers
    assert sorted(cache) == sorted([f"blocks.{l}.attn.hook_pattern" for l in range(L)]
                                   + [f"blocks.{l}.attn.hook_received" for l in range(L)])
    for l in range(L):
        assert (cache[f"blocks.{l}.attn.hook_pattern"] - ref[l]).abs().max() < 1e-5
        assert (cache[f"blocks.{l}.attn.hook_received"] - ref[l].sum(2)).abs().max() < 1e-4
    assert logits.shape == (1, 14, twin.model.config.vocab_size)
    _, only = twin.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern") and ".1." in n)
    assert list(only) == ["blocks.1.attn.hook_pattern"]
    _, one = twin.run_with_cache(ids, names_filter="blocks.0.attn.hook_received")
    assert list(one) == ["blocks.0.attn.hook_received"]
    with pytest.raises(ValueError, match="names_filter: unknown name"):
        twin.run_with_cache(ids, names_filter=["blocks.99.attn.hook_pattern"])


@pytest.fixture(scope="module")
def traced(twin, tmp_path_factory):
    """A short traced generation that stores maps of (1, 0) and (2, 3) at three steps."""
    ids = _ids(twin, b=1, s=10)
    path = tmp_path_factory.mktemp("trace") / "run.arrow"
    kw = ({"steps": 4, "gen_length": 8, "block_length": 8, "temperature": 0.0} if twin.is_diffusion
          else {"max_new_tokens": 4, "do_sample": False})
    twin.generate(ids, trace=str(path), capture=CaptureOptions(map_slices=((1, 0), (2, 3)), map_steps=(0, 1, 3)), **kw)
    return twin, path


def test_exported_maps_are_the_models_attention_on_that_canvas(traced):
    """head_view_inputs at a step = eager attention of the model on the step's tokens (prefix for
    an ARM decoding step, whose one stored row sits at the newest position)."""
    m, path = traced
    tr = sinklens.open_trace(path)
    for t in (0, 1):
        inputs = export.head_view_inputs(path, step=t)
        assert inputs["include_layers"] == [1, 2] and inputs["heads"] == [0, 3]
        toks = torch.tensor(np.asarray(tr.tokens(tr.steps[t], 0)))[None]
        ref = _eager(m, toks)
        s = toks.shape[1]
        assert len(inputs["tokens"]) == s
        for l, h in ((1, 0), (2, 3)):
            got = inputs["attention"][l][0, h]
            rows = slice(None) if m.is_diffusion or t == 0 else slice(s - 1, s)   # ARM decoding: newest row only
            assert (got[rows] - ref[l][0, h][rows]).abs().max() < 2e-3           # trace stores float16
            if not (m.is_diffusion or t == 0):
                assert got[: s - 1].abs().max() == 0                             # nothing invented


def test_bertviz_and_circuitsvis_accept_the_inputs(traced, tmp_path):
    from bertviz import head_view
    from bertviz.util import format_attention, format_special_chars
    from circuitsvis.attention import attention_patterns

    _, path = traced
    inputs = export.head_view_inputs(path, step=1)
    stacked = format_attention(inputs["attention"], inputs["include_layers"])   # bertviz's own reshaping
    assert stacked.shape[:2] == (2, len(inputs["attention"][0][0]))
    page = head_view(**inputs, html_action="return")
    assert json.dumps(format_special_chars(inputs["tokens"])) in page.data        # the tokens reached the view
    cv = export.attention_patterns_inputs(path, step=1, layer=2)
    assert cv["attention"].shape == (1, len(cv["tokens"]), len(cv["tokens"]))
    html = attention_patterns(**cv).local_src                                   # offline render
    assert "AttentionPatterns" in html
    files = export.write(path, tmp_path / "ex", steps=[0, 3])
    names = sorted(p.name for p in files)
    assert names == ["step0_attention.json", "step0_attention_patterns.html", "step0_head_view.html",
                     "step3_attention.json", "step3_attention_patterns.html", "step3_head_view.html"]
    doc = json.loads((tmp_path / "ex" / "step3_attention.json").read_text())
    assert doc["head_names"] == ["L1H0", "L2H3"] and len(doc["attention"]) == 2


def test_export_without_the_viewers_says_what_is_missing(traced, tmp_path, monkeypatch, capsys):
    import importlib.util

    _, path = traced
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("bertviz", "circuitsvis") else find_spec(name, *a))
    monkeypatch.setitem(sys.modules, "bertviz", None)                 # import bertviz -> ImportError
    monkeypatch.setitem(sys.modules, "circuitsvis", None)
    monkeypatch.setitem(sys.modules, "circuitsvis.attention", None)
    files = export.write(path, tmp_path / "ex", steps=[0, 3])
    assert sorted(p.name for p in files) == ["step0_attention.json", "step3_attention.json"]
    (line,) = capsys.readouterr().err.strip().splitlines()             # one line, once, not an error
    assert "bertviz and circuitsvis not installed" in line and "pip install bertviz circuitsvis" in line
    assert "sinklens[viewers]" in line


def test_export_bad_input_says_which_argument(traced):
    _, path = traced
    with pytest.raises(AnalysisInputError, match="step"):
        export.head_view_inputs(path, step=2)                                   # no maps stored at step 2
    with pytest.raises(AnalysisInputError, match="layer"):
        export.attention_patterns_inputs(path, step=0, layer=0)
