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
  :func:`check_rotary`).
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..terms.forward import as_positions
from .encoding import Encoding, option
from ..terms.parts import Rotary
from .sinusoid import Sinusoid, initial_frequencies


@dataclass(frozen=True)
class RotaryOptions:
    rotary_base: float = option(
        10000.0, metavar="B", help="RoPE's frequency base (default 10000)",
        stored_as=("rotary.sinusoid.frequencies", "RoPE's frequencies are stored in the checkpoint"))
    rotary_scaling: str = option(
        "none", choices=("none", "linear", "ntk"), at_evaluation=True,
        help="RoPE's angles scaled for inputs longer than in training, by --rotary-scaling-factor F (may be "
        "set when validating or fine-tuning a checkpoint trained without it): linear = position "
        "interpolation, position p rotated as p/F (Chen et al. 2023); ntk = NTK-aware scaling of the fixed "
        "base, base * F^(d_h/(d_h-2)) (bloc97 2023; YaRN, Peng et al. 2023, §3)")
    rotary_scaling_factor: float = option(1.0, metavar="F", at_evaluation=True,
                                          help="the factor F > 1 of --rotary-scaling, e.g. the evaluation "
                                          "length over the training length")

    @property
    def learnable_rotary_frequencies(self):
        """RoPE's frequencies are parameters (``--rotary learnable``)."""
        return self.rotary == "learnable"


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

    def forward(self, positions):
        """(cos, sin) of the angles theta_k t of ``positions``: a length T (t = 0..T-1; tables (T, d_h / 2)),
        or a tensor of positions (T,) or (B, T) (tables (..., d_h / 2)), in the model's dtype.

        Positions, angles, cos and sin are float32 whatever dtype the model was cast to (fairseq's
        --bf16/--fp16): bf16 cannot tell position 257 from 256, which gave neighbouring positions one
        rotation. Only the finished tables are cast, as :meth:`.Sinusoid.forward` does.
        """
        device = self.sinusoid.frequencies.device
        positions = as_positions(positions, device)
        angles = self.angles(positions)
        dtype = self.sinusoid.output_dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def contribute(self, term, forward):
        """Add the cos/sin tables every layer rotates q and k by to ``term`` (a
        :class:`~tupe_plugin.terms.parts.Rotary`): of the forward's positions, per sequence where each row
        has its own."""
        term.add(Rotary(*self(forward.positions)))


def rotate(x, cos, sin):
    """x (..., T, d) with pairs (2k, 2k+1) rotated by the angles whose cos/sin are (T, d/2), or for x
    (B, H, T, d) the (B, T, d/2) tables of each sequence's own positions."""
    even, odd = x[..., 0::2], x[..., 1::2]
    if cos.dim() == 3:  # per sequence: broadcast over the heads
        cos, sin = cos[:, None], sin[:, None]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


def rotates_in_place(cos, sin):
    """Whether q and k may be rotated where they lie: tables without gradient keep nothing of them for the
    backward; learnable frequencies need the unrotated q and k for their gradient."""
    return not (cos.requires_grad or sin.requires_grad)


def rotate_in_place(qk, cos, sin):
    """q and k of a layer's (B, T, 2, H, d) projection slice rotated where they lie by (T, d/2) or (B, T, d/2)
    tables (tables of
    :func:`rotates_in_place` only): the projection then holds the rotated query and key the attention
    keeps, instead of a second copy beside it. In float32 and float64 each pair is multiplied as the
    complex number q_2k + i q_2k+1 by e^(i theta_k t) (RoFormer Eq. 34), one pass forward and one
    backward where the real form makes eight over strided halves (at B = 2, T = 512, d = 512, one thread:
    5.5 against 21 ms a layer, forward and backward); other dtypes (bf16, fp16) take the real form."""
    cos, sin = cos[..., None, None, :], sin[..., None, None, :]  # over q/k and the heads
    if qk.dtype in (torch.float32, torch.float64):
        pairs = torch.view_as_complex(qk.unflatten(-1, (-1, 2)))
        pairs.mul_(torch.complex(cos.to(qk.dtype), sin.to(qk.dtype)))
        return
    qk.copy_(rotate(qk, cos, sin))


def build_rotary(config):
    """The RoPE tables of a :class:`~.position_config.PositionConfig` that uses it."""
    return RotaryPosition(config.head_dim, config.rotary_base, config.learnable_rotary_frequencies,
                          config.rotary_scaling, config.rotary_scaling_factor)


def scaling_overrides(scaling, factor):
    """The settings that scale RoPE's angles by ``factor`` (``scaling``: linear or ntk) at evaluation."""
    return {"rotary_scaling": scaling, "rotary_scaling_factor": factor}


def check_rotary(config):
    errors = []
    if config.head_dim % 2:
        errors.append(f"--rotary {config.rotary} rotates pairs of dimensions: the head dimension must be "
                      f"even, got {config.head_dim}")
    largest = torch.finfo(torch.float32).max
    if config.rotary_base <= 1:
        errors.append(f"--rotary-base must be > 1, got {config.rotary_base}")
    elif config.rotary_base > largest:
        errors.append(f"--rotary-base {config.rotary_base:g} is larger than float32's largest number "
                      f"({largest:.3g}), in which RoPE's angles are computed: every frequency but the first "
                      "would be 0; use 10000 (RoFormer's) or another base within float32")
    return errors + _scaling_errors(config)


def _scaling_errors(config):
    scaling, factor = config.rotary_scaling, config.rotary_scaling_factor
    if scaling == "none":
        return [] if factor == 1 else [f"--rotary-scaling-factor {factor} with --rotary-scaling none "
                                       "scales nothing; add --rotary-scaling linear (or ntk)"]
    errors = []
    if config.rotary == "none":
        errors.append(f"--rotary-scaling {scaling} scales RoPE's angles and --rotary is none; add "
                      "--rotary fixed (or learnable) or drop --rotary-scaling")
    if not 1 < factor < math.inf:
        errors.append(f"--rotary-scaling {scaling} needs --rotary-scaling-factor F > 1 (finite), e.g. "
                      f"the evaluation length over the training length; got {factor}")
    if scaling == "ntk" and config.learnable_rotary_frequencies:
        errors.append("--rotary-scaling ntk changes RoPE's fixed base and --rotary learnable has learned "
                      "frequencies, no base; use --rotary-scaling linear (positions divided by F)")
    elif scaling == "ntk" and config.rotary != "none" and config.head_dim == 2:
        errors.append("--rotary-scaling ntk needs a head dimension > 2: base^(d_h/(d_h-2)) is undefined "
                      "at d_h = 2; use --rotary-scaling linear")
    elif 1 < factor < math.inf and config.rotary != "none":
        errors += _overflowing_angles(config, scaling, factor)
    return errors


def _overflowing_angles(config, scaling, factor):
    """A factor whose angles leave float32, in which RoPE computes them (Sinusoid.angles): ntk's base
    B F^(d_h/(d_h-2)) beyond float32's largest number (every frequency but the first would be 0), or
    linear's 1/F below its smallest (every position rotated by 0)."""
    largest, base, head_dim = torch.finfo(torch.float32).max, config.rotary_base, config.head_dim
    if scaling == "ntk" and base > 1 and head_dim > 2 \
            and math.log(base) + head_dim / (head_dim - 2) * math.log(factor) > math.log(largest):
        return [f"--rotary-scaling ntk with --rotary-scaling-factor {factor:g} makes RoPE's base "
                f"--rotary-base {base:g} * F^(d_h/(d_h-2)) (d_h = {head_dim}) larger "
                f"than float32's largest number ({largest:.3g}), in which the angles are computed: they "
                "overflow; use F near the evaluation length over the training length (e.g. 4)"]
    if scaling == "linear" and torch.tensor(1 / factor, dtype=torch.float32).item() == 0:
        return [f"--rotary-scaling linear with --rotary-scaling-factor {factor:g} divides every position "
                "by F to 0 in float32, in which the angles are computed: all positions would be rotated "
                "alike; use F near the evaluation length over the training length (e.g. 4)"]
    return []


def unused_rotary_errors(config):
    """Without RoPE, its scaling is named as such (and a factor without a scaling)."""
    errors = _scaling_errors(config)
    if config.rotary_base != 10000.0:
        errors.append(f"--rotary-base is an option of RoPE; add --rotary fixed or learnable (got --rotary "
                      f"{config.rotary})")
    return errors


def rope_native(config):
    """RoFormer rotates q and k by pairs (2k, 2k+1) by fixed angles of base 10000, unscaled."""
    if config.learnable_rotary_frequencies:
        return None, f"--rotary {config.rotary}: RoFormer's frequencies are fixed"
    if config.rotary_scaling != "none":
        return None, f"--rotary-scaling {config.rotary_scaling}: RoFormer does not scale its angles"
    if config.rotary_base != 10000.0:
        return None, f"--rotary-base {config.rotary_base:g}: RoFormer's base is 10000"
    return "roformer", None


ROPE = Encoding(
    name="rope", label="RoPE", kind="rotation", learned=False, family="rotary",
    choices=("fixed", "learnable"),
    choices_help="fixed = RoPE (Su et al. 2021); learnable = the d_h/2 frequencies are parameters "
    "initialised at the fixed ones",
    summary="q and k of every layer rotated by position, so that q_i . k_j depends on j - i",
    citation="Su et al., RoFormer, arXiv 2104.09864 (RoPE)",
    slot="rotary", options=RotaryOptions, build=build_rotary, check=check_rotary,
    unused_errors=unused_rotary_errors, export_names=(("sinusoid.frequencies", "rotary_frequencies"),),
    hf_native=rope_native,
    exported=True, parts=(Rotary,), reads_positions=True,
)
