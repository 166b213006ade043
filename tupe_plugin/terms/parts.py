"""The parts of the positional term every layer of a forward reads
(:class:`~tupe_plugin.encodings.positional_term.PositionalTerm`), one type a kind: which tensors go together,
in which shapes, and under which name the attention paths read them.

Tensors are per head, (H, T, .), unless said otherwise; T is the forward's length. An encoding adds its parts
in its ``contribute(term, seq_len)`` (``term.add(part)``); the attention plan checks that the path it chose
reads every part present (:meth:`~tupe_plugin.attention.paths.AttentionPlan.check_reads`, from
:meth:`Part.reads`, the kinds below); the layer routes each part to its kernel
(:mod:`tupe_plugin.encoder.self_attention`).

* :class:`LowRank`: TUPE's untied factors (Ke, He, Liu, arXiv 2006.15595, Eq. 7), concatenated to the word
  query and key (widened heads) or multiplied out into the :class:`DenseBias` once per forward (``folded``);
* :class:`Shift`: added to every layer's query (and key): BERT-A^d's four terms (§4.3), or a query-only
  shift shared by the positions (Transformer-XL's u, (H, 1, d_h));
* :class:`DenseBias`: a dense (H, T, T) bias, which the mask carries to every path;
* :class:`OffsetRows`: a bias of the offset j - i as its Toeplitz rows (H, 2T - 1) with TUPE's [CLS] values
  (T5, ALiBi, KERPLE, Sandwich, FIRE), read as rows by the kernels that can, expanded into the
  :class:`DenseBias` once per forward for the others (``expanded``);
* :class:`ClippedTable`: Shaw's table shared by the heads, read by the clipped distance, on the keys and
  optionally the values (Shaw, Uszkoreit, Vaswani, arXiv 1803.02155);
* :class:`ProjectedTable`: a table shared by the layers that each layer projects with parameters of its own
  (DeBERTa's c2p and p2c, He et al., arXiv 2006.03654, Eq. 4): see its docstring for how a new encoding of
  this kind plugs in;
* :class:`Rotary`: RoPE's cos/sin tables, by which every layer rotates q and k.

Key padding (the mask, the rows' lengths, the shared mask gradient) stays in fields of the term itself.
"""

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

# The kinds of parts a path may read (Part.reads), with the words an error names them in
LOW_RANK = "LowRank"
SHIFT = "Shift"
DENSE_BIAS = "DenseBias"
OFFSET_ROWS = "OffsetRows"
CLIPPED_TABLE = "ClippedTable"
CLIPPED_VALUES = "ClippedTable.values"
PROJECTED_TABLE = "ProjectedTable"
ROTARY = "Rotary"
KIND_WORDS = {
    LOW_RANK: "TUPE's untied factors as widened heads (LowRank)",
    SHIFT: "query/key shifts (Shift)",
    DENSE_BIAS: "a dense (H, T, T) bias (DenseBias)",
    OFFSET_ROWS: "a bias of the offset j - i as its rows (OffsetRows)",
    CLIPPED_TABLE: "Shaw's clipped table on the keys (ClippedTable)",
    CLIPPED_VALUES: "Shaw's value vectors, which need the probabilities (ClippedTable with values)",
    PROJECTED_TABLE: "a table each layer projects, DeBERTa's c2p/p2c (ProjectedTable)",
    ROTARY: "RoPE's rotation (Rotary)",
}


class Part:
    """What every part says of itself: ``slot``, the term's attribute that holds it (one part a kind), and
    :meth:`reads`, the kinds a path must read to take it."""

    slot: ClassVar[str]
    kind: ClassVar[str]

    def reads(self):
        return (self.kind,)


@dataclass(frozen=True, eq=False)
class LowRank(Part):
    """TUPE's untied factors ``q`` = p U^Q and ``k`` = p U^K, (H, T, r) each, unscaled (the term's scale is
    applied to q), zero-padded so that the widened heads d_h + r fit the fused kernels."""

    q: torch.Tensor
    k: torch.Tensor
    slot: ClassVar[str] = "low_rank"
    kind: ClassVar[str] = LOW_RANK


@dataclass(frozen=True, eq=False)
class Shift(Part):
    """Added to every layer's query ``q`` (H, T or 1, d_h) and, where given, key ``k`` (H, T or 1, d_h)
    before the logits: BERT-A^d's p U^Q and p U^K, or a query-only shift shared by the positions (k None:
    its product with the keys depends on the content, so it has no content-free part)."""

    q: torch.Tensor
    k: Optional[torch.Tensor] = None
    slot: ClassVar[str] = "shift"
    kind: ClassVar[str] = SHIFT


@dataclass(frozen=True, eq=False)
class DenseBias(Part):
    """A dense (H, T, T) bias added to the logits of every layer (TUPE's folded untied product, a bias of
    the offset expanded), carried by the mask the term builds."""

    bias: torch.Tensor
    slot: ClassVar[str] = "dense_bias"
    kind: ClassVar[str] = DENSE_BIAS


@dataclass(frozen=True, eq=False)
class OffsetRows(Part):
    """A bias of the offset j - i: ``rows`` (H, 2T - 1), the bias of query i and key j at j - i + T - 1,
    and ``cls`` (H, 2) or None, TUPE's [CLS] reset theta_1 (row 0) and theta_2 (column 0 of the rows
    i != 0), which replace the rows' values there (:mod:`tupe_plugin.attention.offset_rows`)."""

    rows: torch.Tensor
    cls: Optional[torch.Tensor] = None
    slot: ClassVar[str] = "offset_bias"
    kind: ClassVar[str] = OFFSET_ROWS


@dataclass(frozen=True, eq=False)
class ClippedTable(Part):
    """Shaw's ``table`` (2K + 1, d_h) shared by the heads (and layers): the pair (i, j) reads row
    ``index[i, j]`` = clip(j - i, -K, K) + K of the (T, T) ``index``, or ``offsets[j - i + T - 1]`` of its
    (2T - 1,) row by offset (the kernels that read by offset); ``values``: added to the values too."""

    table: torch.Tensor
    index: torch.Tensor
    offsets: torch.Tensor
    values: bool = False
    slot: ClassVar[str] = "clipped_table"
    kind: ClassVar[str] = CLIPPED_TABLE

    def reads(self):
        return (CLIPPED_TABLE, CLIPPED_VALUES) if self.values else (CLIPPED_TABLE,)


@dataclass(frozen=True, eq=False)
class ProjectedTable(Part):
    """A ``table`` (R, C) shared by the layers, which each layer projects with parameters of its own into
    K^r (the rows q is multiplied by: content-to-position) and Q^r (the rows k is multiplied by:
    position-to-content), (H, R, d_h) each. The pair (query i, key j) adds
    ``scale (q_i + query_shift) . K^r[offsets[j - i + T - 1]]`` and, with ``p2c_offsets``,
    ``scale k_j . Q^r[p2c_offsets[T - 1 - (j - i)]]`` (the row the pair (key j, query i) reads) to its logit.
    ``query_shift`` (H, 1, d_h) or None: added to the query of the c2p product alone (Transformer-XL's v - u
    where a :class:`Shift` adds u to the query).

    How a layer projects the table: each layer holds the module the encoding builds for it,
    ``encoding.layer_projection(config)`` (a fresh ``nn.Module`` a layer, or None), under the name
    ``relative_projections`` (the checkpoint key ``layers.N.self_attn.relative_projections.*``); called on the
    table it returns (Q^r, K^r) as (R, C) rows, either None (no p2c or no c2p). Where the encoding builds
    none (DeBERTa's share_att_key), the layer projects the table with its own query and key projections.
    A new encoding of this kind is then one module under encodings/: a ``contribute`` that adds this part
    (and any :class:`Shift`) and a ``layer_projection``; nothing in attention/ or encoder/ changes."""

    table: torch.Tensor
    offsets: torch.Tensor
    p2c_offsets: Optional[torch.Tensor] = None
    query_shift: Optional[torch.Tensor] = None
    slot: ClassVar[str] = "projected_table"
    kind: ClassVar[str] = PROJECTED_TABLE


@dataclass(frozen=True, eq=False)
class Rotary(Part):
    """RoPE's ``cos`` and ``sin`` (T, d_h / 2), by which every layer rotates its q and k."""

    cos: torch.Tensor
    sin: torch.Tensor
    slot: ClassVar[str] = "rotary"
    kind: ClassVar[str] = ROTARY


# The term's slots in the order the parts are listed
PART_TYPES = (LowRank, Shift, DenseBias, OffsetRows, ClippedTable, ProjectedTable, Rotary)
