"""T5 relative position bias (TUPE Eq. 5 and 8): one scalar b[h, bucket(j - i)] per head and bucket."""

import math

import torch
from torch import nn


def relative_position_bucket(
    relative_position, num_buckets=32, max_distance=128, bidirectional=True
):
    """Map ``relative_position = key - query`` to T5's buckets (Raffel et al., 2020).

    Bidirectional: half of the buckets for keys before the query (and the query itself), half
    (offset ``num_buckets // 2``) for keys after it. Within a half, the first half of its buckets
    hold exact distances, the rest are log-spaced up to ``max_distance`` and clipped to the last.

    Computed on the CPU in float64 and returned on the input's device: at distances such as 16, 32
    and 64 (defaults) the logarithm lands exactly on a bucket boundary, where a float32 logarithm on
    another device can round to the bucket below. The CPU result is the one the TUPE authors'
    released model was trained with.
    """
    device = relative_position.device
    relative_position = relative_position.cpu()
    if bidirectional and num_buckets % 2:
        raise ValueError(f"bidirectional T5 buckets need an even num_buckets, got {num_buckets}")
    n = -relative_position
    bucket = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(
            f"T5 buckets need max_distance ({max_distance}) > exact buckets ({max_exact}) >= 1"
        )
    log_ratio = torch.log(n.clamp(min=1).double() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return (bucket + torch.where(n < max_exact, n, large)).to(device)


class T5RelativeBias(nn.Module):
    """The (H, T, T) bias b[h, bucket(j - i)], shared by all layers (TUPE Eq. 5 / 8).

    The bias depends on j - i only: it is looked up for the 2T - 1 offsets and spread into the
    Toeplitz (T, T) matrix through a strided window view, so its backward sums along diagonals and
    scatters 2T - 1 rows into the table, not T^2 (on CPU at T = 512 that scatter cost more than
    the rest of the shared term's forward and backward together).
    """

    kind = "t5"

    def __init__(self, num_heads, num_buckets=32, max_distance=128):
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        zero_offset = relative_position_bucket(torch.zeros(1, dtype=torch.long), num_buckets, max_distance)
        self.register_buffer("_offset_buckets", zero_offset, persistent=False)

    def offset_buckets(self, seq_len):
        """Buckets of the offsets j - i = -(T-1)..T-1, cached for the longest length seen."""
        longest = (self._offset_buckets.numel() + 1) // 2
        if longest < seq_len:
            offsets = torch.arange(1 - seq_len, seq_len)
            buckets = relative_position_bucket(offsets, self.num_buckets, self.max_distance)
            self._offset_buckets = buckets.to(self._offset_buckets.device)
            longest = seq_len
        return self._offset_buckets[longest - seq_len: longest + seq_len - 1]

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)): b[h, bucket(j - i)] for j - i = -(T-1)..T-1."""
        offsets = torch.arange(1 - seq_len, seq_len, device=self._offset_buckets.device)
        return offsets, self.relative_attention_bias(self.offset_buckets(seq_len)).t()

    def forward(self, seq_len):
        per_offset = self.per_offset(seq_len)[1]
        # window r holds the offsets r - (T - 1) .. r, which are the j - i of row i = T - 1 - r
        return per_offset.unfold(1, seq_len, 1).flip(1)
