"""Sinusoids of positions with fixed or learnable frequencies.

Vaswani et al., "Attention Is All You Need", arXiv 1706.03762; Wang, Shang, Lioma, Jiang, Yang, Liu,
Simonsen, "On Position Embeddings in BERT", ICLR 2021, §3.2 and Table 1.
P(x) = [.., sin(w_i x), cos(w_i x), ..] (pairs interleaved), w_i = (1/10000)^(2i/D), i = 0..D/2-1, at
initialisation (``first=1``: i = 1..D/2, Sandwich's); with ``learnable=True`` the D/2 frequencies are
parameters (Wang et al.'s learnable sinusoidal PEs).
"""

import torch
from torch import nn


def initial_frequencies(dim, base=10000.0, first=0):
    return base ** (-torch.arange(2 * first, dim + 2 * first, 2, dtype=torch.float) / dim)


class Sinusoid(nn.Module):
    def __init__(self, dim, learnable=False, base=10000.0, first=0):
        super().__init__()
        if dim % 2:
            raise ValueError(f"sinusoidal position encodings need an even dimension, got {dim}")
        self.dim = dim
        self.learnable = learnable
        self.base = base
        frequencies = initial_frequencies(dim, base, first)
        if learnable:
            self.frequencies = nn.Parameter(frequencies)
        else:
            self.register_buffer("frequencies", frequencies)
        # follows the casts of the model (fairseq's --fp16 / --bf16): the dtype the waves are returned in
        self.register_buffer("dtype_probe", torch.empty(0), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        """Casts and moves as any module, except that the frequencies stay float32 when the model is cast
        to fp16 / bf16: a learned frequency rounded to bf16 (8 significant bits) is off by ~0.2 %, a radian
        at position 512, and a model trained in float32 then evaluated or fine-tuned with --bf16 saw
        positions past a few hundred wrongly. Their float32 value is kept, moved to the new device."""
        frequencies = self.frequencies.data
        super()._apply(fn, *args, **kwargs)
        if self.frequencies.dtype in (torch.float16, torch.bfloat16):
            self.frequencies.data = frequencies.to(self.frequencies.device, torch.float32)
        return self

    @property
    def output_dtype(self):
        """The dtype of the module's (the model's) floating-point tensors, which the waves are cast to."""
        return self.dtype_probe.dtype

    def angles(self, positions):
        """positions: integer or float tensor (...,) -> (..., dim / 2) angles w_i x, in float32.

        Positions, frequencies and angles are float32 whatever dtype the model was cast to: in bf16
        (fp16), positions above 256 (2048) are not representable, and an angle of a few hundred radians
        is off by up to a radian (a quarter), which left the sinusoids of long inputs wrong.
        """
        return positions.float()[..., None] * self.frequencies.float()

    def forward(self, positions):
        """positions (...,) -> (..., dim), computed in float32, returned in :attr:`output_dtype`."""
        angles = self.angles(positions)
        waves = torch.stack([angles.sin(), angles.cos()], -1).flatten(-2)
        return waves.to(self.output_dtype)
