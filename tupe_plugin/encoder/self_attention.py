"""Multi-head self-attention that adds the shared positional term to its logits.

TUPE Eq. 7-11 (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv
2006.15595); Eq. 4 of Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT",
ICLR 2021. Per head: ``softmax(scale * [q ; q_extra] . [k ; k_extra] + mask) v`` with q, k shifted by
``q_shift`` / ``k_shift`` or rotated by RoPE's angles when given (see
:mod:`~tupe_plugin.encodings.positional_term`). Shaw
relative vectors add ``scale * q_i . a_{j-i}`` (computed against the (2K+1)-row table, then gathered)
to the mask, or hand the table to the Triton kernel or FlexAttention, which read it by offset, and their
value term ``sum_j alpha_ij a_{j-i}`` to the output (the table and its index handed to the explicit path or
the Triton kernel, which need the probabilities); DeBERTa's content-to-position
and position-to-content terms (He, Liu, Gao, Chen, "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", arXiv 2006.03654, Eq. 4) from q and k against the rows of the shared table projected by the
layer (:mod:`~tupe_plugin.encodings.deberta_position`, :mod:`~tupe_plugin.attention.toeplitz_scores`; on the
Triton kernel and FlexAttention the projected rows, read by offset). Which
kernel runs, and with which attention dropout, was decided once for the whole forward
(:class:`~tupe_plugin.attention.paths.AttentionPlan`); this layer only executes it.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.attend import add_bias, attend
from ..attention.clipped_distances import ClippedDistanceScores
from ..attention.toeplitz_scores import offset_scores, offset_scores_with_transposed
from ..attention.relative_terms import RelativeRows
from ..attention.triton_rotary import rotate_projection
from ..encodings.deberta_position import DisentangledProjections
from ..encodings.rotary_position import rotate, rotate_in_place, rotates_in_place


class PositionalSelfAttention(nn.Module):
    """``relative_projections`` (the biases they have: query, both or none): the layer projects DeBERTa's
    shared table with W^{q,r}, W^{k,r} of its own; without them (None) a DeBERTa table is projected with the
    content projections (share_att_key)."""

    def __init__(self, embed_dim, num_heads, relative_projections=None):
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
        self.relative_projections = None if relative_projections is None \
            else DisentangledProjections(embed_dim, relative_projections)

    def projection(self, x, query=None):
        """The (B, T, 3, H, d_h) projection of x (B, T, C) into q, k, v; with ``query`` (B, T, C), q of the
        query states."""
        batch, seq_len, _ = x.shape
        return self.token_projection(x, query).view(batch, seq_len, 3, self.num_heads, self.head_dim)

    def token_projection(self, x, query=None):
        """The projection of x (B, T, C) into q, k, v as (B T, 3 C) rows, a tensor of its own (no view, which
        the fused RoPE kernel rotates in place); with ``query`` (B, T, C), q of the query states."""
        embed_dim = x.size(-1)
        tokens = x.reshape(-1, embed_dim)
        if query is None:
            return self.in_proj(tokens)
        weight, bias = self.in_proj.weight, self.in_proj.bias
        return torch.cat([F.linear(query.reshape(-1, embed_dim), weight[:embed_dim], bias[:embed_dim]),
                          F.linear(tokens, weight[embed_dim:], bias[embed_dim:])], -1)

    def project(self, x, query=None):
        """q, k, v (B, H, T, d_h) of x (B, T, C); with ``query`` (B, T, C), q of the query states."""
        return split_heads(self.projection(x, query))

    def forward(self, x, term, plan, need_weights=False, query=None):
        """x: (B, T, C); term: the forward's PositionalTerm (with its mask); plan: its AttentionPlan; ``query``
        (B, T, C): the states the queries are read from, x then gives the keys and values only (DeBERTa's
        Enhanced Mask Decoder, :mod:`.enhanced_mask_decoder`).

        Returns the output (B, T, C) and, with ``need_weights``, the probabilities (B, H, T, T).
        """
        batch, seq_len, embed_dim = x.shape
        if term.rotary_cos is not None and plan.fused_rotary:
            rows = rotate_projection(self.token_projection(x, query), term.rotary_cos, term.rotary_sin,
                                     self.num_heads)
            q, k, v = split_heads(rows.view(batch, seq_len, 3, self.num_heads, self.head_dim))
        elif term.rotary_cos is not None:
            q, k, v = self._rotated(self.projection(x, query), term.rotary_cos, term.rotary_sin)
        else:
            q, k, v = split_heads(self.projection(x, query))
        attn_mask, relative = term.attn_mask, None
        if term.q_shift is not None:
            q = q + term.q_shift.to(q.dtype)
            k = k + term.k_shift.to(k.dtype)
        if term.rel_table is not None:
            if plan.relative_by_offset:
                relative = RelativeRows(term.rel_table[None], term.rel_offsets)
            else:
                attn_mask = add_bias(attn_mask, ClippedDistanceScores.apply(self._shaw_products(q, term),
                                                                            term.rel_index))
        if term.disentangled_table is not None:
            if plan.relative_by_offset:
                relative = self.disentangled_rows(q.dtype, term)
            else:
                attn_mask = add_bias(attn_mask, self.disentangled_bias(q, k, term))
        if term.q_extra is not None:
            extra = term.q_extra.size(-1)
            q = torch.cat([q, term.q_extra.to(q.dtype).expand(batch, -1, -1, -1)], -1)
            k = torch.cat([k, term.k_extra.to(k.dtype).expand(batch, -1, -1, -1)], -1)
            v = F.pad(v, (0, extra))
        out, probs = attend(
            plan.path, q, k, v, attn_mask, term.scale, plan.dropout,
            term.rel_table if term.rel_values else None, term.rel_index, plan.backends, term.key_lengths,
            relative, term.rel_offsets, term.offset_rows, term.offset_cls,
            term.mask_gradient if attn_mask is term.attn_mask else None,
        )
        out = out[..., : self.head_dim].transpose(1, 2).reshape(batch, seq_len, embed_dim)
        return self.out_proj(out), probs if need_weights else None

    @staticmethod
    def _rotated(qkv, cos, sin):
        """q, k, v of the projection with q and k rotated by RoPE's tables in torch's elementwise operations
        (the plan's ``fused_rotary`` runs :func:`~tupe_plugin.attention.triton_rotary.rotate_projection`
        instead): where they lie in the projection when the tables let it
        (:func:`~tupe_plugin.encodings.rotary_position.rotate_in_place`), else out of place."""
        if rotates_in_place(cos, sin):
            rotate_in_place(qkv[:, :, :2], cos, sin)
            return split_heads(qkv)
        q, k, v = split_heads(qkv)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    @staticmethod
    def _shaw_products(q, term):
        """(B, H, T, 2K+1) scale * q_i . a_r: q against the Shaw table, gathered by clip(j-i) into the
        mask."""
        return torch.matmul(q * term.scale, term.rel_table.to(q.dtype).t())

    def disentangled_terms(self, q, k, term):
        """DeBERTa's scale * q_i . K^r_delta(i,j) and scale * k_j . Q^r_delta(i,j) (Q^r_delta(j,i) with
        ``--deberta-p2c paper``), each (B, H, T, T): q and k against the table rows this length reaches
        (:func:`~tupe_plugin.attention.toeplitz_scores.offset_scores`)."""
        query_rows, key_rows = self._relative_rows(q.dtype, term)
        # scaled before the products: (B, H, T, d_h) multiplications instead of (B, H, T, T) ones
        content_to_position = offset_scores(q * term.scale, key_rows, term.disentangled_offsets)
        # row j, column i: k_j . Q^r of the row the table gives the pair (j, i) for p2c; transposed to
        # (query i, key j)
        position_to_content = offset_scores(k * term.scale, query_rows, term.disentangled_p2c_offsets)
        return content_to_position, position_to_content.transpose(-1, -2)

    def disentangled_bias(self, q, k, term):
        """The sum of :meth:`disentangled_terms` as one (B, H, T, T) tensor, p2c added by bands of key rows
        (:func:`~tupe_plugin.attention.toeplitz_scores.offset_scores_with_transposed`): no (T, T) term is
        transposed or added whole."""
        query_rows, key_rows = self._relative_rows(q.dtype, term)
        return offset_scores_with_transposed(q * term.scale, key_rows, term.disentangled_offsets,
                                             k * term.scale, query_rows, term.disentangled_p2c_offsets)

    def disentangled_rows(self, dtype, term):
        """The same two terms as the Triton kernel and FlexAttention read them
        (:class:`~tupe_plugin.attention.relative_terms.RelativeRows`): K^r by the c2p offsets j - i, and Q^r
        by the p2c row, given for the pair (key j, query i) by offset i - j: the p2c offsets reversed."""
        query_rows, key_rows = self._relative_rows(dtype, term)
        return RelativeRows(key_rows, term.disentangled_offsets, query_rows,
                            term.disentangled_p2c_offsets.flip(0))

    def _relative_rows(self, dtype, term):
        """Q^r and K^r (H, R, d_h): the layer's projections of DeBERTa's table rows this length reaches."""
        table = term.disentangled_table.to(dtype)
        if self.relative_projections is not None:
            query_rows, key_rows = self.relative_projections(table)
        else:
            embed_dim = table.size(-1)
            weight, bias = self.in_proj.weight[: 2 * embed_dim], self.in_proj.bias[: 2 * embed_dim]
            query_rows, key_rows = F.linear(table, weight, bias).split(embed_dim, -1)
        rows = table.size(0)
        query_rows = query_rows.view(rows, self.num_heads, self.head_dim).transpose(0, 1)  # (H, R, d_h)
        key_rows = key_rows.view(rows, self.num_heads, self.head_dim).transpose(0, 1)
        return query_rows, key_rows


def split_heads(qkv):
    """q, k, v (B, H, T, d_h), views of a (B, T, 3, H, d_h) projection, by ``unbind``: its backward stacks
    the three gradients into the projection's layout in one pass, where three ``select`` views would each
    zero-fill a projection-sized gradient and then be summed (1.5 ms of a layer's backward at B T = 2048,
    C = 512 on CPU). Views of ``unbind`` may not be written in place: RoPE rotates the projection first."""
    return tuple(t.transpose(1, 2) for t in qkv.unbind(2))
