"""Attention biases of the offset j - i alone, shared by all layers: every ``--rel-pos`` but Shaw's.

TUPE is Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595. A
subclass gives the bias of each offset (:meth:`OffsetBias.per_offset`), which the forward's term keeps as
its Toeplitz rows (H, 2T - 1) (:mod:`tupe_plugin.attention.offset_rows`): the CPU kernels read them tile by
tile and sum their gradient by offset, so the backward scatters 2T - 1 rows into a learned table, not T^2;
the (H, T, T) matrix (:meth:`OffsetBias.forward`) is built only for the paths that take a dense bias.

Under the paper's [CLS] reset (``zero_cls``) the bias's row 0 and column 0 are zeroed (the term's
[CLS] values are 0): TUPE's Eq. 11 replaces row/column 0 of the whole content-free term by theta_1/theta_2,
which the untied term carries (:mod:`.untied_position`).
"""

from torch import nn

from ..terms.parts import OffsetRows


def toeplitz(rows, cls=None):
    """The dense (H, T, T) bias of the rows (H, 2T - 1), ``rows[h, j - i + T - 1]`` at query i and key j,
    with the [CLS] reset ``cls`` (H, 2) in force (theta_1 in row 0, theta_2 in column 0 of the rows
    i != 0); a fresh tensor."""
    seq_len = (rows.size(-1) + 1) // 2
    # contiguous rows (a table lookup gives (2T-1, H) transposed): the flip's copy then lays the matrix out as
    # (H, T, T), the layout the attention kernels read the bias in; window w holds the offsets
    # w - (T - 1) .. w, which are the j - i of row i = T - 1 - w
    dense = rows.contiguous().unfold(-1, seq_len, 1).flip(-2)
    if cls is not None:
        cls = cls.to(dense.dtype)
        dense[:, 1:, 0] = cls[:, 1, None]
        dense[:, 0, :] = cls[:, 0, None]
    return dense


class OffsetBias(nn.Module):
    def __init__(self, zero_cls=False):
        super().__init__()
        self.zero_cls = zero_cls

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)) for j - i = -(T-1)..T-1."""
        raise NotImplementedError

    def forward(self, seq_len):
        """The (H, T, T) bias, a fresh tensor (without the reset)."""
        return toeplitz(self.per_offset(seq_len)[1])

    def contribute(self, term, forward):
        """Add the bias's rows (H, 2T - 1) to ``term`` (a :class:`~.positional_term.PositionalTerm`) as an
        :class:`~tupe_plugin.terms.parts.OffsetRows`, with a [CLS] reset to 0 under ``zero_cls``."""
        rows = self.per_offset(forward.seq_len)[1]
        term.add(OffsetRows(rows, rows.new_zeros(rows.size(0), 2) if self.zero_cls else None))
