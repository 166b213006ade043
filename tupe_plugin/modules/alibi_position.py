"""ALiBi, attention with linear biases (Press, Smith, Lewis 2022, "Train Short, Test Long", arXiv
2108.12409), in its bidirectional form for encoders: bias[h, i, j] = -m_h |j - i|, fixed, no parameters.

Slopes as the paper's reference code: for H a power of two, m_h = 2^(-8h/H), h = 1..H; otherwise,
with n the largest power of two below H, the n slopes for n heads followed by every other slope
(starting with the first) of the 2n-head sequence, H - n of them.
"""

import math

import torch
from torch import nn


def alibi_slopes(num_heads):
    """The H head slopes m_h, a float64 tensor."""
    def geometric(heads):
        return [2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)]

    if num_heads & (num_heads - 1) == 0:
        slopes = geometric(num_heads)
    else:
        below = 2 ** math.floor(math.log2(num_heads))
        slopes = geometric(below) + geometric(2 * below)[0::2][: num_heads - below]
    return torch.tensor(slopes, dtype=torch.float64)


class AlibiBias(nn.Module):
    """The (H, T, T) bias -m_h |j - i|, shared by all layers; a buffer, never trained."""

    kind = "alibi"

    def __init__(self, num_heads):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(num_heads).float(), persistent=False)

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)): -m_h |j - i| for j - i = -(T-1)..T-1."""
        offsets = torch.arange(1 - seq_len, seq_len, device=self.slopes.device)
        return offsets, -self.slopes[:, None] * offsets.abs().to(self.slopes.dtype)[None]

    def forward(self, seq_len):
        positions = torch.arange(seq_len, device=self.slopes.device)
        distance = (positions[None, :] - positions[:, None]).abs().to(self.slopes.dtype)
        return -self.slopes[:, None, None] * distance
