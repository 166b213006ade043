"""KERPLE (Chi, Fan, Ramadge, Rudnicky, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", arXiv 2205.09921): the bias of a conditionally positive definite kernel of the distance,
made bidirectional for encoders through |j - i|. Per head h:

* logarithmic variant (``--rel-pos kerple-log``): bias[h, i, j] = -r1_h log(1 + r2_h |j - i|);
* power variant (``--rel-pos kerple-power``): bias[h, i, j] = -r1_h |j - i|^r2_h, 0 < r2_h <= 2.

r1 and r2 are learned per head and positive by construction: r = softplus(a) of a raw parameter a, and
the power variant's exponent r2 = 2 sigmoid(a), in (0, 2). Every head starts at r1 = r2 = 1.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .offset_bias import OffsetBias

SOFTPLUS_OF_ONE = math.log(math.e - 1)  # softplus(SOFTPLUS_OF_ONE) = 1


class KerpleBias(OffsetBias):
    """The (H, T, T) KERPLE bias, shared by all layers; r1, r2 learned per head."""

    def __init__(self, num_heads, power=False, zero_cls=False):
        super().__init__(zero_cls)
        self.power = power
        self.raw_r1 = nn.Parameter(torch.full((num_heads,), SOFTPLUS_OF_ONE))
        self.raw_r2 = nn.Parameter(torch.full((num_heads,), 0.0 if power else SOFTPLUS_OF_ONE))

    def coefficients(self):
        """(r1, r2), each (H,), positive; r2 <= 2 in the power variant."""
        r2 = 2 * torch.sigmoid(self.raw_r2) if self.power else F.softplus(self.raw_r2)
        return F.softplus(self.raw_r1), r2

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)) for j - i = -(T-1)..T-1."""
        r1, r2 = (r[:, None] for r in self.coefficients())
        offsets = torch.arange(1 - seq_len, seq_len, device=r1.device)
        distance = offsets.abs().to(r1.dtype)[None]
        if self.power:
            # 0^r2 = 0 at offset 0, where the power is taken of 1 so that its r2-derivative is 0, not nan
            powered = torch.where(distance > 0, distance.clamp(min=1) ** r2, torch.zeros_like(distance))
            return offsets, -r1 * powered
        return offsets, -r1 * torch.log1p(r2 * distance)


def build_kerple_bias(config):
    """The KERPLE bias of a :class:`~.position_config.PositionConfig`, or None."""
    if not config.kerple:
        return None
    return KerpleBias(config.num_heads, power=config.kerple_power, zero_cls=config.zero_cls_bias)
