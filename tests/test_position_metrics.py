"""The property metrics of docs/analysis.md on matrices whose answers are known
(Wang et al. 2021 §2, §3.2)."""

import math

import numpy as np
import pytest
import torch

from tupe_plugin.analysis import position_metrics as metrics
from tupe_plugin.encodings.absolute_position import SinusoidalAbsolutePosition
from tupe_plugin.encodings.shaw_position import ShawRelativePosition


# float32 rounding of 768-term dot products, relative to their size: about sqrt(768) * eps = 3.3e-6
# (measured 1.1e-6 on a Xeon with AVX-512); a random matrix scores about 1.
FLOAT32_DOT_PRECISION = 768 ** 0.5 * np.finfo(np.float32).eps


@pytest.fixture(scope="module")
def sinusoidal_ape_dots():
    """<P(x), P(y)> of the fixed sinusoidal APE, d = 768, 128 positions, in fp32 as the model has it."""
    positions = SinusoidalAbsolutePosition(768)(128)
    return (positions @ positions.t()).numpy()


def test_fixed_sinusoidal_ape_is_translation_invariant_to_float_precision(sinusoidal_ape_dots):
    assert metrics.translation_invariance_violation(sinusoidal_ape_dots) < FLOAT32_DOT_PRECISION


def test_fixed_sinusoidal_ape_is_symmetric_to_float_precision(sinusoidal_ape_dots):
    assert metrics.symmetry_violation(sinusoidal_ape_dots) < 1e-6


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_fixed_sinusoidal_ape_profile_strictly_decreases_up_to_offset_43_and_not_beyond(
    sinusoidal_ape_dots, direction
):
    assert metrics.decreasing_window(sinusoidal_ape_dots, direction) == 43


def test_fixed_sinusoidal_ape_profile_is_the_sum_of_cosines(sinusoidal_ape_dots):
    frequencies = [10000 ** (-2 * i / 768) for i in range(384)]
    expected = [sum(math.cos(w * m) for w in frequencies) for m in range(60)]
    profile = metrics.offset_profile(sinusoidal_ape_dots, range(60))
    np.testing.assert_allclose(profile, expected, atol=1e-3)
    assert profile[43] < profile[44] and all(np.diff(profile[:44]) < 0)


def test_random_matrix_is_not_translation_invariant():
    random = np.random.default_rng(0).normal(size=(64, 64))
    assert metrics.translation_invariance_violation(random) > 0.9


def test_any_toeplitz_matrix_is_translation_invariant():
    values = np.random.default_rng(1).normal(size=2 * 30 - 1)
    toeplitz = np.array([[values[j - i + 29] for j in range(30)] for i in range(30)])
    assert metrics.translation_invariance_violation(toeplitz) < 1e-12


def test_translation_invariance_violation_of_a_hand_computed_matrix():
    # diagonals -1, 0, +1: [0, 0], [0, 0, 0], [1, 0] -> spreads 0, 0, 1/2; std(A) = sqrt(8) / 9
    a = [[0, 1, 0], [0, 0, 0], [0, 0, 0]]
    assert metrics.translation_invariance_violation(a) == pytest.approx((1 / 6) / (math.sqrt(8) / 9))


def test_negative_distance_is_monotone_symmetric_and_decreases_over_the_whole_matrix():
    a = -np.abs(np.subtract.outer(np.arange(12), np.arange(12)))
    assert metrics.monotonicity_fraction(a, 5, "forward") == 1.0
    assert metrics.monotonicity_fraction(a, 5, "backward") == 1.0
    assert metrics.decreasing_window(a, "forward") == metrics.decreasing_window(a, "backward") == 11
    assert metrics.symmetry_violation(a) == 0.0


def test_signed_offset_is_monotone_forward_only_and_antisymmetric():
    a = np.subtract.outer(np.arange(12), np.arange(12)).astype(float)  # A[x, x+m] = -m
    assert metrics.monotonicity_fraction(a, 5, "forward") == 1.0
    assert metrics.monotonicity_fraction(a, 5, "backward") == 0.0
    assert metrics.decreasing_window(a, "forward") == 11
    assert metrics.decreasing_window(a, "backward") == 0
    assert metrics.symmetry_violation(a) == pytest.approx(2.0)
    assert metrics.offset_asymmetry(
        metrics.offset_profile(a, range(1, 12)), metrics.offset_profile(a, range(-1, -12, -1))
    ) == pytest.approx(math.sqrt(2))


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_monotonicity_fraction_counts_the_triples_of_its_definition(direction):
    a = np.random.default_rng(2).normal(size=(10, 10))
    sign = 1 if direction == "forward" else -1
    hits = total = 0
    for x in range(10):
        for m in range(1, 5):
            for n in range(m):
                if 0 <= x + sign * m < 10:
                    total += 1
                    hits += a[x, x + sign * n] > a[x, x + sign * m]
    assert metrics.monotonicity_fraction(a, 4, direction) == pytest.approx(hits / total)


def test_sinusoidal_rpe_proximity_seen_by_a_query_is_asymmetric():
    reach, size = 16, 24
    shaw = ShawRelativePosition(64, max_distance=reach, learned=False)
    table = shaw.table().double()
    query = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    index = shaw.index(size, "cpu")
    a = (table @ query)[index].numpy()  # A[x, y] = q . a_clip(y - x)
    frequencies = shaw.sinusoid.frequencies.double()
    odd = np.array([[2 * float((query[0::2] * torch.sin(frequencies * max(-reach, min(reach, y - x)))).sum())
                     for y in range(size)] for x in range(size)])  # A - A^T: the sine terms
    assert metrics.symmetry_violation(a) == pytest.approx(np.linalg.norm(odd) / np.linalg.norm(a))
    assert metrics.symmetry_violation(a) > 0.1
    assert metrics.translation_invariance_violation(a[:reach, :reach]) < 1e-12


def test_sinusoidal_rpe_table_itself_cannot_tell_forward_from_backward():
    table = ShawRelativePosition(64, max_distance=16, learned=False).table().double()
    dots = (table @ table.t()).numpy()
    assert metrics.symmetry_violation(dots) < 1e-12
    assert metrics.offset_asymmetry(dots[16, 17:], dots[16, 15::-1]) < 1e-12


def test_learned_rpe_table_tells_forward_from_backward():
    table = torch.randn(33, 64, generator=torch.Generator().manual_seed(4)).double()
    dots = (table @ table.t()).numpy()
    assert metrics.offset_asymmetry(dots[16, 17:], dots[16, 15::-1]) > 0.5


def test_property_metrics_refuse_a_matrix_that_is_not_square():
    with pytest.raises(ValueError, match="square"):
        metrics.property_metrics(np.zeros((3, 4)), window=2)
