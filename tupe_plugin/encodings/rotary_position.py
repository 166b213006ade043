"""Rotary position embedding, RoPE (Su, Lu, Pan, Murtadha, Wen, Liu, "RoFormer: Enhanced Transformer with
Rotary Position Embedding", arXiv 2104.09864).

Every layer rotates each pair (2k, 2k+1) of the query at position i by the angle theta_k i, and of the
key at j by theta_k j, so that q_i . k_j depends on j - i only; theta_k = base^(-2k/d_h), base 10000.
The cos/sin tables are computed once per forward and shared by all layers. ``learnable=True`` makes
the d_h/2 frequencies parameters initialised at theta_k (the learnable sinusoids of Wang, Shang, Lioma,
Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT", ICLR 2021, applied to rotation).

Two scalings for inputs longer than in training (``--rotary-scaling``, by a factor F > 1), which change
the angles only, never a parameter or a buffer (a checkpoint trained without them loads unchanged):

- ``linear``: position interpolation (Chen et al., "Extending Context Window of Large Language Models via
  Positional Interpolation", arXiv 2306.15595): position p is rotated as p / F. With learnable
  frequencies too: the learned theta_k are kept, the positions divided.
- ``ntk``: NTK-aware scaling (bloc97 2023, as in Peng et al., "YaRN: Efficient Context Window Extension
  of Large Language Models", arXiv 2309.00071, §3): theta_k = base'^(-2k/d_h) with
  base' = base F^(d_h/(d_h-2)), so the lowest frequency is divided by F and the highest kept. A change
  of the fixed base: learnable frequencies have none (refused by
  :class:`~.position_config.PositionConfig`).
"""

import torch
from torch import nn

from ..terms.parts import Rotary
from .sinusoid import Sinusoid, initial_frequencies


def ntk_base(base, factor, head_dim):
    """NTK-aware base' = base F^(d/(d-2)) (YaRN §3), d the rotary dimension (d > 2)."""
    return base * factor ** (head_dim / (head_dim - 2))


class RotaryPosition(nn.Module):
    def __init__(self, head_dim, base=10000.0, learnable=False, scaling="none", factor=1.0):
        super().__init__()
        self.sinusoid = Sinusoid(head_dim, learnable, base)
        self.scaling, self.factor = scaling, factor

    def angles(self, positions):
        """positions (...,) -> (..., d_h / 2) float32 angles theta_k p, with the scaling applied."""
        if self.scaling == "linear":
            return self.sinusoid.angles(positions.float() / self.factor)
        if self.scaling == "ntk":
            head_dim = self.sinusoid.dim
            frequencies = initial_frequencies(head_dim, ntk_base(self.sinusoid.base, self.factor, head_dim))
            return positions.float()[..., None] * frequencies.to(positions.device)
        return self.sinusoid.angles(positions)

    def forward(self, seq_len):
        """(cos, sin) of the angles theta_k t for t = 0..T-1, each (T, d_h / 2), in the model's dtype.

        Positions, angles, cos and sin are float32 whatever dtype the model was cast to (fairseq's
        --bf16/--fp16): bf16 cannot tell position 257 from 256, which gave neighbouring positions one
        rotation. Only the finished tables are cast, as :meth:`.Sinusoid.forward` does.
        """
        angles = self.angles(torch.arange(seq_len, device=self.sinusoid.frequencies.device))
        dtype = self.sinusoid.output_dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def contribute(self, term, seq_len):
        """Add the cos/sin tables every layer rotates q and k by to ``term`` (a
        :class:`~tupe_plugin.terms.parts.Rotary`)."""
        term.add(Rotary(*self(seq_len)))


def rotate(x, cos, sin):
    """x (..., T, d) with pairs (2k, 2k+1) rotated by the angles whose cos/sin are (T, d/2)."""
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


def rotates_in_place(cos, sin):
    """Whether q and k may be rotated where they lie: tables without gradient keep nothing of them for the
    backward; learnable frequencies need the unrotated q and k for their gradient."""
    return not (cos.requires_grad or sin.requires_grad)


def rotate_in_place(qk, cos, sin):
    """q and k of a layer's (B, T, 2, H, d) projection slice rotated where they lie (tables of
    :func:`rotates_in_place` only): the projection then holds the rotated query and key the attention
    keeps, instead of a second copy beside it. In float32 and float64 each pair is multiplied as the
    complex number q_2k + i q_2k+1 by e^(i theta_k t) (RoFormer Eq. 34), one pass forward and one
    backward where the real form makes eight over strided halves (at B = 2, T = 512, d = 512, one thread:
    5.5 against 21 ms a layer, forward and backward); other dtypes (bf16, fp16) take the real form."""
    cos, sin = cos[:, None, None], sin[:, None, None]
    if qk.dtype in (torch.float32, torch.float64):
        pairs = torch.view_as_complex(qk.unflatten(-1, (-1, 2)))
        pairs.mul_(torch.complex(cos.to(qk.dtype), sin.to(qk.dtype)))
        return
    qk.copy_(rotate(qk, cos, sin))


def build_rotary(config):
    """The RoPE tables of a :class:`~.position_config.PositionConfig`, or None."""
    if not config.rotary_applies:
        return None
    return RotaryPosition(config.head_dim, config.rotary_base, config.learnable_rotary_frequencies,
                          config.rotary_scaling, config.rotary_scaling_factor)
