"""Multi-head self-attention that adds the shared positional term to its logits.

TUPE Eq. 7-11 (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv
2006.15595); Eq. 4 of Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT",
ICLR 2021. Per head: ``softmax(scale * [q ; q_low] . [k ; k_low] + mask) v`` with the term's low-rank
factors (``LowRank``), q and k shifted (``Shift``) or rotated by RoPE's angles (``Rotary``) when given (the
parts of :mod:`tupe_plugin.terms.parts`, see :mod:`~tupe_plugin.encodings.positional_term`). Shaw
relative vectors add ``scale * q_i . a_{j-i}`` (computed against the (2K+1)-row table, then gathered)
to the mask, or hand the table to the Triton kernel or FlexAttention, which read it by offset, and their
value term ``sum_j alpha_ij a_{j-i}`` to the output (the table and its index handed to the explicit path or
the Triton kernel, which need the probabilities); DeBERTa's content-to-position
and position-to-content terms (He, Liu, Gao, Chen, "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", arXiv 2006.03654, Eq. 4) from q and k against the rows of the shared table projected by the
layer (:mod:`~tupe_plugin.encodings.deberta_position`, :mod:`~tupe_plugin.attention.toeplitz_scores`; on the
Triton kernel and FlexAttention the projected rows, read by offset): any ``ProjectedTable``, projected by the
module its encoding built for the layer (``relative_projections``), with a query shift on the c2p product
where the part has one. Which
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
from ..encodings.rotary_position import rotate, rotate_in_place, rotates_in_place
from ..terms.parts import (ClippedTable, DenseBias, LayerTerm, LowRank, OffsetRows, ProjectedTable, Rotary,
                           Shift)


class PositionalSelfAttention(nn.Module):
    """``layer_projection``: builds this layer's module for a projected table
    (:class:`~tupe_plugin.terms.parts.ProjectedTable`; DeBERTa's W^{q,r}, W^{k,r}), the encoding's
    (:meth:`~tupe_plugin.encodings.positional_term.SharedPositionalTerm.layer_projection`), called here, after
    the layer's own projections are made (the order of a seeded initialisation), and kept as
    ``relative_projections`` (the checkpoints' key). Without one (None, or a build that gives None) a
    projected table is projected with the layer's content projections (DeBERTa's share_att_key).

    ``layer_terms``: builds this layer's modules of the :class:`~tupe_plugin.terms.parts.LayerTerm` parts
    ({encoding name: module},
    :meth:`~tupe_plugin.encodings.positional_term.SharedPositionalTerm.layer_terms`),
    kept as ``layer_terms`` (the checkpoints' key ``layer_terms.<name>.*``)."""

    def __init__(self, embed_dim, num_heads, layer_projection=None, layer_terms=None):
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
        self.relative_projections = None if layer_projection is None else layer_projection()
        terms = {} if layer_terms is None else layer_terms()
        self.layer_terms = nn.ModuleDict(terms) if terms else None

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
        """x: (B, T, C); term: the forward's PositionalTerm (with its mask); plan: its AttentionPlan;
        ``query`` (B, T, C): the states the queries are read from, x then gives the keys and values only
        (DeBERTa's Enhanced Mask Decoder, :mod:`.enhanced_mask_decoder`).

        Returns the output (B, T, C) and, with ``need_weights``, the probabilities (B, H, T, T).
        """
        batch, seq_len, embed_dim = x.shape
        rotary = term.get(Rotary)
        if rotary is not None and plan.fused_rotary:
            rows = rotate_projection(self.token_projection(x, query), rotary.cos, rotary.sin, self.num_heads)
            q, k, v = split_heads(rows.view(batch, seq_len, 3, self.num_heads, self.head_dim))
        elif rotary is not None:
            q, k, v = self._rotated(self.projection(x, query), rotary.cos, rotary.sin)
        else:
            q, k, v = split_heads(self.projection(x, query))
        attn_mask, relative = term.attn_mask, None
        offset = term.get(OffsetRows)
        offset_rows, offset_cls = (None, None) if offset is None else (offset.rows, offset.cls)
        shift = term.get(Shift)
        if shift is not None:
            q = q + shift.q.to(q.dtype)
            if shift.k is not None:
                k = k + shift.k.to(k.dtype)
        layer_logits = self.layer_logits(q, k, term)
        clipped = term.get(ClippedTable)
        if clipped is not None:
            if plan.relative_by_offset:
                relative = RelativeRows(clipped.table[None], clipped.offsets)
            else:
                attn_mask = add_bias(attn_mask, ClippedDistanceScores.apply(self._shaw_products(q, term),
                                                                            clipped.index))
        if term.get(ProjectedTable) is not None:
            if plan.relative_by_offset:
                relative, shift_rows = self.projected_rows(q.dtype, term)
                if shift_rows is not None:  # the query shift's products, a bias of the offset (check_reads)
                    offset_rows = shift_rows if offset_rows is None else offset_rows + shift_rows
            else:
                attn_mask = add_bias(attn_mask, self.disentangled_bias(q, k, term))
        low_rank = term.get(LowRank)
        if low_rank is not None:
            extra = low_rank.q.size(-1)
            q = torch.cat([q, low_rank.q.to(q.dtype).expand(batch, -1, -1, -1)], -1)
            k = torch.cat([k, low_rank.k.to(k.dtype).expand(batch, -1, -1, -1)], -1)
            v = F.pad(v, (0, extra))
        out, probs = attend(
            plan.path, q, k, v, attn_mask, term.scale, plan.dropout,
            clipped.table if clipped is not None and clipped.values else None,
            None if clipped is None else clipped.index, plan.backends, term.key_lengths,
            relative, None if clipped is None else clipped.offsets, offset_rows, offset_cls,
            term.mask_gradient if attn_mask is term.attn_mask else None, layer_logits,
        )
        out = out[..., : self.head_dim].transpose(1, 2).reshape(batch, seq_len, embed_dim)
        return self.out_proj(out), probs if need_weights else None

    def layer_logits(self, q, k, term):
        """What the term's :class:`~tupe_plugin.terms.parts.LayerTerm` parts add to this layer's logits, as a
        function of its scaled logits ``scale q k^T`` (B, H, T, T) for the explicit path, or None: each
        part's module of this layer called on them, on q and k (B, H, T, d_h, shifted and rotated), on the
        content-free bias every layer adds (the dense bias, (H, T, T), or None) and the key padding."""
        parts = [part for part in term.parts() if isinstance(part, LayerTerm)]
        if not parts:
            return None
        dense = term.get(DenseBias)
        bias = None if dense is None else dense.bias
        modules = [self.layer_terms[part.name] for part in parts]

        def added(logits):
            return sum(module(logits, q, k, bias, term.key_padding) for module in modules)
        return added

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
        return torch.matmul(q * term.scale, term.get(ClippedTable).table.to(q.dtype).t())

    def disentangled_terms(self, q, k, term):
        """The term's projected table's scale * (q_i + query shift) . K^r_delta(i,j) and scale * k_j .
        Q^r_delta(i,j) (DeBERTa's c2p and p2c; Q^r_delta(j,i) with ``--deberta-p2c paper``), each
        (B, H, T, T) or None where the table has no such term: q and k against the table rows this length
        reaches (:func:`~tupe_plugin.attention.toeplitz_scores.offset_scores`)."""
        table = term.get(ProjectedTable)
        query_rows, key_rows = self._relative_rows(q.dtype, term)
        content_to_position = position_to_content = None
        if key_rows is not None:
            # scaled before the products: (B, H, T, d_h) multiplications instead of (B, H, T, T) ones
            content_to_position = offset_scores(self._shifted(q, table) * term.scale, key_rows, table.offsets)
        if table.p2c_offsets is not None:
            # row j, column i: k_j . Q^r of the row the table gives the pair (j, i) for p2c; transposed to
            # (query i, key j)
            position_to_content = offset_scores(k * term.scale, query_rows, table.p2c_offsets)
            position_to_content = position_to_content.transpose(-1, -2)
        return content_to_position, position_to_content

    def disentangled_bias(self, q, k, term):
        """The sum of :meth:`disentangled_terms` as one (B, H, T, T) tensor, p2c added by bands of key rows
        (:func:`~tupe_plugin.attention.toeplitz_scores.offset_scores_with_transposed`): no (T, T) term is
        transposed or added whole."""
        table = term.get(ProjectedTable)
        if table.p2c_offsets is None:
            return self.disentangled_terms(q, k, term)[0]
        query_rows, key_rows = self._relative_rows(q.dtype, term)
        return offset_scores_with_transposed(self._shifted(q, table) * term.scale, key_rows, table.offsets,
                                             k * term.scale, query_rows, table.p2c_offsets)

    def projected_rows(self, dtype, term):
        """The same terms as the Triton kernel and FlexAttention read them
        (:class:`~tupe_plugin.attention.relative_terms.RelativeRows`): K^r by the c2p offsets j - i, and Q^r
        by the p2c row, given for the pair (key j, query i) by offset i - j: the p2c offsets reversed; and the
        query shift's part of c2p, scale * shift . K^r, as the (H, 2T - 1) rows of a bias of the offset
        (float32, as the term's are), or None."""
        table = term.get(ProjectedTable)
        query_rows, key_rows = self._relative_rows(dtype, term)
        p2c = table.p2c_offsets
        relative = RelativeRows(key_rows, None if key_rows is None else table.offsets,
                                None if p2c is None else query_rows, None if p2c is None else p2c.flip(0))
        if table.query_shift is None or key_rows is None:
            return relative, None
        shift = table.query_shift.to(dtype) * term.scale  # (H, 1, d_h)
        per_row = torch.matmul(shift, key_rows.transpose(-1, -2)).squeeze(-2)  # (H, R)
        return relative, per_row[:, table.offsets].float()

    def disentangled_rows(self, dtype, term):
        """:meth:`projected_rows`' RelativeRows (DeBERTa's terms, which have no query shift)."""
        return self.projected_rows(dtype, term)[0]

    @staticmethod
    def _shifted(q, table):
        return q if table.query_shift is None else q + table.query_shift.to(q.dtype)

    def _relative_rows(self, dtype, term):
        """Q^r and K^r (H, R, d_h) or None: the layer's projections of the projected table's rows this length
        reaches, by its ``relative_projections`` or else its content projections."""
        table = term.get(ProjectedTable).table.to(dtype)
        if self.relative_projections is not None:
            query_rows, key_rows = self.relative_projections(table)
        else:
            embed_dim = table.size(-1)
            weight, bias = self.in_proj.weight[: 2 * embed_dim], self.in_proj.bias[: 2 * embed_dim]
            query_rows, key_rows = F.linear(table, weight, bias).split(embed_dim, -1)
        return self._heads(query_rows), self._heads(key_rows)

    def _heads(self, rows):
        """(R, C) rows as (H, R, d_h), or None."""
        if rows is None:
            return None
        return rows.view(rows.size(0), self.num_heads, self.head_dim).transpose(0, 1)


def split_heads(qkv):
    """q, k, v (B, H, T, d_h), views of a (B, T, 3, H, d_h) projection, by ``unbind``: its backward stacks
    the three gradients into the projection's layout in one pass, where three ``select`` views would each
    zero-fill a projection-sized gradient and then be summed (1.5 ms of a layer's backward at B T = 2048,
    C = 512 on CPU). Views of ``unbind`` may not be written in place: RoPE rotates the projection first."""
    return tuple(t.transpose(1, 2) for t in qkv.unbind(2))
