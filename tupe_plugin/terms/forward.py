"""The shape of one forward and the positions of its tokens, which every encoding's part is built for.

Positions are 0..T-1 shared by the rows of the batch, or, where an encoding samples them in training (the
randomized positions of Ruoss et al., "Randomized Positional Encodings Boost Length Generalization of
Transformers", ACL 2023, arXiv 2305.16843), (B, T) positions of each sequence of its own; an encoding
indexed by position then reads them (a learned or sinusoidal table, RoPE's angles).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Forward:
    """``batch`` B, ``seq_len`` T, and ``positions``: (T,) shared by the rows, or (B, T) per sequence."""

    batch: int
    seq_len: int
    positions: torch.Tensor

    @classmethod
    def of_length(cls, seq_len, batch=1, device=None):
        """The forward of ``batch`` rows of ``seq_len`` tokens at positions 0..T-1."""
        return cls(batch, seq_len, torch.arange(seq_len, device=device))

    @property
    def per_sequence(self):
        """Whether each sequence has positions of its own."""
        return self.positions.dim() == 2


def as_positions(positions, device):
    """``positions`` as a tensor on ``device``: a length T as 0..T-1, a tensor of positions as it is."""
    if isinstance(positions, int):
        return torch.arange(positions, device=device)
    return positions.to(device)
