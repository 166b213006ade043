"""Multi-head self-attention that adds the shared positional term to its logits (seed 001 Eq. 7-11,
seed 000 Eq. 4).

Per head: ``softmax(scale * [q ; q_extra] . [k ; k_extra] + bias + padding) v`` with q, k shifted by
``q_shift`` / ``k_shift`` when given (see :mod:`positional_term`), in one fused
``scaled_dot_product_attention`` call. Shaw relative vectors add ``scale * q_i . a_{j-i}`` (computed
against the (2K+1)-row table, then gathered) to that bias; their value term
``sum_j alpha_ij a_{j-i}`` needs the probabilities, so it (and ``need_weights=True``, for analysis)
takes an explicit path. So does attention dropout on CPU, where ``scaled_dot_product_attention``
has no fused kernel with dropout and its math fallback is slower than the explicit path; a mask that
needs a gradient (the T5 bias) goes through :class:`~.bias_attention.BiasedFlashAttention` on CPU
(see :mod:`bias_attention` and docs/benchmarks.md).
"""

import torch
import torch.nn.functional as F
from torch import nn

from .bias_attention import BiasedFlashAttention, biased_flash_applies, fused_kernel_applies


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
        if term.rel_table is not None:
            attn_mask = _add_bias(attn_mask, self._shaw_key_bias(q, term))
        if term.q_extra is not None:
            extra = term.q_extra.size(-1)
            q = torch.cat([q, term.q_extra.to(q.dtype).expand(batch, -1, -1, -1)], -1)
            k = torch.cat([k, term.k_extra.to(k.dtype).expand(batch, -1, -1, -1)], -1)
            v = F.pad(v, (0, extra))
        dropout = self.attention_dropout if self.training else 0.0
        out, probs = self._attend(q, k, v, term, attn_mask, dropout, need_weights)
        out = out[..., : self.head_dim].transpose(1, 2).reshape(batch, seq_len, embed_dim)
        return self.out_proj(out), probs if need_weights else None

    def _attend(self, q, k, v, term, attn_mask, dropout, need_weights):
        """The explicit path where probabilities are needed or no fused kernel exists, else one
        fused call (on CPU a learned bias keeps the flash kernel through BiasedFlashAttention)."""
        if need_weights or term.rel_values or not fused_kernel_applies(q, dropout):
            return self._explicit_attention(q, k, v, term, attn_mask, dropout)
        if biased_flash_applies(q, attn_mask, dropout):
            return BiasedFlashAttention.apply(q, k, v, attn_mask, term.scale), None
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=term.scale
        )
        return out, None

    @staticmethod
    def _shaw_key_bias(q, term):
        """scale * q_i . a_{clip(j-i)}: q against the 2K+1 table, gathered to (B, H, T, T)."""
        table = term.rel_table.to(q.dtype)
        per_distance = torch.matmul(q, table.t())
        index = term.rel_index.expand(*q.shape[:2], -1, -1)
        return per_distance.gather(-1, index) * term.scale

    @staticmethod
    def _explicit_attention(q, k, v, term, attn_mask, dropout):
        # float32 logits before the mask is added: a float32 mask's padding value (its most negative
        # number) would round to -inf in bf16 and turn an all-padded row into NaN.
        logits = torch.matmul(q * term.scale, k.transpose(-1, -2)).float()
        if attn_mask is not None:
            _add_bias_(logits, attn_mask)
        probs = torch.softmax(logits, dim=-1).to(q.dtype)
        dropped = F.dropout(probs, dropout, training=dropout > 0)
        out = torch.matmul(dropped, v)
        if term.rel_values:
            per_distance = torch.zeros(
                *probs.shape[:-1], term.rel_table.size(0), dtype=probs.dtype, device=probs.device
            )
            index = term.rel_index.expand(*probs.shape[:2], -1, -1)
            shaw = torch.matmul(per_distance.scatter_add(-1, index, dropped),
                                term.rel_table.to(probs.dtype))
            out = out + F.pad(shaw, (0, out.size(-1) - shaw.size(-1)))
        return out, probs


def _add_bias_(logits, mask):
    """Add an attention mask (boolean keep-mask or additive float) to fresh logits, in place."""
    if mask.dtype == torch.bool:
        return logits.masked_fill_(~mask, torch.finfo(logits.dtype).min)
    return logits.add_(mask)


def _add_bias(mask, bias):
    """Combine an attention mask (None, boolean keep-mask, or additive float) with a float bias."""
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
    return bias + mask
