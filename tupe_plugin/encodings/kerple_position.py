"""KERPLE (Chi, Fan, Ramadge, Rudnicky, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", arXiv 2205.09921): the bias of a conditionally positive definite kernel of the distance,
made bidirectional for encoders through |j - i|. Per head h:

* logarithmic variant (``--rel-pos kerple-log``): bias[h, i, j] = -r1_h log(1 + r2_h |j - i|);
* power variant (``--rel-pos kerple-power``): bias[h, i, j] = -r1_h |j - i|^r2_h, 0 < r2_h <= 2.

r1 and r2 are learned per head and kept positive in one of two ways (``--kerple-param``):

* ``clamped`` (default), as the authors' released code (``megatron/mpu/layers.py`` of chijames/KERPLE):
  the parameters are r1 and r2 themselves, clamped in place before each forward to >= 0.01 (the power
  exponent to [0.01, 2]); they start at random per head, the log variant's r1 ~ U[0, 2) and r2 ~ U[0, 1),
  the power variant's r1 ~ U[0, 1) and exponent r2 ~ U[0, 2) (the released ``bias_p`` ~ 2 U[0, 1) is the
  log's multiplier and the power's exponent, ``bias_a`` ~ U[0, 1) the other);
* ``softplus``, this plugin's first form, kept for the checkpoints trained with it: r = softplus(a) of a
  raw parameter a (the exponent 2 sigmoid(a), which never reaches 2), every head started at r1 = r2 = 1.
  It leaves the parameters untouched by the forward and never stops their gradient; the clamped form can
  set a coefficient to its bound, from where the gradient moves it again.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..terms.parts import OffsetRows
from .encoding import Encoding, option
from .offset_bias import OffsetBias

SOFTPLUS_OF_ONE = math.log(math.e - 1)  # softplus(SOFTPLUS_OF_ONE) = 1
SMALLEST = 0.01  # the released code's lower bound of every coefficient
LARGEST_EXPONENT = 2.0


@dataclass(frozen=True)
class KerpleOptions:
    kerple_param: str = option(
        "clamped", choices=("clamped", "softplus"), before="softplus",
        help="KERPLE: how r1, r2 are kept positive; clamped = learned as they are, clamped to >= 0.01 (the "
        "power exponent to [0.01, 2]) before each forward, started at random per head as the authors' "
        "released code (default); softplus = r = softplus(a) (the exponent 2 sigmoid(a)), every head "
        "started at r1 = r2 = 1 (checkpoints saved before this option)")

    @property
    def kerple_power(self):
        """KERPLE's power variant -r1 |j - i|^r2."""
        return self.rel_pos == "kerple-power"

    @property
    def kerple_clamped(self):
        """r1, r2 learned as they are and clamped, as released."""
        return self.kerple_param == "clamped"


class KerpleBias(OffsetBias):
    """The (H, T, T) KERPLE bias, shared by all layers; r1, r2 learned per head."""

    def __init__(self, num_heads, power=False, zero_cls=False, clamped=True):
        super().__init__(zero_cls)
        self.power = power
        self.clamped = clamped
        if clamped:
            multiplier, other = (torch.rand(num_heads), 2 * torch.rand(num_heads)) if power \
                else (2 * torch.rand(num_heads), torch.rand(num_heads))
            self.r1 = nn.Parameter(multiplier)
            self.r2 = nn.Parameter(other)
        else:
            self.raw_r1 = nn.Parameter(torch.full((num_heads,), SOFTPLUS_OF_ONE))
            self.raw_r2 = nn.Parameter(torch.full((num_heads,), 0.0 if power else SOFTPLUS_OF_ONE))

    def coefficients(self):
        """(r1, r2), each (H,), positive; r2 <= 2 in the power variant. The clamped form clamps its
        parameters in place first."""
        if self.clamped:
            # on .data, as released: the parameters' version is kept, so a second call within a forward
            # does not invalidate what the first saved for the backward
            self.r1.data.clamp_(min=SMALLEST)
            self.r2.data.clamp_(SMALLEST, LARGEST_EXPONENT if self.power else None)
            return self.r1, self.r2
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
    """The KERPLE bias of a :class:`~.position_config.PositionConfig` that uses it."""
    return KerpleBias(config.num_heads, power=config.kerple_power, zero_cls=config.zero_cls_bias,
                      clamped=config.kerple_clamped)


KERPLE = Encoding(
    name="kerple", label="KERPLE", kind="distance_bias", family="rel_pos",
    choices=("kerple-log", "kerple-power"),
    choices_help="kerple-log / kerple-power = -r1 log(1 + r2|j-i|) / -r1 |j-i|^r2 with r1, r2 > 0 learned "
    "per head (Chi et al. 2022)",
    summary="the learned bias -r1_h log(1 + r2_h |j - i|) (log) or -r1_h |j - i|^r2_h (power) of the "
    "distance",
    citation="Chi, Fan, Ramadge, Rudnicky, KERPLE: Kernelized Relative Positional Embedding for Length "
    "Extrapolation, arXiv 2205.09921",
    slot="relative_bias", options=KerpleOptions, build=build_kerple_bias,
    export_names=(("r1", "kerple_r1"), ("r2", "kerple_r2"), ("raw_r1", "kerple_raw_r1"),
                  ("raw_r2", "kerple_raw_r2")),
    exported=True, parts=(OffsetRows,),
)
