"""A forward's captures are views of one (L, ...) buffer per capture (`AttentionRequest.layer_sums`),
read whole with no stack. What a user relies on: the numbers are those of per-layer buffers (a request
without `num_layers`), a capture once read never changes, and layers the buffer does not fit (another
shape, a layer that blocks nothing) read as before."""
import pytest
import torch

import sinklens
from sinklens.attention.request import AttentionRequest
from sinklens.attention.routes import build
from sinklens.experiments.twins import LOAD

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dlm():
    return sinklens.load("tiny-dlm", **LOAD)


def _ids(m, seed=0, S=20):
    return torch.randint(0, m.mask_id, (2, S), generator=torch.Generator().manual_seed(seed))


def _forward(m, ids, **req):
    r = AttentionRequest(capture=True, **req)
    m.forward_logits(ids, attention=r)
    return r


def _per_layer(m, ids, **req):
    """The same forward with per-layer buffers: num_layers told as 0, so no layer fits a whole buffer."""
    return _forward(m, ids, num_layers=0, **req)


@pytest.mark.parametrize("rows", ["all", "masked"])
def test_whole_buffers_equal_per_layer_buffers(dlm, rows):
    """The compiled route's per-forward plan (`compiled._Plan`: every layer's buffers made at the first)
    against per-layer buffers: received, groups and the would-be sums, with every row counted or a query
    mask (the rows' weights, made once per forward)."""
    ids = _ids(dlm)
    groups = (ids % 2).long()
    blocked = torch.zeros(dlm.num_layers, 2, dlm.num_heads, ids.shape[1], dtype=torch.bool)
    blocked[..., 3] = True
    kw = dict(query_groups=groups, num_groups=2, blocked=blocked)
    if rows == "masked":
        kw["query_mask"] = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.6
    whole, per = _forward(dlm, ids, **kw), _per_layer(dlm, ids, **kw)
    assert whole.num_layers == dlm.num_layers and not per._sums
    if build.load() is not None:   # the compiled route ran: its plan made the buffers, per-layer calls none
        assert "plan" in whole._scratch and "plan" not in per._scratch
    for name in ("received", "received_unblocked", "received_groups"):
        a, b = getattr(whole, name), getattr(per, name)
        assert a.shape == b.shape and torch.equal(a, b), name
    # read whole: the buffer itself, each layer's capture a view of it
    assert whole.received.data_ptr() == whole._received[0].data_ptr()
    assert whole.received_unblocked.data_ptr() == whole._received_unblocked[0].data_ptr()


def test_a_capture_read_is_not_changed_by_a_second_forward(dlm):
    """One request run twice (a caller reusing it): the first read keeps its numbers; the second forward's
    captures are those of a fresh request."""
    r = AttentionRequest(capture=True)
    dlm.forward_logits(_ids(dlm, 0), attention=r)
    first = r.received
    kept = first.clone()
    dlm.forward_logits(_ids(dlm, 1), attention=r)
    assert torch.equal(first, kept)
    assert torch.equal(r.received, _forward(dlm, _ids(dlm, 1)).received)
    assert not torch.equal(r.received, kept)


def test_layers_that_block_nothing_read_their_received(dlm):
    """Blocking in one layer only: the other layers' ranking source is their received attention."""
    ids = _ids(dlm)
    blocked = torch.zeros(dlm.num_layers, 2, dlm.num_heads, ids.shape[1], dtype=torch.bool)
    blocked[1, :, :, 5] = True
    r = _forward(dlm, ids, blocked=blocked)
    unblocked = r.received_unblocked
    for layer in range(dlm.num_layers):
        want = r._received_unblocked[layer] if layer == 1 else r._received[layer]
        assert torch.equal(unblocked[layer], want)
    assert torch.equal(unblocked, _per_layer(dlm, ids, blocked=blocked).received_unblocked)


def test_a_layer_of_another_shape_gets_its_own_buffer():
    """A layer whose keys differ from the first layer's (a sliding layer that keeps fewer) is not put in
    the buffer, and the capture reads as the layers' stack."""
    r = AttentionRequest(capture=True, num_layers=3)
    views = [r.layer_sums("received", 0, (1, 2, 8), torch.device("cpu")),
             r.layer_sums("received", 1, (1, 2, 5), torch.device("cpu")),
             r.layer_sums("received", 2, (1, 2, 8), torch.device("cpu"))]
    assert views[1].shape == (1, 2, 5) and views[1].data_ptr() != r._sums["received"].whole.data_ptr()
    assert r._whole("received", dict(enumerate(views))) is None
    assert r._whole("received", {0: views[0], 2: views[2], 1: views[0]}) is None
