"""Attention biases of the offset j - i alone, shared by all layers: every ``--rel-pos`` but Shaw's.

TUPE is Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595. A
subclass gives the bias of each offset (:meth:`OffsetBias.per_offset`); the (H, T, T) matrix is that row
spread into a Toeplitz matrix through a strided window view, so its backward sums along diagonals and
scatters 2T - 1 rows into a learned table, not T^2 (measured in docs/benchmarks.md).

Under the paper's [CLS] reset (``zero_cls``) the bias's row 0 and column 0 are zeroed: TUPE's Eq. 11
replaces row/column 0 of the whole content-free term by theta_1/theta_2, which the untied term carries
(:mod:`.untied_position`).
"""

from torch import nn


class OffsetBias(nn.Module):
    def __init__(self, zero_cls=False):
        super().__init__()
        self.zero_cls = zero_cls

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)) for j - i = -(T-1)..T-1."""
        raise NotImplementedError

    def forward(self, seq_len):
        """The (H, T, T) bias, a fresh tensor."""
        # contiguous rows (a table lookup gives (2T-1, H) transposed): the flip's copy then lays the
        # matrix out as (H, T, T), the layout the attention kernels read the bias in
        per_offset = self.per_offset(seq_len)[1].contiguous()
        # window r holds the offsets r - (T - 1) .. r, which are the j - i of row i = T - 1 - r
        return per_offset.unfold(1, seq_len, 1).flip(1)

    def contribute(self, term, seq_len):
        """Add the (H, T, T) bias to ``term`` (a :class:`~.positional_term.PositionalTerm`)."""
        bias = self(seq_len)
        if self.zero_cls:  # in place: forward returns a fresh tensor
            bias[:, 0, :] = 0
            bias[:, :, 0] = 0
        term.bias = bias
