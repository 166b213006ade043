"""Scores of every query against a per-head table of the 2T - 1 offsets, by bands of query rows.

``S[b, h, i, j] = x[b, h, i] . table[h, j - i + T - 1]``: the content-to-position and position-to-content
terms of DeBERTa (He, Liu, Gao, Chen, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention", arXiv
2006.03654, Eq. 4) once the table's rows are laid out by offset
(:mod:`tupe_plugin.encodings.deberta_position`). Multiplying every query by all 2T - 1 rows and gathering
(T, T) entries costs two q k^T products; a band of c query rows only reaches T + c - 1 consecutive rows, so
each band is one product of c x (T + c - 1) scores whose diagonal strip, read through a strided view, is the
band's (c, T) scores (the skew of Huang et al., "Music Transformer", arXiv 1809.04281, for both directions):
(1 + c / T) q k^T products in all, and no (T, T) index. The backward writes the gradient back into the strip
of a band whose other entries stay zero and takes the two products' gradients, the table's summed over the
batch.

DeBERTa's logits hold the position-to-content term transposed (key j's scores against the queries): with
``x_t`` and ``table_t`` the same bands of key rows are added to columns of S, band by band, so that the sum
of both terms is one (B, H, T, T) tensor, written and read in cache-sized bands, never transposed whole.
"""

import torch

# Query rows of a band: the products cost 1 + BAND_ROWS / T of q k^T.
BAND_ROWS = 32
# Past this length a band's scores and the columns of S meet through a contiguous copy and torch's blocked
# 2-D transpose, head by head: a strided copy between them reads a cache line (and at long T a page) per
# element. A band's p2c added to S's columns at T = 2048 (4 heads): 59 ms -> 48 ms a forward, 352 -> 204 ms
# at T = 4096; the gradient's columns into the bands: 151 -> 42 ms, 800 -> 171 ms. At T <= 512 the direct
# copy is the faster (7.5 against 9.1 ms at T = 512, 16 heads).
TRANSPOSE_BY_BLOCKS_PAST = 512


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


def _check_table(x, table):
    if table.shape[-2] != 2 * x.size(-2) - 1:
        raise ValueError(f"a table of {table.shape[-2]} offsets for {x.size(-2)} positions: it needs 2T - 1")


def _transposed(scores):
    """(B, H, n, m) ``scores`` (B, H, m, n) transposed, between a band and columns of S (``n`` or ``m`` is T):
    a view, or past TRANSPOSE_BY_BLOCKS_PAST positions a copy through a contiguous one and each head's
    blocked transpose."""
    if max(scores.shape[-2:]) <= TRANSPOSE_BY_BLOCKS_PAST:
        return scores.transpose(-1, -2)
    source = scores.contiguous()
    transposed = source.new_empty(*source.shape[:2], source.size(-1), source.size(-2))
    for b in range(source.size(0)):
        for h in range(source.size(1)):
            transposed[b, h].copy_(source[b, h].t())
    return transposed


def _band_gradients(write_strip, x, table):
    """The gradients of x and of the table of the band products whose scores' gradient, band by band, is
    written into a band's strip (B, H, rows, T) by ``write_strip(strip, rows_slice)``."""
    batch, heads, seq_len, _ = x.shape
    grad_x = torch.empty_like(x)
    grad_table = torch.zeros_like(table)
    full = None  # one buffer for the full bands: its entries outside the strip stay zero
    for queries, rows, reached in _bands(seq_len):
        if rows == BAND_ROWS:
            full = x.new_zeros(batch, heads, rows, seq_len + rows - 1) if full is None else full
            band = full
        else:
            band = x.new_zeros(batch, heads, rows, seq_len + rows - 1)
        write_strip(_strip(band, rows, seq_len), queries)
        grad_x[:, :, queries] = torch.matmul(band, table[:, reached])
        for b in range(batch):  # accumulated in place: no (B, H, rows, d) product to sum over the batch
            grad_table[:, reached].baddbmm_(band[b].transpose(-1, -2), x[b, :, queries])
    return grad_x, grad_table


class ToeplitzScores(torch.autograd.Function):
    """``x`` (B, H, T, d), ``table`` (H, 2T - 1, d) -> S (B, H, T, T), see the module docstring; with
    ``x_t`` and ``table_t`` of the same shapes, S plus their scores transposed."""

    @staticmethod
    def forward(ctx, x, table, x_t=None, table_t=None):
        _check_table(x, table)
        batch, heads, seq_len, _ = x.shape
        scores = x.new_empty(batch, heads, seq_len, seq_len)
        for queries, rows, reached in _bands(seq_len):
            band = torch.matmul(x[:, :, queries], table[:, reached].transpose(-1, -2))
            scores[:, :, queries] = _strip(band, rows, seq_len)
        if x_t is not None:
            _check_table(x_t, table_t)
            for keys, rows, reached in _bands(seq_len):
                band = torch.matmul(x_t[:, :, keys], table_t[:, reached].transpose(-1, -2))
                scores[:, :, :, keys].add_(_transposed(_strip(band, rows, seq_len)))
        ctx.save_for_backward(x, table, x_t, table_t)
        return scores

    @staticmethod
    def backward(ctx, grad):
        x, table, x_t, table_t = ctx.saved_tensors
        grads = _band_gradients(lambda strip, queries: strip.copy_(grad[:, :, queries]), x, table)
        if x_t is None:
            return *grads, None, None
        return *grads, *_band_gradients(lambda strip, keys: strip.copy_(_transposed(grad[:, :, :, keys])),
                                        x_t, table_t)


def offset_scores(x, rows, offsets):
    """``S[b, h, i, j] = x[b, h, i] . rows[h, offsets[j - i + T - 1]]`` (a table row that depends on j - i
    alone) by bands (:class:`ToeplitzScores`) over the rows laid out by offset: even for a table of fewer rows
    than a band reaches, where x against every row is the smaller product, gathering its (T, T) entries (and
    scattering them back) cost more: DeBERTa's training step at T = 2048 on CPU, 2.5 s with them, 2.0 s by
    bands."""
    return ToeplitzScores.apply(x, rows[:, offsets])


def offset_scores_with_transposed(x, rows, offsets, x_t, rows_t, offsets_t):
    """``offset_scores(x, rows, offsets) + offset_scores(x_t, rows_t, offsets_t)^T`` as one (B, H, T, T)
    tensor, the second term added band by band (DeBERTa's c2p plus p2c)."""
    return ToeplitzScores.apply(x, rows[:, offsets], x_t, rows_t[:, offsets_t])
