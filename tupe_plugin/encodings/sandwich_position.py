"""Sandwich (Chi, Fan, Rudnicky, Ramadge, "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis", arXiv 2212.10356): the fixed bias of the inner product of sinusoidal position
embeddings, with no parameters. For p_t = [.., sin(w_k t), cos(w_k t), ..] of dimension d'
(``--sandwich-dim``), w_k = 10000^(-2k/d'), k = 1..d'/2 (the paper's equation of p_m . p_n, which NVIDIA
NeMo's Sandwich implements; ``--sandwich-frequencies zero-based``: k = 0..d'/2-1, the sinusoids of Vaswani
et al. as PyTorch attention-gym's Sandwich takes them, and this plugin's first form),

    bias[h, i, j] = S (p_i . p_j - d'/2) / r_h = S (sum_k cos(w_k (j - i)) - d'/2) / r_h,

with ALiBi's per-head compression r_h = 8 (h + 1) / H for heads h = 0..H-1 (the paper's construction,
its Appendix E: head h + 1 of H divides the inner product by 8 (h + 1) / H, as ALiBi's slopes
2^(-8 (h + 1) / H) differ per head; the same ratio is in NVIDIA NeMo's and PyTorch attention-gym's
Sandwich) and S =
``--sandwich-scale``, this plugin's extra factor (default 1, the paper's). p_i . p_j depends on j - i
alone (cos a cos b + sin a sin b = cos(a - b)) and is largest, d'/2, at j = i: the shift by d'/2 makes
the bias 0 there and negative elsewhere, and leaves the softmax unchanged (a constant of every row).
"""

from dataclasses import dataclass

import torch

from ..user_input.memory_limits import FLOAT32
from ..terms.parts import OffsetRows
from .encoding import Encoding, option
from .offset_bias import OffsetBias
from .sinusoid import Sinusoid


@dataclass(frozen=True)
class SandwichOptions:
    sandwich_dim: int = option(128, metavar="D", help="Sandwich: the dimension d' of the sinusoids p_i, p_j")
    sandwich_scale: float = option(1.0, metavar="S", help="Sandwich: the bias is S (p_i . p_j - d'/2) / "
                                   "(8h/H) (default 1, the paper's)")
    sandwich_frequencies: str = option(
        "one-based", choices=("one-based", "zero-based"), before="zero-based",
        stored_as=("relative_bias.sinusoid.frequencies",
                   "Sandwich's frequencies are stored in the checkpoint"),
        help="Sandwich: the frequencies w_k = 10000^(-2k/d') of p, one-based = k = 1..d'/2 (the paper's "
        "equation, as NVIDIA NeMo; default), zero-based = k = 0..d'/2-1 (the sinusoids of Vaswani et al., "
        "as PyTorch attention-gym; checkpoints saved before this option)")

    @property
    def sandwich_one_based(self):
        """Sandwich's frequencies k = 1..d'/2."""
        return self.sandwich_frequencies == "one-based"


class SandwichBias(OffsetBias):
    """The (H, T, T) Sandwich bias, shared by all layers; never trained."""

    def __init__(self, num_heads, dim=128, scale=1.0, zero_cls=False, one_based=True):
        super().__init__(zero_cls)
        self.num_heads = num_heads
        self.scale = scale
        self.sinusoid = Sinusoid(dim, first=1 if one_based else 0)

    def per_offset(self, seq_len):
        """(offsets (2T-1,), bias (H, 2T-1)) for j - i = -(T-1)..T-1, in float32."""
        offsets = torch.arange(1 - seq_len, seq_len, device=self.sinusoid.frequencies.device)
        inner = self.sinusoid.angles(offsets).cos().sum(-1) - self.sinusoid.dim / 2
        compression = 8 * torch.arange(1, self.num_heads + 1, device=offsets.device) / self.num_heads
        return offsets, self.scale * inner / compression[:, None]


def build_sandwich_bias(config):
    """The Sandwich bias of a :class:`~.position_config.PositionConfig` that uses it."""
    return SandwichBias(config.num_heads, config.sandwich_dim, config.sandwich_scale,
                        zero_cls=config.zero_cls_bias, one_based=config.sandwich_one_based)


def check_sandwich(config):
    errors = []
    if config.sandwich_dim < 2 or config.sandwich_dim % 2:
        errors.append(f"--sandwich-dim must be even and >= 2, got {config.sandwich_dim}")
    if config.sandwich_scale <= 0:
        errors.append(f"--sandwich-scale must be > 0, got {config.sandwich_scale}")
    return errors


def sandwich_sizes(config, forward):
    """Its angles over the 2T - 1 offsets of the forward's length T, each forward: the angles, their sines,
    cosines and products, (2T - 1) x d'/2 each."""
    offsets, half = 2 * forward.length - 1, config.sandwich_dim // 2
    return [("sandwich_dim", config.sandwich_dim,
             f"Sandwich angles ({offsets} offsets x {half}, with their sines, cosines and products)",
             4 * offsets * half * FLOAT32, "128 is the default")]


SANDWICH = Encoding(
    name="sandwich", label="Sandwich", kind="distance_bias", learned=False, family="rel_pos",
    choices=("sandwich",),
    choices_help="sandwich = the fixed bias (p_i . p_j - d'/2) / (8h/H) of sinusoids p of dimension d', head "
    "h = 1..H compressed as ALiBi's slopes (Chi et al. 2023)",
    summary="the fixed bias of the inner product of sinusoidal position embeddings, per head compressed as "
    "ALiBi's slopes",
    citation="Chi, Fan, Rudnicky, Ramadge, Dissecting Transformer Length Extrapolation via the Lens of "
    "Receptive Field Analysis, arXiv 2212.10356",
    slot="relative_bias", options=SandwichOptions, build=build_sandwich_bias, check=check_sandwich,
    sizes=sandwich_sizes, export_names=(("sinusoid.frequencies", "sandwich_frequencies"),),
    exported=True, parts=(OffsetRows,),
)
