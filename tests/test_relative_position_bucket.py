import math

import pytest
import torch

from tupe_plugin.encodings.relative_position import T5RelativeBias, relative_position_bucket
from paper_equations import exact_t5_bucket

# Per direction (32 buckets, max distance 128): 8 exact distances, then log-spaced buckets whose
# lower edges are 8 * 16 ** (k / 8) for k = 1..7, rounded up: 12, 16, 23, 32, 46, 64, 91.
HAND_TABLE = [(0, 7, None), (8, 11, 8), (12, 15, 9), (16, 22, 10), (23, 31, 11), (32, 45, 12),
              (46, 63, 13), (64, 90, 14), (91, 200, 15)]


def hand_bucket(distance):
    for low, high, bucket in HAND_TABLE:
        if low <= distance <= high:
            return distance if bucket is None else bucket
    raise AssertionError(distance)


def test_keys_before_or_at_the_query_use_the_lower_half():
    distances = torch.arange(0, 201)
    got = relative_position_bucket(-distances).tolist()
    assert got == [hand_bucket(d) for d in range(201)]


def test_keys_after_the_query_use_the_upper_half():
    distances = torch.arange(1, 201)
    got = relative_position_bucket(distances).tolist()
    assert got == [16 + hand_bucket(d) for d in range(1, 201)]


def test_bucket_16_never_occurs_for_ordinary_offsets():
    assert 16 not in relative_position_bucket(torch.arange(-300, 301)).tolist()


def test_result_is_a_long_tensor_of_the_input_shape():
    relative = torch.arange(-5, 5).view(2, 5)
    out = relative_position_bucket(relative)
    assert out.dtype == torch.long and out.shape == relative.shape


def test_t5_bias_is_the_table_row_of_each_pairs_bucket_beyond_the_exact_distances():
    torch.manual_seed(0)
    module = T5RelativeBias(num_heads=3)
    seq_len = 150  # offsets up to 149: exact, log-spaced and clipped buckets, both directions
    bias = module(seq_len)
    table = module.relative_attention_bias.weight
    assert bias.shape == (3, seq_len, seq_len)
    for i in range(0, seq_len, 7):
        for j in range(0, seq_len, 5):
            bucket = relative_position_bucket(torch.tensor(j - i)).item()
            assert torch.equal(bias[:, i, j], table[bucket])


def test_t5_bias_gradient_sums_each_buckets_pairs():
    torch.manual_seed(0)
    module = T5RelativeBias(num_heads=2)
    seq_len = 100
    weights = torch.randn(2, seq_len, seq_len)
    (module(seq_len) * weights).sum().backward()
    expected = torch.zeros(32, 2, dtype=torch.float64)
    for i in range(seq_len):
        for j in range(seq_len):
            expected[relative_position_bucket(torch.tensor(j - i)).item()] += weights[:, i, j].double()
    torch.testing.assert_close(module.relative_attention_bias.weight.grad.double(), expected,
                               atol=1e-4, rtol=1e-5)


def release_float32_bucket(relative_position):
    """The TUPE release's computation: float32 logarithm on the CPU, then truncation."""
    n = -relative_position
    bucket = (n < 0).long() * 16
    n = n.abs()
    large = 8 + (torch.log(n.float() / 8) / math.log(128 / 8) * 8).long()
    return bucket + torch.where(n < 8, n, large.clamp(max=15))


BOUNDARIES = [d + delta for d in (8, 16, 32, 64, 128) for delta in (-1, 0, 1)] + \
    [11, 12, 22, 23, 45, 46, 90, 91]


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_bucket_boundaries_equal_the_exact_integer_reference(device):
    offsets = torch.tensor(sorted({s * d for d in BOUNDARIES for s in (1, -1)}), device=device)
    buckets = relative_position_bucket(offsets)
    assert buckets.device.type == device
    assert buckets.cpu().tolist() == [exact_t5_bucket(r) for r in offsets.tolist()]


def test_distances_16_32_64_land_on_the_bucket_where_the_float32_cpu_computation_puts_them():
    offsets = torch.tensor([16, 32, 64, -16, -32, -64])
    assert relative_position_bucket(offsets).tolist() == release_float32_bucket(offsets).tolist()
    assert relative_position_bucket(offsets).tolist() == [26, 28, 30, 10, 12, 14]


def test_every_offset_up_to_600_matches_the_float32_cpu_computation():
    offsets = torch.arange(-600, 601)
    assert torch.equal(relative_position_bucket(offsets), release_float32_bucket(offsets))
