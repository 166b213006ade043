"""Sinusoids of positions with fixed or learnable frequencies.

Vaswani et al., "Attention Is All You Need", arXiv 1706.03762; Wang, Shang, Lioma, Jiang, Yang, Liu,
Simonsen, "On Position Embeddings in BERT", ICLR 2021, §3.2 and Table 1.
P(x) = [.., sin(w_i x), cos(w_i x), ..] (pairs interleaved), w_i = (1/10000)^(2i/D) at initialisation;
with ``learnable=True`` the D/2 frequencies are parameters (Wang et al.'s learnable sinusoidal PEs).
"""

import torch
from torch import nn


def initial_frequencies(dim, base=10000.0):
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float) / dim)


class Sinusoid(nn.Module):
    def __init__(self, dim, learnable=False, base=10000.0):
        super().__init__()
        if dim % 2:
            raise ValueError(f"sinusoidal position encodings need an even dimension, got {dim}")
        self.dim = dim
        self.learnable = learnable
        self.base = base
        frequencies = initial_frequencies(dim, base)
        if learnable:
            self.frequencies = nn.Parameter(frequencies)
        else:
            self.register_buffer("frequencies", frequencies)

    def angles(self, positions):
        """positions: integer or float tensor (...,) -> (..., dim / 2) angles w_i x, in float32.

        The angles are taken in float32 whatever the frequencies' dtype: in a model cast to bf16
        (fp16), positions above 256 (2048) are not representable, and an angle of a few hundred
        radians is off by up to a radian (a quarter), which left the sinusoids of long inputs wrong
        (fairseq's --bf16/--fp16). Fixed frequencies are float32 too (the cast rounds the buffer);
        learnable ones are used as stored, in the precision the model trains them in.
        """
        frequencies = self.frequencies.float()
        if not self.learnable and self.frequencies.dtype != torch.float32:
            frequencies = initial_frequencies(self.dim, self.base).to(frequencies.device)
        return positions.float()[..., None] * frequencies

    def forward(self, positions):
        """positions (...,) -> (..., dim), in the frequencies' dtype (computed in float32)."""
        angles = self.angles(positions)
        waves = torch.stack([angles.sin(), angles.cos()], -1).flatten(-2)
        return waves.to(self.frequencies.dtype)
