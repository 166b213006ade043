"""The terms of the attention logits that depend on the content and on the offset j - i, as the kernels read
them: Shaw keys (Shaw, Uszkoreit, Vaswani, arXiv 1803.02155; Wang et al., "On Position Embeddings in
BERT", ICLR 2021, Eq. 4), ``scale q_i . a_{clip(j - i)}``, and DeBERTa's c2p and p2c (He et al., arXiv
2006.03654, Eq. 4, in the released form, docs/deberta.md), ``scale q_i . K^r_delta(i, j)`` and
``scale k_j . Q^r_{p2c row}``.

Every pair (query i, key j) reads the table row its offset names: ``offsets[j - i + T - 1]`` of a (2T - 1,)
vector (:func:`offsets_of`). The Triton kernel takes the table rows themselves (:class:`RelativeRows`) and
forms the dot products per tile; FlexAttention's score_mod reads the products of q (and k) with every row
(:class:`RelativeProducts`, built from the rows by :meth:`RelativeRows.products`). A bias of the offset
alone, content-free (T5's buckets, ALiBi, KERPLE, Sandwich, FIRE), is its Toeplitz rows, one value per
offset and head, with TUPE's [CLS] reset (Ke, He, Liu, arXiv 2006.15595, Eq. 9-11) as two values per head
in their place (:func:`distance_bias_inputs`).
"""

from dataclasses import dataclass
from typing import Optional

import torch


def offsets_of(index):
    """The (2T - 1,) row by offset of a (T, T) ``index`` that depends on j - i alone: ``index[i, j]`` at
    ``j - i + T - 1``."""
    return torch.cat([index[:, 0].flip(0), index[0, 1:]])


def distance_bias_inputs(bias_rows, cls, heads, seq_len):
    """A distance bias as both kernels read it, checked: ``bias_rows`` (H, 2T - 1), the pair (query i, key
    j) reading ``bias_rows[h, j - i + T - 1]``, and ``cls`` (H, 2), ``cls[h, 0]`` in their place on query
    row 0 and ``cls[h, 1]`` on key column 0 of the other rows; each contiguous, or None."""
    if bias_rows is not None and bias_rows.shape != (heads, 2 * seq_len - 1):
        raise ValueError(f"distance bias rows must be (H, 2T - 1) = ({heads}, {2 * seq_len - 1}) for T = "
                         f"{seq_len} (one value per offset j - i), got {tuple(bias_rows.shape)}")
    if cls is not None and cls.shape != (heads, 2):
        raise ValueError(f"[CLS] reset values must be (H, 2) = ({heads}, 2) (theta_1, theta_2 of each head), "
                         f"got {tuple(cls.shape)}")
    return tuple(None if t is None else t.contiguous() for t in (bias_rows, cls))


@dataclass(frozen=True)
class RelativeProducts:
    """The terms as FlexAttention reads them: ``query`` (B, H, T, R_q), scale q_i against every row of a
    table, and ``key`` (B, H, T, R_k), scale k_j against every row of another (each or both None); the pair
    (query i, key j) adds ``query[..., i, query_offsets[j - i + T - 1]]`` and
    ``key[..., j, key_offsets[j - i + T - 1]]`` to its logit."""

    query: Optional[torch.Tensor] = None
    query_offsets: Optional[torch.Tensor] = None
    key: Optional[torch.Tensor] = None
    key_offsets: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class RelativeRows:
    """The terms as the Triton kernel reads them: the table rows ``query`` (H or 1, R_q, d), against which q
    is multiplied, and ``key`` (H or 1, R_k, d), against which k is (each or both None; one row set shared
    by the heads where the first dimension is 1, as Shaw's table; d at most the head dimension, the first d
    of q's and k's); the pair (query i, key j) adds ``scale q_i . query[h, query_offsets[j - i + T - 1]]``
    and ``scale k_j . key[h, key_offsets[j - i + T - 1]]`` to its logit (any row by offset, monotone in
    j - i or not: the kernel reads the rows of each tile's window of offsets). Shaw keys: ``query`` the
    (1, 2K + 1, d_h) table by clip(j - i); DeBERTa: ``query`` K^r by delta(i, j) (c2p), ``key`` Q^r by the
    p2c row of the pair."""

    query: Optional[torch.Tensor] = None
    query_offsets: Optional[torch.Tensor] = None
    key: Optional[torch.Tensor] = None
    key_offsets: Optional[torch.Tensor] = None

    def products(self, q, k, scale):
        """The same terms as :class:`RelativeProducts` for q, k (B, H, T, D): scale q (k) against every
        query-side (key-side) row, (B, H, T, R) each."""
        return RelativeProducts(_products(q, self.query, scale), self.query_offsets,
                                _products(k, self.key, scale), self.key_offsets)


def _products(x, rows, scale):
    """scale x . rows^T over the rows' width (None without rows)."""
    if rows is None:
        return None
    return torch.matmul(x[..., :rows.size(-1)] * scale, rows.to(x.dtype).transpose(-1, -2))
