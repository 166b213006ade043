"""Shaw-style relative position vectors (Wang et al. 2021 Eq. 4; Shaw et al., 2018).

a_r in R^{d_h} for r = clip(j - i, -K, K), one table shared by all heads and layers, added to the
keys (score q_i . (k_j + a_{j-i})) and, unless keys-only, to the values
(out_i = sum_j alpha_ij (v_j + a_{j-i})). Tables: ``learned`` ((2K+1) x d_h), ``sinusoidal`` (fixed
sin/cos of the signed clipped distance, NEZHA-style) or ``learnable-sinusoidal``.
"""

import torch
from torch import nn

from .sinusoid import Sinusoid



class ShawRelativePosition(nn.Module):
    """The table a_{-K}..a_K: learned (``learned=True``) or sinusoidal (fixed or ``learnable``
    frequencies)."""

    def __init__(self, head_dim, max_distance=64, learned=True, learnable=False):
        super().__init__()
        if max_distance < 1:
            raise ValueError(f"--shaw-max-distance must be >= 1, got {max_distance}")
        self.max_distance = max_distance
        self.learned = learned
        if learned:
            self.weight = nn.Parameter(torch.empty(2 * max_distance + 1, head_dim))
            nn.init.normal_(self.weight, mean=0.0, std=0.02)
        else:
            self.sinusoid = Sinusoid(head_dim, learnable=learnable)

    @property
    def kind(self):
        """``learned``, ``sinusoidal`` or ``learnable-sinusoidal``."""
        return "learned" if self.learned else self.sinusoid.kind

    def table(self):
        """(2K+1, d_h): row r holds a_{r - K}."""
        if self.learned:
            return self.weight
        distances = torch.arange(-self.max_distance, self.max_distance + 1,
                                 device=self.sinusoid.frequencies.device)
        return self.sinusoid(distances)

    def index(self, seq_len, device):
        """(T, T) row of the table for each (query i, key j): clip(j - i, -K, K) + K."""
        positions = torch.arange(seq_len, device=device)
        relative = positions[None, :] - positions[:, None]
        return relative.clamp(-self.max_distance, self.max_distance) + self.max_distance
