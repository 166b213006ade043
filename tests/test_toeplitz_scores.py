"""Scores against a table laid out by offset, by bands of query rows:
S[b, h, i, j] = x_i . table[j - i + T - 1] written out pair by pair, forward and gradients; and a clipped
index read by offset."""

import pytest
import torch
from tupe_plugin.attention import toeplitz_scores
from tupe_plugin.attention.toeplitz_scores import ToeplitzScores, offset_scores

BATCH, HEADS, HEAD_DIM = 2, 3, 4


def _pairwise(x, table):
    """x_i . table[j - i + T - 1], one pair at a time."""
    seq_len = x.size(-2)
    scores = x.new_zeros(*x.shape[:2], seq_len, seq_len)
    for i in range(seq_len):
        for j in range(seq_len):
            scores[:, :, i, j] = (x[:, :, i] * table[None, :, j - i + seq_len - 1]).sum(-1)
    return scores


@pytest.mark.parametrize("seq_len, band_rows", [(1, 32), (5, 32), (7, 3), (9, 4), (12, 5), (6, 1)])
def test_band_scores_equal_the_pairwise_products_forward_and_gradients(seq_len, band_rows, monkeypatch):
    monkeypatch.setattr(toeplitz_scores, "BAND_ROWS", band_rows)
    torch.manual_seed(seq_len)
    x = torch.randn(BATCH, HEADS, seq_len, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    table = torch.randn(HEADS, 2 * seq_len - 1, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(BATCH, HEADS, seq_len, seq_len, dtype=torch.float64)
    got = ToeplitzScores.apply(x, table)
    expected = _pairwise(x, table)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
    for g, e in zip(torch.autograd.grad(got, (x, table), grad),
                    torch.autograd.grad(expected, (x, table), grad)):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("transposed_by_blocks", [False, True], ids=["strided", "by_blocks"])
@pytest.mark.parametrize("seq_len, band_rows", [(1, 32), (7, 3), (9, 4), (8, 8), (6, 1)])
def test_a_transposed_second_term_adds_its_pairwise_products_by_columns_forward_and_gradients(
        seq_len, band_rows, transposed_by_blocks, monkeypatch):
    monkeypatch.setattr(toeplitz_scores, "BAND_ROWS", band_rows)
    monkeypatch.setattr(toeplitz_scores, "TRANSPOSE_BY_BLOCKS_PAST", 0 if transposed_by_blocks else 512)
    torch.manual_seed(seq_len)
    inputs = [torch.randn(BATCH, HEADS, seq_len, HEAD_DIM, dtype=torch.float64, requires_grad=True),
              torch.randn(HEADS, 2 * seq_len - 1, HEAD_DIM, dtype=torch.float64, requires_grad=True),
              torch.randn(BATCH, HEADS, seq_len, HEAD_DIM, dtype=torch.float64, requires_grad=True),
              torch.randn(HEADS, 2 * seq_len - 1, HEAD_DIM, dtype=torch.float64, requires_grad=True)]
    grad = torch.randn(BATCH, HEADS, seq_len, seq_len, dtype=torch.float64)
    got = ToeplitzScores.apply(*inputs)
    expected = _pairwise(*inputs[:2]) + _pairwise(*inputs[2:]).transpose(-1, -2)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
    for g, e in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)


def test_a_table_of_another_length_is_refused():
    with pytest.raises(ValueError, match="a table of 8 offsets for 5 positions"):
        ToeplitzScores.apply(torch.zeros(1, 1, 5, 2), torch.zeros(1, 8, 2))
    with pytest.raises(ValueError, match="a table of 8 offsets for 5 positions"):
        ToeplitzScores.apply(torch.zeros(1, 1, 5, 2), torch.zeros(1, 9, 2), torch.zeros(1, 1, 5, 2),
                             torch.zeros(1, 8, 2))


def _clipped_index(seq_len, reach):
    """A clipped relative index, as DeBERTa's: rows 0 .. 2 reach, offsets beyond +-reach share the end
    rows."""
    positions = torch.arange(seq_len)
    index = (positions[None, :] - positions[:, None]).clamp(-reach, reach) + reach
    offsets = torch.cat([index[:, 0].flip(0), index[0, 1:]])
    return index, offsets


@pytest.mark.parametrize("reach", [8, 2], ids=["table_beyond_the_bands", "table_inside_a_band"])
def test_offset_scores_read_each_pair_from_the_row_of_its_clipped_index(reach, monkeypatch):
    monkeypatch.setattr(toeplitz_scores, "BAND_ROWS", 2)
    seq_len = 10
    index, offsets = _clipped_index(seq_len, reach)
    x = torch.randn(BATCH, HEADS, seq_len, HEAD_DIM, dtype=torch.float64)
    rows = torch.randn(HEADS, 2 * reach + 1, HEAD_DIM, dtype=torch.float64)
    expected = torch.einsum("bhid,hijd->bhij", x, rows[:, index])
    torch.testing.assert_close(offset_scores(x, rows, offsets), expected, atol=1e-12, rtol=1e-12)
