"""The [CLS] reset as the TUPE authors' released code computes it (``--cls-reset release``).

The release departs from TUPE's Eq. 9 and 11 (see docs/official_tupe.md):

* The untied table has ``max_positions + 1`` rows; position t uses row t + 1. theta_1 and theta_2
  are not built from two extra vectors but read off the untied term itself: theta_1[h] is row 0's
  self-correlation (p_0 U^Q_h)(p_0 U^K_h), theta_2[h] the self-correlation of row 1 (the ``<s>``
  slot). They then reset row 0 and column 0 of the untied term as in Eq. 9.
* The T5 table has ``num_buckets + 1`` rows and is reset on its own: the bucket of every pair
  (i, 0) becomes the extra bucket ``num_buckets``, then the bucket of every pair (0, j) becomes
  ``num_buckets // 2`` (a bucket no ordinary pair uses). The reset thus applies to each term
  separately, not to their sum as in Eq. 11.
"""

import torch
from torch import nn

from .relative_position import T5RelativeBias, relative_position_bucket
from .untied_position import UntiedPositionalCorrelation


class ReleaseUntiedPositionalCorrelation(UntiedPositionalCorrelation):
    """Untied term over table rows 1..T; theta_1, theta_2 = self-correlations of rows 0 and 1."""

    def __init__(self, max_positions, embed_dim, num_heads, proj_bias=False):
        super().__init__(max_positions + 1, embed_dim, num_heads, proj_bias=proj_bias)
        self.max_positions = max_positions

    def _rows(self, seq_len):
        return self.embed_positions.weight[1 : seq_len + 1]

    def cls_thetas(self):
        """(theta_1, theta_2) per head, unscaled: self-correlations of table rows 0 and 1, (H, 2)."""
        q, k = self._project(self.embed_positions.weight[:2])
        return (q * k).sum(-1)


class ReleaseT5RelativeBias(T5RelativeBias):
    """T5 bias with one extra bucket: pairs (i, 0) use it, pairs (0, j) bucket ``num_buckets // 2``."""

    def __init__(self, num_heads, num_buckets=32, max_distance=128):
        super().__init__(num_heads, num_buckets, max_distance)
        self.relative_attention_bias = nn.Embedding(num_buckets + 1, num_heads)
        self.register_buffer("_buckets", torch.zeros(0, 0, dtype=torch.long), persistent=False)

    def buckets(self, seq_len):
        """Bucket index of every (query i, key j) pair, cached for the longest length seen."""
        if self._buckets.size(0) < seq_len:
            positions = torch.arange(seq_len, device=self._buckets.device)
            relative = positions[None, :] - positions[:, None]
            buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance)
            buckets[:, 0] = self.num_buckets
            buckets[0, :] = self.num_buckets // 2
            self._buckets = buckets
        return self._buckets[:seq_len, :seq_len]

    def forward(self, seq_len):
        return self.relative_attention_bias(self.buckets(seq_len)).permute(2, 0, 1)
