"""ALiBi, attention with linear biases (Press, Smith, Lewis, "Train Short, Test Long: Attention with
Linear Biases Enables Input Length Extrapolation", arXiv 2108.12409), in its bidirectional form for
encoders: bias[h, i, j] = -m_h |j - i|, fixed, no parameters.

Slopes as the paper's reference code: for H a power of two, m_h = 2^(-8h/H), h = 1..H; otherwise,
with n the largest power of two below H, the n slopes for n heads followed by every other slope
(starting with the first) of the 2n-head sequence, H - n of them.

Two options beyond the paper, for bidirectional attention: ``asymmetric`` gives keys before the query
(j < i) and keys after it (j > i) their own slope per head; ``learned`` makes the slopes parameters,
m = exp(a) (positive by construction), initialised at the paper's values. Learned asymmetric slopes start
equal on both sides, m_h, as x-transformers' learned bidirectional ALiBi starts them (training makes them
differ). Fixed asymmetric slopes are this plugin's own choice, the only one that makes the two sides
differ without training: m_h to the left and m_{H+1-h} (the paper's slopes in reverse head order) to the
right. (Learned asymmetric slopes started reversed on the right too in the plugin's first form; a trained
checkpoint loads its learned slopes, so only the start of new models differs.)
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..terms.parts import OffsetRows
from .encoding import Encoding, option
from .offset_bias import OffsetBias


@dataclass(frozen=True)
class AlibiOptions:
    alibi_asymmetric: bool = option(
        False, refused_unused=True,
        help="ALiBi with a slope per side: m_h for keys before the query, the paper's slopes in reverse "
        "head order after it")
    alibi_learned_slopes: bool = option(
        False, refused_unused=True,
        help="ALiBi's slopes learned, m = exp(a), from the fixed ones")


def alibi_slopes(num_heads):
    """The H head slopes m_h, a float64 tensor."""
    def geometric(heads):
        return [2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)]

    if num_heads & (num_heads - 1) == 0:
        slopes = geometric(num_heads)
    else:
        below = 2 ** math.floor(math.log2(num_heads))
        slopes = geometric(below) + geometric(2 * below)[0::2][: num_heads - below]
    return torch.tensor(slopes, dtype=torch.float64)


class AlibiBias(OffsetBias):
    """The (H, T, T) bias -m_h |j - i|, shared by all layers; a buffer, or parameters with ``learned``."""

    def __init__(self, num_heads, zero_cls=False, asymmetric=False, learned=False):
        super().__init__(zero_cls)
        self.learned = learned
        paper = alibi_slopes(num_heads).float()
        sides = torch.stack([paper, paper if learned else paper.flip(0)]) if asymmetric else paper[None]
        if learned:
            self.log_slopes = nn.Parameter(sides.log())
        else:
            self.register_buffer("fixed_slopes", sides, persistent=False)

    @property
    def slopes(self):
        """(1 or 2, H): the slopes of keys before the query and, when asymmetric, after it."""
        return self.log_slopes.exp() if self.learned else self.fixed_slopes

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)): -m_h |j - i| for j - i = -(T-1)..T-1."""
        slopes = self.slopes
        offsets = torch.arange(1 - seq_len, seq_len, device=slopes.device)
        per_side = torch.where(offsets[None] > 0, slopes[-1:].t(), slopes[:1].t())
        return offsets, -per_side * offsets.abs().to(slopes.dtype)[None]


def build_alibi_bias(config):
    """The ALiBi bias of a :class:`~.position_config.PositionConfig` that uses it."""
    return AlibiBias(config.num_heads, zero_cls=config.zero_cls_bias, asymmetric=config.alibi_asymmetric,
                     learned=config.alibi_learned_slopes)


def learned_slopes(config):
    """ALiBi has parameters only with --alibi-learned-slopes."""
    return config.alibi_learned_slopes


ALIBI = Encoding(
    name="alibi", label="ALiBi", kind="distance_bias", learned=learned_slopes,
    family="rel_pos", choices=("alibi",),
    choices_help="alibi = the fixed bias -m_h|j-i| (Press et al. 2022)",
    summary="the fixed bias -m_h |j - i| of the distance, one slope per head",
    citation="Press, Smith, Lewis, Train Short, Test Long: Attention with Linear Biases Enables Input Length "
    "Extrapolation, arXiv 2108.12409",
    slot="relative_bias", options=AlibiOptions, build=build_alibi_bias,
    export_names=(("log_slopes", "alibi_log_slopes"),),
    exported=True, parts=(OffsetRows,),
)
