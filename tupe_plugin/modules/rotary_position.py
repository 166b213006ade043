"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer", arXiv 2104.09864).

Every layer rotates each pair (2k, 2k+1) of the query at position i by the angle theta_k i, and of the
key at j by theta_k j, so that q_i . k_j depends on j - i only; theta_k = base^(-2k/d_h), base 10000.
The cos/sin tables are computed once per forward and shared by all layers. ``learnable=True`` makes
the d_h/2 frequencies parameters initialised at theta_k (the learnable sinusoids of Wang et al.,
"On Position Embeddings in BERT", ICLR 2021, applied to rotation).
"""

import torch
from torch import nn

from .sinusoid import Sinusoid


class RotaryPosition(nn.Module):
    def __init__(self, head_dim, base=10000.0, learnable=False):
        super().__init__()
        self.sinusoid = Sinusoid(head_dim, learnable, base)

    @property
    def kind(self):
        return "learnable-rotary" if self.sinusoid.learnable else "rotary"

    def forward(self, seq_len):
        """(cos, sin) of the angles theta_k t for t = 0..T-1, each (T, d_h / 2)."""
        frequencies = self.sinusoid.frequencies
        angles = self.sinusoid.angles(torch.arange(seq_len, device=frequencies.device).to(frequencies.dtype))
        return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """x (..., T, d) with pairs (2k, 2k+1) rotated by the angles whose cos/sin are (T, d/2)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)
