"""The parts of the positional term every layer of a forward reads
(:class:`~tupe_plugin.encodings.positional_term.PositionalTerm`), one type a kind: which tensors go together,
in which shapes, and under which name the attention paths read them.

Tensors are per head, (H, T, .), unless said otherwise; T is the forward's length. An encoding adds its parts
in its ``contribute(term, forward)`` (``term.add(part)``; ``forward`` the :class:`~.forward.Forward`: the
batch, the length and the tokens' positions); the attention plan checks that the path it chose
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
* :class:`Rotary`: RoPE's cos/sin tables, by which every layer rotates q and k, shared by the rows of the
  batch or per sequence (:attr:`Part.per_sequence`: positions of their own a row);
* :class:`LayerTerm`: a term each layer computes from its own q, k and logits with parameters of its own
  (CoPE's contextual positions, DAPE's MLP over the logits): the explicit path reads it.

Key padding (the mask, the rows' lengths, the shared mask gradient) stays in fields of the term itself.
"""

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

# A kind a path may read beside the part types' own (Part.kind, the class name): Shaw's value vectors
CLIPPED_VALUES = "ClippedTable.values"


class Part:
    """What every part says of itself: ``kind``, the name paths and errors know it by (its class name),
    ``words``, how an error names it, and :meth:`reads`, the kinds a path must read to take it. A term holds
    one part of each type
    (:meth:`PositionalTerm.add <tupe_plugin.encodings.positional_term.PositionalTerm.add>`);
    a new type of part is one subclass here, registered in :data:`PART_TYPES` by being defined, plus the
    paths that read it (:data:`tupe_plugin.attention.paths.PATH_READS`)."""

    kind: ClassVar[str]
    words: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.kind = cls.__name__
        PART_TYPES.append(cls)

    def reads(self):
        return (self.kind,)

    @property
    def per_sequence(self):
        """Whether the part holds tables per sequence of the batch (a leading B), not shared by the rows."""
        return False


# Every part type, in the order they are defined (the order a term lists its parts in)
PART_TYPES = []


@dataclass(frozen=True, eq=False)
class LowRank(Part):
    """TUPE's untied factors ``q`` = p U^Q and ``k`` = p U^K, (H, T, r) each, unscaled (the term's scale is
    applied to q), zero-padded so that the widened heads d_h + r fit the fused kernels."""

    q: torch.Tensor
    k: torch.Tensor
    words: ClassVar[str] = "TUPE's untied factors as widened heads (LowRank)"


@dataclass(frozen=True, eq=False)
class Shift(Part):
    """Added to every layer's query ``q`` (H, T or 1, d_h) and, where given, key ``k`` (H, T or 1, d_h)
    before the logits: BERT-A^d's p U^Q and p U^K, or a query-only shift shared by the positions (k None:
    its product with the keys depends on the content, so it has no content-free part)."""

    q: torch.Tensor
    k: Optional[torch.Tensor] = None
    words: ClassVar[str] = "query/key shifts (Shift)"


@dataclass(frozen=True, eq=False)
class DenseBias(Part):
    """A dense (H, T, T) bias added to the logits of every layer (TUPE's folded untied product, a bias of
    the offset expanded), carried by the mask the term builds."""

    bias: torch.Tensor
    words: ClassVar[str] = "a dense (H, T, T) bias (DenseBias)"


@dataclass(frozen=True, eq=False)
class OffsetRows(Part):
    """A bias of the offset j - i: ``rows`` (H, 2T - 1), the bias of query i and key j at j - i + T - 1,
    and ``cls`` (H, 2) or None, TUPE's [CLS] reset theta_1 (row 0) and theta_2 (column 0 of the rows
    i != 0), which replace the rows' values there (:mod:`tupe_plugin.attention.offset_rows`)."""

    rows: torch.Tensor
    cls: Optional[torch.Tensor] = None
    words: ClassVar[str] = "a bias of the offset j - i as its rows (OffsetRows)"


@dataclass(frozen=True, eq=False)
class ClippedTable(Part):
    """Shaw's ``table`` (2K + 1, d_h) shared by the heads (and layers): the pair (i, j) reads row
    ``index[i, j]`` = clip(j - i, -K, K) + K of the (T, T) ``index``, or ``offsets[j - i + T - 1]`` of its
    (2T - 1,) row by offset (the kernels that read by offset); ``values``: added to the values too."""

    table: torch.Tensor
    index: torch.Tensor
    offsets: torch.Tensor
    values: bool = False
    words: ClassVar[str] = "Shaw's clipped table on the keys (ClippedTable)"

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
    words: ClassVar[str] = "a table each layer projects, DeBERTa's c2p/p2c (ProjectedTable)"


@dataclass(frozen=True, eq=False)
class Rotary(Part):
    """RoPE's ``cos`` and ``sin``, by which every layer rotates its q and k: (T, d_h / 2), or (B, T, d_h / 2)
    where each sequence has positions of its own (randomized positions): those the fused rotation
    (:mod:`tupe_plugin.attention.triton_rotary`) does not read, torch's rotation runs in its place."""

    cos: torch.Tensor
    sin: torch.Tensor
    words: ClassVar[str] = "RoPE's rotation (Rotary)"

    @property
    def per_sequence(self):
        return self.cos.dim() == 3


@dataclass(frozen=True, eq=False)
class LayerTerm(Part):
    """A term each layer computes from its own attention: the module ``name`` of the layer's
    ``layer_terms`` (the one the encoding's ``layer_module(config)`` builds for each layer, with parameters of
    its own a layer) is called on the layer's scaled logits ``scale q k^T`` (B, H, T, T), float32, its q and
    k (B, H, T, d_h), the content-free bias every layer adds (H, T, T) or None, and the key padding (B, T),
    True at padding, or None; it returns what it adds to the logits (B, H, T, T) (CoPE's contextual
    positions, DAPE's MLP over the logits and the bias). The explicit path computes it (the logits are
    whole there)."""

    name: str
    words: ClassVar[str] = "a term each layer computes from its own logits (LayerTerm)"


PART_TYPES = tuple(PART_TYPES)
# The kinds a path may read (Part.reads), with the words an error names them in
LOW_RANK, SHIFT, DENSE_BIAS, OFFSET_ROWS = LowRank.kind, Shift.kind, DenseBias.kind, OffsetRows.kind
CLIPPED_TABLE, PROJECTED_TABLE, ROTARY, LAYER_TERM = (ClippedTable.kind, ProjectedTable.kind, Rotary.kind,
                                                      LayerTerm.kind)
KIND_WORDS = {**{part.kind: part.words for part in PART_TYPES},
              CLIPPED_VALUES: "Shaw's value vectors, which need the probabilities (ClippedTable with values)"}
