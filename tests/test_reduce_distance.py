"""The distance profile and diagonal share as the capture's chunk loop accumulates them
(sinklens/attention/reduce.py: `LayerSums`), against a double loop over every (query row, key).

The skewed-buffer diagonal sums must bin each A[i, j] at |i − j| whatever the chunk: rows of any
count, key windows [k0, k1) that start past 0 and end before S_k (a causal chunk, left padding),
query rows that sit after cached keys (S_q < S_k: row r is key position r + S_k − S_q), real-row
weights, and chunks of different shapes following each other in one layer.
"""
import pytest
import torch

from sinklens.attention import AttentionRequest
from sinklens.attention.reduce import LayerSums


def chunks(s_q: int, s_k: int, rows: int, gen: torch.Generator) -> list[tuple[int, int, int, int]]:
    """(start, end, k0, k1): query chunks of uneven sizes up to `rows`, each with its own key window."""
    out, start = [], 0
    while start < s_q:
        end = min(s_q, start + int(torch.randint(1, rows + 1, (), generator=gen)))
        k0 = int(torch.randint(0, s_k, (), generator=gen))
        k1 = int(torch.randint(k0 + 1, s_k + 1, (), generator=gen))
        out.append((start, end, k0, k1))
        start = end
    return out


def brute_force(p_chunks, plan, weight, b: int, h: int, s_q: int, s_k: int):
    """(distance (B, H, S_k), diagonal sum (B, H)) written out one entry at a time."""
    offset = s_k - s_q
    dist = torch.zeros(b, h, s_k, dtype=torch.float64)
    diag = torch.zeros(b, h, dtype=torch.float64)
    for p, (start, end, k0, k1) in zip(p_chunks, plan):
        for bi in range(b):
            for r in range(end - start):
                i = start + r + offset                                   # the row's own key position
                w = 1.0 if weight is None else float(weight[bi, start + r])
                for j in range(k0, k1):
                    a = w * p[bi, :, r, j - k0].double()                  # (H,)
                    dist[bi, :, abs(i - j)] += a
                    if i == j:
                        diag[bi] += a
    return dist, diag


# the last: chunks of up to 150 rows, more than reduce.SKEW_ROWS, and more rows than keys
@pytest.mark.parametrize("b, h, s_q, s_k, rows", [(1, 1, 1, 1, 5), (2, 3, 7, 7, 5), (1, 5, 6, 13, 5), (3, 2, 11, 17, 5),
                                                  (2, 1, 1, 9, 5), (1, 2, 300, 310, 150)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("distance", [True, False])
def test_distance_and_diagonal_equal_a_double_loop(b, h, s_q, s_k, rows, weighted, distance):
    gen = torch.Generator().manual_seed(b * 1000 + h * 100 + s_q * 10 + s_k)
    mask = None
    if weighted:
        mask = torch.rand(b, s_q, generator=gen) > 0.3
        mask[0, 0] = False                                               # at least one padded row
    req = AttentionRequest(capture=True, query_mask=mask, diagonal=True, distance=distance)
    sums = LayerSums.for_request(req, 0, b, h, s_q, s_k, unblocked=False, device="cpu")
    plan = chunks(s_q, s_k, rows, gen)
    p_chunks = []
    for start, end, k0, k1 in plan:
        p = torch.rand(b, h, end - start, k1 - k0, generator=gen)       # any values: the sums are linear
        p_chunks.append(p)
        sums.add(p.clone(), start, end, k0, k1)
        assert torch.equal(p, p_chunks[-1])
    sums.store(req, 0)

    dist, diag = brute_force(p_chunks, plan, None if mask is None else mask.float(), b, h, s_q, s_k)
    rows = torch.full((b, 1), float(s_q)) if mask is None else mask.sum(-1).clamp(min=1)[:, None].double()
    torch.testing.assert_close(req.readout("diagonal")[0].double(), diag / rows, rtol=1e-5, atol=1e-5)
    if distance:
        got = req.readout("distance")[0]
        assert got.shape == (b, h, s_k)
        torch.testing.assert_close(got.double(), dist, rtol=1e-5, atol=1e-5)
        # every entry lands in exactly one bin
        total = sum((p * (1.0 if mask is None else mask[:, None, s:e, None].float())).sum((-1, -2))
                    for p, (s, e, _, _) in zip(p_chunks, plan))
        torch.testing.assert_close(got.sum(-1), total, rtol=1e-5, atol=1e-5)


def test_a_layer_with_only_its_last_keys_pads_the_distances_it_cannot_reach():
    """num_keys: a sliding layer saw only the last S_k keys; its profile still spans num_keys bins."""
    req = AttentionRequest(capture=True, distance=True, num_keys=10)
    sums = LayerSums.for_request(req, 0, 1, 2, 3, 4, unblocked=False, device="cpu")
    p = torch.rand(1, 2, 3, 4, generator=torch.Generator().manual_seed(0))
    sums.add(p, 0, 3, 0, 4)
    sums.store(req, 0)
    got = req.readout("distance")[0]
    dist, _ = brute_force([p], [(0, 3, 0, 4)], None, 1, 2, 3, 4)
    assert got.shape == (1, 2, 10)
    torch.testing.assert_close(got[..., :4].double(), dist, rtol=1e-5, atol=1e-6)
    assert not got[..., 4:].any()


def test_layers_of_one_forward_share_the_scratch_and_each_equals_a_double_loop():
    """The layers of one forward reuse one skew buffer (on the request): a layer after one with more
    rows per chunk, more keys or fewer keys (a sliding layer) must read no stale entry of it."""
    gen = torch.Generator().manual_seed(5)
    b, h = 2, 3
    req = AttentionRequest(capture=True, distance=True, diagonal=True)
    shapes = [(40, 40, 30), (40, 40, 7), (9, 25, 4), (40, 40, 12), (12, 12, 12)]   # (S_q, S_k, rows per chunk)
    for layer, (s_q, s_k, rows) in enumerate(shapes):
        sums = LayerSums.for_request(req, layer, b, h, s_q, s_k, unblocked=False, device="cpu")
        plan = chunks(s_q, s_k, rows, gen)
        p_chunks = [torch.rand(b, h, end - start, k1 - k0, generator=gen) for start, end, k0, k1 in plan]
        for p, (start, end, k0, k1) in zip(p_chunks, plan):
            sums.add(p, start, end, k0, k1)
        sums.store(req, layer)
        dist, diag = brute_force(p_chunks, plan, None, b, h, s_q, s_k)
        torch.testing.assert_close(req._readouts["distance"][layer].double(), dist, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(req._readouts["diagonal"][layer].double(), diag / s_q, rtol=1e-5, atol=1e-5)
    assert len(req._scratch) == 1  # one buffer for the forward
