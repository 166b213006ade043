"""T5 relative position bias (seed 001 Eq. 5 and 8): one scalar b[h, bucket(j - i)] per head and bucket."""

import math

import torch
from torch import nn

REL_POS_CHOICES = ("none", "t5", "shaw-learned", "shaw-sinusoidal", "shaw-learnable-sinusoidal")


def relative_position_bucket(
    relative_position, num_buckets=32, max_distance=128, bidirectional=True
):
    """Map ``relative_position = key - query`` to T5's buckets (Raffel et al., 2020).

    Bidirectional: half of the buckets for keys before the query (and the query itself), half
    (offset ``num_buckets // 2``) for keys after it. Within a half, the first half of its buckets
    hold exact distances, the rest are log-spaced up to ``max_distance`` and clipped to the last.
    """
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
    log_ratio = torch.log(n.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(n < max_exact, n, large)


class T5RelativeBias(nn.Module):
    """The (H, T, T) bias b[h, bucket(j - i)], shared by all layers (seed 001 Eq. 5 / 8).

    The bias depends on j - i only: it is looked up for the 2T - 1 offsets and spread into the
    Toeplitz (T, T) matrix through a strided window view, so its backward sums along diagonals and
    scatters 2T - 1 rows into the table, not T^2 (on CPU at T = 512 that scatter cost more than
    the rest of the shared term's forward and backward together).
    """

    def __init__(self, num_heads, num_buckets=32, max_distance=128):
        super().__init__()
        relative_position_bucket(torch.zeros(1, dtype=torch.long), num_buckets, max_distance)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)

    def forward(self, seq_len):
        offsets = torch.arange(1 - seq_len, seq_len, device=self.relative_attention_bias.weight.device)
        buckets = relative_position_bucket(offsets, self.num_buckets, self.max_distance)
        per_offset = self.relative_attention_bias(buckets).t()
        # window r holds the offsets r - (T - 1) .. r, which are the j - i of row i = T - 1 - r
        return per_offset.unfold(1, seq_len, 1).flip(1)
