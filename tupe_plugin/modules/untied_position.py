"""TUPE's untied absolute positional correlation (TUPE Eq. 7 and 10, §3.3).

Positions are a learned table P, layer-normalised (p = LayerNorm(P)), projected by their own
U^Q, U^K (one pair for the whole model, split into heads like W^Q / W^K). The per-head term is
(p_i U^Q_h)(p_j U^K_h)^T / sqrt(2 d_h). The [CLS] reset (Eq. 9) uses
theta_k[h] = (p_theta_k U^Q_h)(p_theta_k U^K_h)^T / sqrt(2 d_h) for two learned vectors.
``proj_bias`` gives U^Q, U^K a bias, as the authors' released code does.
"""

import torch
from fairseq.modules import LayerNorm
from torch import nn

from ..command_hints import input_length_fix


class UntiedPositionalCorrelation(nn.Module):
    def __init__(self, max_positions, embed_dim, num_heads, cls_reset=False, proj_bias=False):
        super().__init__()
        self.max_positions = max_positions
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.embed_positions = nn.Embedding(max_positions, embed_dim)
        self.layer_norm = LayerNorm(embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=proj_bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=proj_bias)
        self.cls_vectors = nn.Parameter(torch.empty(2, embed_dim)) if cls_reset else None
        self.reset_parameters()

    def reset_parameters(self):
        for weight in (self.embed_positions.weight, self.q_proj.weight, self.k_proj.weight):
            nn.init.normal_(weight, mean=0.0, std=0.02)
        for proj in (self.q_proj, self.k_proj):
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        if self.cls_vectors is not None:
            nn.init.normal_(self.cls_vectors, mean=0.0, std=0.02)

    def _heads(self, x):
        return x.view(x.size(0), self.num_heads, self.head_dim).transpose(0, 1)

    def _project(self, vectors):
        p = self.layer_norm(vectors)
        return self._heads(self.q_proj(p)), self._heads(self.k_proj(p))

    def projections(self, seq_len):
        """(p U^Q, p U^K) for positions 0..seq_len-1, each (H, T, d_h), unscaled."""
        if seq_len > self.max_positions:
            raise ValueError(
                f"input of {seq_len} tokens is longer than the {self.max_positions} learned "
                f"positions of the untied positional table; {input_length_fix(self.max_positions)}"
            )
        return self._project(self._rows(seq_len))

    def positions(self, seq_len):
        """p = LayerNorm(P) of positions 0..seq_len-1, (T, d): what U^Q / U^K project."""
        if seq_len > self.max_positions:
            raise ValueError(f"the untied table holds {self.max_positions} positions, not {seq_len}")
        return self.layer_norm(self._rows(seq_len))

    def _rows(self, seq_len):
        """The table rows of positions 0..seq_len-1."""
        return self.embed_positions.weight[:seq_len]

    def cls_thetas(self):
        """(theta_1, theta_2) per head, unscaled: (p_theta U^Q_h) . (p_theta U^K_h), shape (H, 2)."""
        q, k = self._project(self.cls_vectors)
        return (q * k).sum(-1)
