"""Multi-head self-attention that adds the shared content-free term to its logits (seed 001 Eq. 7-11).

Per head: ``softmax(scale * [q ; q_extra] . [k ; k_extra] + bias + padding) v`` with q, k shifted by
``q_shift`` / ``k_shift`` when given (see :mod:`positional_term`), in one fused
``scaled_dot_product_attention`` call. ``need_weights=True`` takes an explicit path that also returns
the attention probabilities (for analysis).
"""

import torch
import torch.nn.functional as F
from torch import nn


class PositionalSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, attention_dropout=0.0):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(
                f"--encoder-embed-dim ({embed_dim}) must be a positive multiple of "
                f"--encoder-attention-heads ({num_heads})"
            )
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.attention_dropout = attention_dropout
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, term, attn_mask=None, need_weights=False):
        """x: (B, T, C); term: the forward's PositionalTerm; attn_mask: ``term.attention_mask(...)``.

        Returns the output (B, T, C) and, with ``need_weights``, the probabilities (B, H, T, T).
        """
        batch, seq_len, embed_dim = x.shape
        qkv = self.in_proj(x).view(batch, seq_len, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if term.q_shift is not None:
            q = q + term.q_shift.to(q.dtype)
            k = k + term.k_shift.to(k.dtype)
        if term.q_extra is not None:
            extra = term.q_extra.size(-1)
            q = torch.cat([q, term.q_extra.to(q.dtype).expand(batch, -1, -1, -1)], -1)
            k = torch.cat([k, term.k_extra.to(k.dtype).expand(batch, -1, -1, -1)], -1)
            v = F.pad(v, (0, extra))
        dropout = self.attention_dropout if self.training else 0.0
        if need_weights:
            out, probs = self._explicit_attention(q, k, v, term.scale, attn_mask, dropout)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=term.scale
            )
            probs = None
        out = out[..., : self.head_dim].transpose(1, 2).reshape(batch, seq_len, embed_dim)
        return self.out_proj(out), probs

    @staticmethod
    def _explicit_attention(q, k, v, scale, attn_mask, dropout):
        logits = torch.matmul(q, k.transpose(-1, -2)) * scale
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                logits = logits.masked_fill(~attn_mask, torch.finfo(logits.dtype).min)
            else:
                logits = logits + attn_mask
        probs = torch.softmax(logits.float(), dim=-1).to(q.dtype)
        out = torch.matmul(F.dropout(probs, dropout, training=dropout > 0), v)
        return out, probs
