"""Sinusoids of positions with fixed or learnable frequencies (Vaswani et al.; seed 000 §3.2, Table 1).

P(x) = [.., sin(w_i x), cos(w_i x), ..] (pairs interleaved), w_i = (1/10000)^(2i/D) at initialisation;
with ``learnable=True`` the D/2 frequencies are parameters (seed 000's learnable sinusoidal PEs).
"""

import torch
from torch import nn


def initial_frequencies(dim):
    return 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float) / dim)


class Sinusoid(nn.Module):
    def __init__(self, dim, learnable=False):
        super().__init__()
        if dim % 2:
            raise ValueError(f"sinusoidal position encodings need an even dimension, got {dim}")
        self.dim = dim
        self.learnable = learnable
        frequencies = initial_frequencies(dim)
        if learnable:
            self.frequencies = nn.Parameter(frequencies)
        else:
            self.register_buffer("frequencies", frequencies)

    def forward(self, positions):
        """positions: integer or float tensor (...,) -> (..., dim), in the frequencies' dtype.

        The angles are taken in float32 whatever that dtype: in a model cast to bf16 (fp16), positions
        above 256 (2048) are not representable, and an angle of a few hundred radians is off by up to
        a radian (a quarter), which left the sinusoids of long inputs wrong (fairseq's --bf16/--fp16).
        Fixed frequencies are float32 too (the cast rounds the buffer); learnable ones are used as
        stored, in the precision the model trains them in.
        """
        frequencies = self.frequencies.float()
        if not self.learnable and self.frequencies.dtype != torch.float32:
            frequencies = initial_frequencies(self.dim).to(frequencies.device)
        angles = positions.float()[..., None] * frequencies
        waves = torch.stack([angles.sin(), angles.cos()], -1).flatten(-2)
        return waves.to(self.frequencies.dtype)
