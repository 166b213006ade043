"""Scores of every query against a per-head table of the 2T - 1 offsets, by bands of query rows.

``S[b, h, i, j] = x[b, h, i] . table[h, j - i + T - 1]``: the content-to-position and position-to-content
terms of DeBERTa (He, Liu, Gao, Chen, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention", arXiv
2006.03654, Eq. 4) once the table's rows are laid out by offset
(:mod:`tupe_plugin.encodings.deberta_position`). Multiplying every query by all 2T - 1 rows and gathering
(T, T) entries costs two q k^T products; a band of c query rows only reaches T + c - 1 consecutive rows, so
each band is one product of c x (T + c - 1) scores whose diagonal strip, read through a strided view, is the
band's (c, T) scores (the skew of Huang et al., "Music Transformer", arXiv 1809.04281, for both directions):
(1 + c / T) q k^T products in all, and no (T, T) index. The backward writes the gradient back into the strip
of a zeroed band and takes the two products' gradients, the table's summed over the batch.
"""

import torch

# Query rows of a band: the products cost 1 + BAND_ROWS / T of q k^T.
BAND_ROWS = 32


def _strip(band, rows, seq_len):
    """The (B, H, rows, T) view of a band's scores (B, H, rows, T + rows - 1) where the band's row i
    against key j lies: ``band[..., i, j + rows - 1 - i]``."""
    batch, heads, _, width = band.shape
    return band.as_strided((batch, heads, rows, seq_len), (heads * rows * width, rows * width, width - 1, 1),
                           band.storage_offset() + rows - 1)


def _bands(seq_len):
    """(query rows, their count, the table rows they reach) of every band, as slices and an int."""
    for start in range(0, seq_len, BAND_ROWS):
        rows = min(BAND_ROWS, seq_len - start)
        first = seq_len - start - rows
        yield slice(start, start + rows), rows, slice(first, first + seq_len + rows - 1)


class ToeplitzScores(torch.autograd.Function):
    """``x`` (B, H, T, d), ``table`` (H, 2T - 1, d) -> S (B, H, T, T), see the module docstring."""

    @staticmethod
    def forward(ctx, x, table):
        batch, heads, seq_len, _ = x.shape
        if table.shape[-2] != 2 * seq_len - 1:
            raise ValueError(f"a table of {table.shape[-2]} offsets for {seq_len} positions: it needs 2T - 1")
        scores = x.new_empty(batch, heads, seq_len, seq_len)
        for queries, rows, reached in _bands(seq_len):
            band = torch.matmul(x[:, :, queries], table[:, reached].transpose(-1, -2))
            scores[:, :, queries] = _strip(band, rows, seq_len)
        ctx.save_for_backward(x, table)
        return scores

    @staticmethod
    def backward(ctx, grad):
        x, table = ctx.saved_tensors
        batch, heads, seq_len, _ = x.shape
        grad_x = torch.empty_like(x)
        grad_table = torch.zeros_like(table)
        for queries, rows, reached in _bands(seq_len):
            band = grad.new_zeros(batch, heads, rows, seq_len + rows - 1)
            _strip(band, rows, seq_len).copy_(grad[:, :, queries])
            grad_x[:, :, queries] = torch.matmul(band, table[:, reached])
            grad_table[:, reached] += torch.matmul(band.transpose(-1, -2), x[:, :, queries]).sum(0)
        return grad_x, grad_table


def offset_scores(x, rows, offsets):
    """``S[b, h, i, j] = x[b, h, i] . rows[h, offsets[j - i + T - 1]]`` (a table row that depends on j - i
    alone) by bands (:class:`ToeplitzScores`) over the rows laid out by offset: even for a table of fewer rows
    than a band reaches, where x against every row is the smaller product, gathering its (T, T) entries (and
    scattering them back) cost more: DeBERTa's training step at T = 2048 on CPU, 2.5 s with them, 2.0 s by
    bands."""
    return ToeplitzScores.apply(x, rows[:, offsets])
