"""Rotary position embedding, RoPE (Su, Lu, Pan, Murtadha, Wen, Liu, "RoFormer: Enhanced Transformer with
Rotary Position Embedding", arXiv 2104.09864).

Every layer rotates each pair (2k, 2k+1) of the query at position i by the angle theta_k i, and of the
key at j by theta_k j, so that q_i . k_j depends on j - i only; theta_k = base^(-2k/d_h), base 10000.
The cos/sin tables are computed once per forward and shared by all layers. ``learnable=True`` makes
the d_h/2 frequencies parameters initialised at theta_k (the learnable sinusoids of Wang, Shang, Lioma,
Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT", ICLR 2021, applied to rotation).
"""

import torch
from torch import nn

from .sinusoid import Sinusoid


class RotaryPosition(nn.Module):
    def __init__(self, head_dim, base=10000.0, learnable=False):
        super().__init__()
        self.sinusoid = Sinusoid(head_dim, learnable, base)

    def forward(self, seq_len):
        """(cos, sin) of the angles theta_k t for t = 0..T-1, each (T, d_h / 2), in the frequencies' dtype.

        Positions, angles, cos and sin are float32 whatever dtype the model was cast to (fairseq's
        --bf16/--fp16): bf16 cannot tell position 257 from 256, which gave neighbouring positions one
        rotation. Only the finished tables are cast, as :meth:`.Sinusoid.forward` does.
        """
        frequencies = self.sinusoid.frequencies
        angles = self.sinusoid.angles(torch.arange(seq_len, device=frequencies.device))
        return angles.cos().to(frequencies.dtype), angles.sin().to(frequencies.dtype)

    def contribute(self, term, seq_len):
        """Add the cos/sin tables every layer rotates q and k by to ``term``."""
        term.rotary_cos, term.rotary_sin = self(seq_len)


def rotate(x, cos, sin):
    """x (..., T, d) with pairs (2k, 2k+1) rotated by the angles whose cos/sin are (T, d/2)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


def build_rotary(config):
    """The RoPE tables of a :class:`~.position_config.PositionConfig`, or None."""
    if not config.rotary_applies:
        return None
    return RotaryPosition(config.head_dim, config.rotary_base, config.learnable_rotary_frequencies)
