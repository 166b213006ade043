"""Absolute position embeddings added to the word embeddings at the input.

TUPE Eq. 3 (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595);
Table 1 of Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT", ICLR 2021.
``learned``: a table of ``max_positions`` vectors (Gehring et al., "Convolutional Sequence to Sequence
Learning", arXiv 1705.03122; BERT) — longer inputs are refused. ``sinusoidal`` /
``learnable-sinusoidal``: P(t) of :mod:`sinusoid`, defined for any t. Position t = 0 is the first token.
They enter the input, not the content-free term of attention: the encoder adds them to the word
embeddings (:mod:`tupe_plugin.encoder.positional_encoder`).
"""

import torch
from torch import nn

from ..user_input.command_hints import input_length_fix
from ..terms.forward import as_positions
from .encoding import Encoding
from .sinusoid import Sinusoid


class LearnedAbsolutePosition(nn.Module):
    def __init__(self, max_positions, embed_dim):
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, embed_dim))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def forward(self, positions):
        """The rows of a length T (positions 0..T-1: (T, C)), or of a tensor of positions (T,) or (B, T)
        (each sequence's own: (B, T, C))."""
        longest = positions if isinstance(positions, int) else int(positions.max()) + 1
        if longest > self.max_positions:
            what = (f"input of {positions} tokens is longer than" if isinstance(positions, int)
                    else f"position {longest - 1} is beyond")
            raise ValueError(f"{what} the {self.max_positions} learned absolute positions; "
                             f"{input_length_fix(self.max_positions)}")
        return self.weight[:positions] if isinstance(positions, int) else self.weight[positions]


class SinusoidalAbsolutePosition(nn.Module):
    def __init__(self, embed_dim, learnable=False):
        super().__init__()
        self.sinusoid = Sinusoid(embed_dim, learnable)

    def forward(self, positions):
        """The sinusoids of a length T (positions 0..T-1) or of a tensor of positions (T,) or (B, T)."""
        device = self.sinusoid.frequencies.device
        positions = as_positions(positions, device)
        return self.sinusoid(positions)


def build_absolute_position(config):
    """The absolute PE of a :class:`~.position_config.PositionConfig`, or None."""
    if config.abs_pos == "none":
        return None
    if config.abs_pos == "learned":
        return LearnedAbsolutePosition(config.max_positions, config.embed_dim)
    return SinusoidalAbsolutePosition(config.embed_dim, learnable=config.abs_pos == "learnable-sinusoidal")


def check_absolute(config):
    if config.abs_pos != "learned" and config.embed_dim % 2:
        return [f"--abs-pos {config.abs_pos} needs an even --encoder-embed-dim, got {config.embed_dim}"]
    return []


def as_roberta(config):
    """transformers' RoBERTa adds a learned table at the input (the fixed ones written out as one); so does
    DeBERTa-v2 (``position_biased_input``) beside its relative attention."""
    return ("roberta", "deberta-v2"), None


ABSOLUTE = Encoding(
    name="absolute", label="the absolute position embedding", kind="absolute", family="abs_pos",
    choices=("learned", "sinusoidal", "learnable-sinusoidal"),
    choices_help="learned = a table of --max-positions vectors (BERT); sinusoidal = the fixed sinusoids of "
    "Vaswani et al.; learnable-sinusoidal = the same with learned frequencies (Wang et al. 2021)",
    summary="a position embedding added to the word embedding at the input",
    citation="Vaswani et al., arXiv 1706.03762; Wang et al., On Position Embeddings in BERT, ICLR 2021",
    build=build_absolute_position, check=check_absolute,
    # RoBERTa's learned table (position ids from pad + 1); the sinusoids are written out as its rows
    hf_native=as_roberta,
    exported=True, parts=(), reads_positions=True,
)
