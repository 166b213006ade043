"""ALiBi, attention with linear biases (Press, Smith, Lewis, "Train Short, Test Long: Attention with
Linear Biases Enables Input Length Extrapolation", arXiv 2108.12409), in its bidirectional form for
encoders: bias[h, i, j] = -m_h |j - i|, fixed, no parameters.

Slopes as the paper's reference code: for H a power of two, m_h = 2^(-8h/H), h = 1..H; otherwise,
with n the largest power of two below H, the n slopes for n heads followed by every other slope
(starting with the first) of the 2n-head sequence, H - n of them.
"""

import math

import torch

from .offset_bias import OffsetBias


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


class AlibiBias(OffsetBias):
    """The (H, T, T) bias -m_h |j - i|, shared by all layers; a buffer, never trained."""

    def __init__(self, num_heads, zero_cls=False):
        super().__init__(zero_cls)
        self.register_buffer("slopes", alibi_slopes(num_heads).float(), persistent=False)

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)): -m_h |j - i| for j - i = -(T-1)..T-1."""
        offsets = torch.arange(1 - seq_len, seq_len, device=self.slopes.device)
        return offsets, -self.slopes[:, None] * offsets.abs().to(self.slopes.dtype)[None]


def build_alibi_bias(config):
    """The ALiBi bias of a :class:`~.position_config.PositionConfig`, or None."""
    return AlibiBias(config.num_heads, zero_cls=config.zero_cls_bias) if config.alibi else None
