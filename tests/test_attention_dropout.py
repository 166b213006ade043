"""The CPU attention-dropout mask keeps dropout's distribution: keep probability, independence,
seeding; the explicit path applies it as dropout does."""

import math

import pytest
import torch
from tupe_plugin.attention import dropout
from tupe_plugin.attention.dropout import keep_mask, keep_probability
from tupe_plugin.attention.attend import explicit_attention

DRAWS = 2**22


@pytest.mark.parametrize("p", [0.01, 0.1, 0.25, 0.5, 0.9])
def test_keep_probability_is_within_1e_4_of_one_minus_p(p):
    assert abs(keep_probability(p) - (1 - p)) <= 2**-17 < 1e-4


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_kept_fraction_matches_the_keep_probability(p):
    torch.manual_seed(0)
    kept = keep_mask((DRAWS,), p, "cpu").double().mean().item()
    sigma = math.sqrt(keep_probability(p) * (1 - keep_probability(p)) / DRAWS)
    assert abs(kept - keep_probability(p)) < 5 * sigma


@pytest.mark.parametrize("lag", [1, 2, 3, 4, 5, 64])
def test_elements_are_kept_independently_of_their_neighbours(lag):
    """Neighbours share a 48-bit draw (lags 1, 2) or not (3 and beyond): P(both kept) = k^2."""
    torch.manual_seed(1)
    p = 0.5
    mask = keep_mask((DRAWS,), p, "cpu")
    both = (mask[:-lag] & mask[lag:]).double().mean().item()
    k = keep_probability(p)
    sigma = math.sqrt(k * k * (1 - k * k) / (DRAWS - lag))
    assert abs(both - k * k) < 5 * sigma


def test_the_mask_depends_on_the_position_within_a_draw_only_by_chance():
    torch.manual_seed(2)
    lanes = keep_mask((DRAWS // 3, 3), 0.2, "cpu").double().mean(0)
    sigma = math.sqrt(0.8 * 0.2 / (DRAWS // 3))
    assert torch.all((lanes - keep_probability(0.2)).abs() < 5 * sigma)


def test_the_same_seed_draws_the_same_mask_and_another_seed_another():
    torch.manual_seed(3)
    first = keep_mask((4, 8, 33, 33), 0.1, "cpu")
    torch.manual_seed(3)
    again = keep_mask((4, 8, 33, 33), 0.1, "cpu")
    torch.manual_seed(4)
    other = keep_mask((4, 8, 33, 33), 0.1, "cpu")
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_mask_shapes_that_are_not_a_multiple_of_three():
    for shape in [(1,), (2,), (5, 7), (2, 3, 5, 11)]:
        assert keep_mask(shape, 0.1, "cpu").shape == shape


def test_explicit_attention_with_dropout_is_the_dropped_formula_forward_and_gradients():
    q, k, v = (torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    p, scale = 0.3, 0.35
    torch.manual_seed(5)
    out, probs = explicit_attention(q, k, v, None, scale, p)
    torch.manual_seed(5)
    mask = keep_mask((2, 3, 7, 7), p, "cpu")
    plain = (torch.softmax(q @ k.transpose(-1, -2) * scale, -1) * mask / keep_probability(p)) @ v
    torch.testing.assert_close(out, plain)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected = torch.autograd.grad(plain.sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)
    assert torch.all(probs.sum(-1).sub(1).abs() < 1e-12)


@pytest.mark.parametrize("chunk_draws", [1, 5, 64])
def test_a_mask_drawn_by_chunks_is_the_mask_drawn_at_once(chunk_draws, monkeypatch):
    shape = (2, 3, 7, 11)  # 462 elements: 154 draws, not a multiple of the chunks
    torch.manual_seed(5)
    at_once, after = keep_mask(shape, 0.1, "cpu"), torch.rand(3)
    monkeypatch.setattr(dropout, "CHUNK_DRAWS", chunk_draws)
    torch.manual_seed(5)
    by_chunks = keep_mask(shape, 0.1, "cpu")
    assert torch.equal(by_chunks, at_once) and by_chunks.is_contiguous()
    torch.testing.assert_close(torch.rand(3), after)  # the generator is left where one draw leaves it
