"""The content-free part of the attention logits, built once per forward and shared by all layers.

TUPE Eq. 7-11 and §4.3 (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv
2006.15595); Eq. 4 of Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT",
ICLR 2021. :class:`SharedPositionalTerm` owns the model's position encodings (the modules their registry
entries build, :mod:`.registry`) and lets each one add its typed parts (:mod:`tupe_plugin.terms.parts`) to
the forward's :class:`PositionalTerm` (``contribute(term, forward)``, a [CLS] reset included with the term
it resets): TUPE's untied term as low-rank factors or BERT-A^d's query/key shifts, a bias of the offset as
its rows (T5, ALiBi, KERPLE, Sandwich, FIRE), the [CLS] reset of that bias when no untied term carries it
(:mod:`.cls_reset`), RoPE's cos/sin, Shaw's clipped table, a table each layer projects (DeBERTa,
Transformer-XL). Low-rank terms stay
factored so that each layer keeps a fused attention kernel, unless the forward's attention plan folds
them into the dense bias (:func:`~tupe_plugin.attention.paths.fold_untied_term`); the mask with the key
padding is built here too, once for every layer.
"""

from dataclasses import dataclass, field, replace
from typing import Optional

import torch
from torch import nn

from ..terms.forward import Forward
from ..terms.parts import PART_TYPES, DenseBias, LowRank, OffsetRows, Shift
from . import registry
from .cls_reset import build_cls_reset
from .offset_bias import toeplitz
from .untied_product import ProductMemory, untied_product


@dataclass
class PositionalTerm:
    """What every layer's attention adds to its logits, as typed parts (:mod:`tupe_plugin.terms.parts`) held
    by their type, at most one of each: an encoding adds its own with :meth:`add`, a path reads them with
    :meth:`get` (None where the term has none). The attention plan checks that its path reads every part
    present (:meth:`parts`; :meth:`~tupe_plugin.attention.paths.AttentionPlan.check_reads`). ``forward``: the
    :class:`~tupe_plugin.terms.forward.Forward` the parts were built for.

    Key padding: ``attn_mask``, the mask with key padding of :meth:`attention_mask` (the dense bias in it), or
    the bias alone with the rows' unpadded lengths (B,) in ``key_lengths`` for a kernel that takes padding
    apart; ``key_padding`` (B, T), True at padding, or None, for the terms a layer computes
    (:class:`~tupe_plugin.terms.parts.LayerTerm`); ``mask_gradient``, where the encoder set one (the CPU
    kernels, chunked and biased flash, :mod:`~tupe_plugin.attention.shared_mask_gradient`), the buffer that
    every layer's kernel adds the gradient of ``attn_mask`` to.

    A bias of the offset j - i keeps its O(T) form, its rows (:mod:`~tupe_plugin.attention.offset_rows`; the
    dense form :func:`~.offset_bias.toeplitz`), added to the dense bias by the kernels that read them (the
    plan's ``offset_bias_as_rows``); for the others :meth:`expanded` adds them to the dense bias once per
    forward."""

    scale: float
    forward: Optional[Forward] = None
    held: dict = field(default_factory=dict)
    attn_mask: Optional[torch.Tensor] = None
    key_lengths: Optional[torch.Tensor] = None
    key_padding: Optional[torch.Tensor] = None
    mask_gradient: Optional[object] = None

    def add(self, part):
        """Add an encoding's ``part``; a second part of a type is refused (two encodings that would each add
        one are refused with the flags that choose them, before a model is built)."""
        if type(part) in self.held:
            raise ValueError(f"the positional term already holds a {type(part).__name__}: two encodings "
                             "add one, and a term holds one of each kind")
        self.held[type(part)] = part

    def put(self, part):
        """Set ``part`` in place of the part of its type (an encoding that completes another's: the [CLS]
        reset of a bias of the offset)."""
        self.held[type(part)] = part

    def get(self, part_type):
        """The part of type ``part_type``, or None."""
        return self.held.get(part_type)

    def with_parts(self, *parts, without=()):
        """The same term with ``parts`` in place of those of their types, and none of the types
        ``without``."""
        held = {kind: part for kind, part in self.held.items() if kind not in without}
        held.update((type(part), part) for part in parts)
        return replace(self, held=held)

    def parts(self):
        """The parts present, in the order of :data:`~tupe_plugin.terms.parts.PART_TYPES`."""
        return [self.held[kind] for kind in PART_TYPES if kind in self.held]

    def dense(self):
        """The content-free logits as one (H, T, T) matrix (for analysis and tests); Shaw and DeBERTa
        terms, which depend on the content, excluded, and a query-only shift (its product with the keys
        depends on the content)."""
        parts = []
        for pair in (self.get(LowRank), self.get(Shift)):
            if pair is not None and pair.k is not None:
                # scaled before the product, as the kernels do: in fp16 the unscaled product of
                # large factors overflows (65504) where the scaled logits do not
                parts.append(torch.einsum("hid,hjd->hij", pair.q * self.scale, pair.k))
        if self.get(DenseBias) is not None:
            parts.append(self.get(DenseBias).bias)
        if self.get(OffsetRows) is not None:
            parts.append(toeplitz(self.get(OffsetRows).rows, self.get(OffsetRows).cls))
        return sum(parts) if parts else None

    def expanded(self):
        """The same term with the bias of the offset added to the dense bias as its (H, T, T) form, for the
        paths that take one dense bias."""
        offset, dense = self.get(OffsetRows), self.get(DenseBias)
        if offset is None:
            return self
        rows = toeplitz(offset.rows, offset.cls)
        return self.with_parts(DenseBias(rows if dense is None else dense.bias + rows), without=(OffsetRows,))

    def folded(self, memory=None):
        """The same term with the untied factors multiplied out into the dense bias, once per forward: for
        the explicit path, and wherever a dense bias (the T5 term) is added in every layer anyway —
        there the untied product joins it for free, while widened heads (d_h -> 2 d_h + 2, padded to
        a multiple of 8) would double every layer's attention matmuls. A bias of the offset stays apart.
        ``memory``: the model's :class:`~.untied_product.ProductMemory`, where a large product is written
        in the storage of the previous step's gradient."""
        low_rank, dense = self.get(LowRank), self.get(DenseBias)
        if low_rank is None:
            return self
        untied = untied_product(low_rank.q * self.scale, low_rank.k, memory)
        # an addition, not baddbmm: under autocast the product may be bf16, an expanded bias stays float32
        bias = untied if dense is None else dense.bias + untied
        return self.with_parts(DenseBias(bias), without=(LowRank,))

    def attention_mask(self, key_padding_mask, dtype):
        """The mask handed to every layer's fused attention, built once per forward.

        ``key_padding_mask`` is (B, T), True at padding. Returns None, a boolean (B, 1, 1, T) mask
        (True = attend) or a float (1 or B, H, T, T) additive mask with padded keys at the most
        negative value of ``dtype``.
        """
        dense = self.get(DenseBias)
        if dense is None:
            if key_padding_mask is None:
                return None
            return ~key_padding_mask[:, None, None, :]
        mask = dense.bias.to(dtype)[None]
        if key_padding_mask is not None:
            mask = mask.masked_fill(key_padding_mask[:, None, None, :], torch.finfo(dtype).min)
        return mask


class SharedPositionalTerm(nn.Module):
    """Owns the position encodings of a :class:`~.position_config.PositionConfig` that act in
    attention and builds the :class:`PositionalTerm` of each forward.

    Each encoding's module is the attribute its registry entry names (``slot``), whose name is the prefix
    of its checkpoints' keys (``positional_term.untied_position.*``, ...; the biases of the offset share
    ``relative_bias``); the [CLS] reset with thetas of its own (``cls_reset``) follows the bias it resets.
    The term is built by
    :meth:`build` rather than ``forward``: it is not a tensor, and module hooks that walk outputs
    (fairseq's NaN detector, torch's backward hooks) then see only the encodings' own tensor outputs.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        for slot in dict.fromkeys([*(encoding.slot for encoding in registry.ENCODINGS if encoding.slot),
                                   "cls_reset"]):
            setattr(self, slot, None)
        # registered in the order they add their parts (an optimizer's state follows that order)
        for encoding in config.encodings():
            if encoding.slot is not None:
                setattr(self, encoding.slot, encoding.build(config))
            if encoding.kind in ("bias", "distance_bias"):
                self.cls_reset = build_cls_reset(config)
        self.product_memory = ProductMemory()

    def encodings(self):
        """The encodings' modules this model uses, in the order they add their parts."""
        return [module for module in self._modules.values() if hasattr(module, "contribute")]

    def layer_projection(self):
        """A fresh module for one layer to project a :class:`~tupe_plugin.terms.parts.ProjectedTable` with
        (the layer's ``relative_projections``), built by the encoding that adds the table
        (``layer_projection(config)``), or None: no encoding builds one (the layer then projects a table
        with its own query and key projections)."""
        for encoding in self.encodings():
            build = getattr(encoding, "layer_projection", None)
            module = None if build is None else build(self.config)
            if module is not None:
                return module
        return None

    def layer_terms(self):
        """Fresh modules for one layer to compute the :class:`~tupe_plugin.terms.parts.LayerTerm` of each
        encoding that adds one ({its name: ``layer_module(config)``}; the layer's ``layer_terms``)."""
        return {encoding.name: encoding.layer_module(self.config) for encoding in self.config.encodings()
                if encoding.layer_module is not None}

    def forward_of(self, batch, seq_len, device=None):
        """The :class:`~tupe_plugin.terms.forward.Forward` of ``batch`` rows of ``seq_len`` tokens: positions
        0..T-1, or in training those an encoding samples for each sequence (its ``positions``)."""
        forward = Forward.of_length(seq_len, batch, device)
        if self.training:
            for encoding in self.config.encodings():
                if encoding.positions is not None:
                    forward = Forward(batch, seq_len, encoding.positions(self.config, forward))
        return forward

    def build(self, forward, fold_untied=False, key_padding_mask=None, dtype=torch.float32,
              padding_as_lengths=False, offset_bias_as_rows=False):
        """The term every layer of the :class:`~tupe_plugin.terms.forward.Forward` ``forward`` consumes: the
        untied factors multiplied out when ``fold_untied``, a bias of the offset kept as its rows when
        ``offset_bias_as_rows`` (else expanded into the dense bias), the mask with key padding built once, or
        with ``padding_as_lengths`` the bias alone and the rows' lengths (the attention plan's choices).

        ``key_padding_mask`` is (B, T), True at padding (right padding); ``dtype`` the dtype of the
        hidden states.
        """
        term = self.content_free(forward)
        if not torch.is_grad_enabled():  # no backward will hand a gradient's storage on: let the kept one go
            self.product_memory.release()
        if fold_untied:
            term = term.folded(self.product_memory)
        if not offset_bias_as_rows:
            term = term.expanded()
        term = replace(term, key_padding=key_padding_mask)
        if padding_as_lengths:
            lengths = None if key_padding_mask is None else (~key_padding_mask).sum(1)
            return replace(term, attn_mask=term.attention_mask(None, dtype), key_lengths=lengths)
        return replace(term, attn_mask=term.attention_mask(key_padding_mask, dtype))

    def content_free(self, forward):
        """The unfolded term of ``forward`` (a :class:`~tupe_plugin.terms.forward.Forward`, or a length T:
        positions 0..T-1), no mask (for :meth:`build` and the analysis)."""
        if isinstance(forward, int):
            forward = Forward.of_length(forward)
        term = PositionalTerm(scale=self.config.scale, forward=forward)
        for encoding in self.encodings():
            encoding.contribute(term, forward)
        return term
