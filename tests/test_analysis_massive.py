"""Both massive-activation ratios: the median position's largest |h_c| (sinklens' `ratio`) and the
median magnitude of all activations (Sun et al. 2024, `ratio_all`), against transformers' own
hidden states; the last layer's readout is its output before the final norm."""
import numpy as np
import torch

from sinklens.analysis import ArraySource, analyze
from sinklens.attention import ATTENTION_NAME, AttentionRequest
from sinklens.attention.readouts import readout_hooks
from test_readouts import massive_llama

NAMES = ("hidden_norm", "hidden_top_channels", "hidden_top_values", "hidden_median_abs")


def test_both_ratios_against_the_hidden_states():
    model = massive_llama()                                          # a massive activation at token 3
    last = {}
    model.model.layers[-1].register_forward_hook(lambda m, a, out: last.update(h=out[0] if isinstance(out, tuple) else out))
    ids = torch.tensor([[1, 2, 3, 4, 6, 7]])
    req = AttentionRequest(capture=True, hidden_norms=True)
    with torch.no_grad(), readout_hooks(model, req):
        out = model(ids, sinklens=req, output_hidden_states=True)
    hs = [h[0].abs() for h in out.hidden_states[1:-1]] + [last["h"][0].abs()]   # layers' outputs, the last before the norm
    median = req.readout("hidden_median_abs")[:, 0]                               # (L,)
    for l, h in enumerate(hs):
        assert torch.isclose(median[l], h.flatten().median(), rtol=1e-6), l
    # transformers' last hidden state is after the final norm: not what the readout holds
    assert not torch.isclose(median[-1], out.hidden_states[-1][0].abs().flatten().median(), rtol=1e-3)
    readouts = {n: req.readout(n).numpy().transpose(1, 0, *range(2, req.readout(n).dim()))[:1] for n in NAMES}
    ma = analyze(ArraySource(req.received.numpy().transpose(1, 0, 2, 3), ids.numpy(), readouts=readouts)).massive_activations
    big = np.array([float(h.max()) for h in hs])
    np.testing.assert_allclose(ma.ratio_all[0], big / np.array([float(h.flatten().median()) for h in hs]), rtol=1e-5)
    per_position_max = [h.max(dim=-1).values for h in hs]
    np.testing.assert_allclose(ma.ratio[0], big / np.array([float(np.median(m.numpy())) for m in per_position_max]),
                               rtol=1e-5)
    assert (ma.ratio_all[0] >= ma.ratio[0]).all()                     # the median of all ≤ the median of the maxima


def test_median_of_each_row_is_torchs_median():
    """The readout's CPU median (numpy's selection) is the element torch.median picks: the lower
    middle of an even count, ties, NaN rows (NaN), float64, and a bfloat16 row (torch's own)."""
    from sinklens.attention.readouts import _median_rows

    g = torch.Generator().manual_seed(0)
    cases = [torch.rand(2, 7, generator=g), torch.rand(3, 8, generator=g), torch.randn(1, 4096, generator=g).abs(),
             torch.tensor([[1.0, 1.0, 2.0, 2.0], [3.0, 3.0, 3.0, 0.0]]), torch.rand(2, 6, generator=g).double(),
             torch.tensor([[1.0, float("nan"), 2.0], [1.0, 2.0, 3.0]]), torch.rand(2, 5, generator=g).bfloat16()]
    for x in cases:
        got, want = _median_rows(x), x.median(dim=-1).values
        assert got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(-1.0), want.nan_to_num(-1.0)), (x, got, want)
