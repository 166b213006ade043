"""Multi-head self-attention that adds the shared positional term to its logits.

TUPE Eq. 7-11 (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv
2006.15595); Eq. 4 of Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT",
ICLR 2021. Per head: ``softmax(scale * [q ; q_extra] . [k ; k_extra] + mask) v`` with q, k shifted by
``q_shift`` / ``k_shift`` or rotated by RoPE's angles when given (see :mod:`.positional_term`). Shaw
relative vectors add ``scale * q_i . a_{j-i}`` (computed against the (2K+1)-row table, then gathered)
to the mask, and their value term ``sum_j alpha_ij a_{j-i}`` to the output. Which kernel runs, and
with which attention dropout, was decided once for the whole forward and is carried by the term
(:func:`~.attention_kernels.choose_path`); this layer only executes it.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .attention_kernels import add_bias, attend
from .rotary_position import rotate


class PositionalSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(
                f"--encoder-embed-dim ({embed_dim}) must be a positive multiple of "
                f"--encoder-attention-heads ({num_heads})"
            )
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, term, need_weights=False):
        """x: (B, T, C); term: the forward's PositionalTerm (with its path, dropout and mask).

        Returns the output (B, T, C) and, with ``need_weights``, the probabilities (B, H, T, T).
        """
        batch, seq_len, embed_dim = x.shape
        qkv = self.in_proj(x).view(batch, seq_len, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn_mask = term.attn_mask
        if term.q_shift is not None:
            q = q + term.q_shift.to(q.dtype)
            k = k + term.k_shift.to(k.dtype)
        if term.rotary_cos is not None:
            q = rotate(q, term.rotary_cos, term.rotary_sin)
            k = rotate(k, term.rotary_cos, term.rotary_sin)
        if term.rel_table is not None:
            attn_mask = add_bias(attn_mask, self._shaw_key_bias(q, term))
        if term.q_extra is not None:
            extra = term.q_extra.size(-1)
            q = torch.cat([q, term.q_extra.to(q.dtype).expand(batch, -1, -1, -1)], -1)
            k = torch.cat([k, term.k_extra.to(k.dtype).expand(batch, -1, -1, -1)], -1)
            v = F.pad(v, (0, extra))
        out, probs = attend(
            term.path, q, k, v, attn_mask, term.scale, term.dropout,
            term.rel_table if term.rel_values else None, term.rel_index, term.backends,
        )
        out = out[..., : self.head_dim].transpose(1, 2).reshape(batch, seq_len, embed_dim)
        return self.out_proj(out), probs if need_weights else None

    @staticmethod
    def _shaw_key_bias(q, term):
        """scale * q_i . a_{clip(j-i)}: q against the 2K+1 table, gathered to (B, H, T, T)."""
        table = term.rel_table.to(q.dtype)
        per_distance = torch.matmul(q, table.t())
        index = term.rel_index.expand(*q.shape[:2], -1, -1)
        return per_distance.gather(-1, index) * term.scale
