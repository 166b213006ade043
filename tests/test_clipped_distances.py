"""Shaw's clipped-distance sums and the key gather whose gradient they are, against a scatter-add and
autograd's gather (Wang et al. 2021 Eq. 4: r = clip(j - i, -K, K))."""

import pytest
import torch

from tupe_plugin.attention.clipped_distances import (ClippedDistanceScores, band_distance_sums, distance_sums,
                                                     scattered_distance_sums)
from tupe_plugin.attention.relative_terms import offsets_of
from tupe_plugin.encodings.shaw_position import clipped_index, clipped_offsets

SHAPES = [(1, 1), (5, 1), (9, 3), (6, 10)]  # (T, K), K >= T included


def with_the_index(sums):
    """``sums(x, K)`` for the sums that read the forward's clipped index (built here as the term builds
    it)."""
    return lambda x, max_distance: sums(x, clipped_index(x.size(-1), max_distance, x.device), max_distance)


SUMS = [with_the_index(distance_sums), with_the_index(scattered_distance_sums), band_distance_sums]
SUM_IDS = ["distance_sums", "scattered", "band"]


@pytest.mark.parametrize("seq_len, max_distance", [(6, 2), (3, 5)])
def test_the_offsets_of_the_clipped_index_are_its_rows_by_offset(seq_len, max_distance):
    index = clipped_index(seq_len, max_distance, "cpu")
    offsets = clipped_offsets(seq_len, max_distance, "cpu")
    torch.testing.assert_close(offsets, offsets_of(index), rtol=0, atol=0)


def test_clipped_index_is_the_clipped_distance_shifted_by_k():
    index = clipped_index(6, 2, "cpu")
    assert all(index[i, j] == max(-2, min(2, j - i)) + 2 for i in range(6) for j in range(6))


@pytest.mark.parametrize("sums", SUMS, ids=SUM_IDS)
@pytest.mark.parametrize("seq_len, max_distance", SHAPES)
def test_distance_sums_add_every_key_onto_its_clipped_distance(sums, seq_len, max_distance):
    x = torch.randn(2, 3, seq_len, seq_len, dtype=torch.float64)
    expected = torch.zeros(2, 3, seq_len, 2 * max_distance + 1, dtype=torch.float64)
    for i in range(seq_len):
        for j in range(seq_len):
            expected[..., i, max(-max_distance, min(max_distance, j - i)) + max_distance] += x[..., i, j]
    torch.testing.assert_close(sums(x, max_distance), expected)


@pytest.mark.parametrize("sums", SUMS, ids=SUM_IDS)
def test_distance_sums_of_bf16_probabilities_accumulate_in_float32(sums):
    seq_len, max_distance = 512, 4
    probs = torch.full((1, 1, seq_len, seq_len), 1.0 / seq_len).to(torch.bfloat16)
    result = sums(probs, max_distance)
    assert result.dtype == torch.float32
    # query 0 reaches one key at each distance 0..K-1 and the T - K others at distance K (its end)
    expected_end = (seq_len - max_distance) * probs[0, 0, 0, 0].float()
    torch.testing.assert_close(result[0, 0, 0, -1], expected_end, rtol=1e-6, atol=0)


@pytest.mark.parametrize("seq_len, max_distance", SHAPES)
def test_clipped_distance_scores_gather_and_their_gradient_equals_the_gather_gradient(seq_len, max_distance):
    per_distance = torch.randn(2, 3, seq_len, 2 * max_distance + 1, dtype=torch.float64, requires_grad=True)
    index = clipped_index(seq_len, max_distance, "cpu")
    grad = torch.randn(2, 3, seq_len, seq_len, dtype=torch.float64)
    scores = ClippedDistanceScores.apply(per_distance, index)
    (mine,) = torch.autograd.grad(scores, per_distance, grad)
    reference = per_distance.gather(-1, index.expand(2, 3, -1, -1))
    (expected,) = torch.autograd.grad(reference, per_distance, grad)
    torch.testing.assert_close(scores, reference)
    torch.testing.assert_close(mine, expected)
