"""FIRE, functional interpolation for relative positions (Li, You, Guruganesh, Ainslie, Ontanon, Zaheer,
Sanghai, Yang, Kumar, Bhojanapalli, "Functional Interpolation for Relative Positions Improves Long Context
Transformers", arXiv 2310.04418), in a bidirectional form for encoders that is this plugin's adaptation:

    bias[h, i, j] = f_theta(psi(|j - i|) / (psi(max(L, T - 1)) + eps))_h,   psi(x) = log(c x + 1),

f_theta a small MLP (one hidden ReLU layer of ``hidden`` units, one output per head) shared by all layers,
c = exp(a) > 0 learned and L a learned threshold. Starting values, from the PyTorch implementation in the
paper's appendix: 32 hidden units (its ``mlp_width``; ``--fire-hidden``), c = 0.1 (``init_c``) and L = 512
(``init_L``; ``--fire-threshold``). The parametrisation is this plugin's: c is learned through its logarithm
(the paper learns c itself and takes |c x|) and L directly (the paper learns a multiplier of a fixed L).
The paper's causal form normalises row i by psi(max(L, i)) + eps (0-based positions; eps = 1e-6 in the
appendix code); an encoder's query sees both sides, so the distance is |j - i| and the normaliser that of
the largest distance in the sequence, T - 1: the adaptation equals the paper on its last causal row. T is
the batch's (padded) length, so that for inputs no longer than L (the training case with the default
L = 512) the bias does not depend on padding, while rows of a batch longer than L share the normaliser of
its longest row. ``--fire-normaliser length`` keeps this plugin's first form, psi(max(L, T)) with no eps,
for the checkpoints trained with it. ``signed`` gives the MLP the sign of j - i as a second input, so that
keys before and after the query may differ.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..user_input.memory_limits import FLOAT32, trained_bytes
from ..terms.parts import OffsetRows
from .encoding import Encoding, option
from .offset_bias import OffsetBias

INITIAL_C = 0.1
EPS = 1e-6  # the appendix code's eps, added to the normaliser


@dataclass(frozen=True)
class FireOptions:
    fire_hidden: int = option(32, metavar="N", help="FIRE: hidden units of the MLP f (default 32)")
    fire_threshold: float = option(512.0, metavar="L", help="FIRE: initial value of the learned threshold L",
                                   stored_as=("relative_bias.threshold", "FIRE's threshold L is learned"))
    fire_signed: bool = option(
        False, refused_unused=True,
        help="FIRE: the sign of j - i as a second input of f (keys before and after the query may differ)")
    fire_normaliser: str = option(
        "largest-distance", choices=("largest-distance", "length"), before="length",
        help="FIRE: psi(|j-i|) divided by largest-distance = psi(max(L, T-1)) + 1e-6, the paper's normaliser "
        "of its last causal row with the appendix code's epsilon (default); length = psi(max(L, T)) "
        "(checkpoints saved before this option)")

    @property
    def fire_largest_distance(self):
        """FIRE normalised by psi(max(L, T - 1)) + eps, the paper's last causal row."""
        return self.fire_normaliser == "largest-distance"


class FireBias(OffsetBias):
    """The (H, T, T) FIRE bias, shared by all layers; the MLP, c and L learned."""

    def __init__(self, num_heads, hidden=32, threshold=512.0, signed=False, zero_cls=False,
                 largest_distance=True):
        super().__init__(zero_cls)
        self.signed = signed
        self.largest_distance = largest_distance
        self.mlp = nn.Sequential(nn.Linear(2 if signed else 1, hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_heads))
        self.log_c = nn.Parameter(torch.tensor(math.log(INITIAL_C)))
        self.threshold = nn.Parameter(torch.tensor(float(threshold)))

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)) for j - i = -(T-1)..T-1."""
        c = self.log_c.exp()
        offsets = torch.arange(1 - seq_len, seq_len, device=c.device)
        if self.largest_distance:
            normaliser = torch.log1p(c * self.threshold.clamp(min=seq_len - 1)) + EPS
        else:
            normaliser = torch.log1p(c * self.threshold.clamp(min=seq_len))
        features = (torch.log1p(c * offsets.abs().to(c.dtype)) / normaliser)[:, None]
        if self.signed:
            features = torch.cat([features, offsets.sign().to(c.dtype)[:, None]], -1)
        return offsets, self.mlp(features).t()


def build_fire_bias(config):
    """The FIRE bias of a :class:`~.position_config.PositionConfig` that uses it."""
    return FireBias(config.num_heads, config.fire_hidden, config.fire_threshold, config.fire_signed,
                    zero_cls=config.zero_cls_bias, largest_distance=config.fire_largest_distance)


def check_fire(config):
    errors = []
    if config.fire_hidden < 1:
        errors.append(f"--fire-hidden must be >= 1, got {config.fire_hidden}")
    if config.fire_threshold < 1:
        errors.append(f"--fire-threshold must be >= 1, got {config.fire_threshold}")
    return errors


def fire_sizes(config, forward):
    """Its MLP runs on every offset of the forward's length T: (2T - 1) x hidden activations, the linear
    layer's and the ReLU's kept for the backward and a gradient of the same size; its weights in training."""
    offsets, hidden = 2 * forward.length - 1, config.fire_hidden
    weights = hidden * ((2 if config.fire_signed else 1) + 1 + config.num_heads) + config.num_heads + 2
    return [("fire_hidden", hidden,
             f"FIRE hidden layer ({offsets} offsets x {hidden} activations, 3 copies for the forward and "
             "backward, and its weights with their gradients and Adam's moments)",
             3 * offsets * hidden * FLOAT32 + trained_bytes(weights), "32, the paper's")]


FIRE = Encoding(
    name="fire", label="FIRE", kind="distance_bias", family="rel_pos", choices=("fire",),
    choices_help="fire = f(psi(|j-i|) / psi(max(L, T))), psi(x) = log(cx + 1), f a small MLP, c and L "
    "learned (Li et al. 2023, normalised by the length T for encoders)",
    summary="a learned MLP of the log-distance psi(|j - i|) normalised by psi(max(L, T - 1)) (the encoder "
    "adaptation)",
    citation="Li et al., Functional Interpolation for Relative Positions Improves Long Context Transformers, "
    "arXiv 2310.04418",
    slot="relative_bias", options=FireOptions, build=build_fire_bias, check=check_fire, sizes=fire_sizes,
    export_names=(("mlp.0.", "fire.hidden."), ("mlp.2.", "fire.output."), ("log_c", "fire.log_c"),
                  ("threshold", "fire.threshold")),
    exported=True, parts=(OffsetRows,),
)
