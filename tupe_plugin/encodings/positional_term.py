"""The content-free part of the attention logits, built once per forward and shared by all layers.

TUPE Eq. 7-11 and §4.3 (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv
2006.15595); Eq. 4 of Wang, Shang, Lioma, Jiang, Yang, Liu, Simonsen, "On Position Embeddings in BERT",
ICLR 2021. :class:`SharedPositionalTerm` owns the model's position encodings and lets each one add its
part to the forward's :class:`PositionalTerm` (``contribute(term, seq_len)``, a [CLS] reset included
with the term it resets): TUPE's untied term as low-rank factors or BERT-A^d's query/key shifts
(:mod:`.untied_position`), the T5, ALiBi, KERPLE, Sandwich or FIRE bias (:mod:`.relative_position`,
:mod:`.alibi_position`, :mod:`.kerple_position`, :mod:`.sandwich_position`, :mod:`.fire_position`),
the [CLS] reset of that bias when no untied term carries it (:mod:`.cls_reset`), RoPE's cos/sin
(:mod:`.rotary_position`), the Shaw table (:mod:`.shaw_position`), DeBERTa's relative table
(:mod:`.deberta_position`). Low-rank terms stay
factored so that each layer keeps a fused attention kernel, unless the forward's attention plan folds
them into the dense bias (:func:`~tupe_plugin.attention.paths.fold_untied_term`); the mask with the key
padding is built here too, once for every layer.
"""

from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import nn

from . import registry
from .cls_reset import build_cls_reset
from .offset_bias import toeplitz
from .untied_product import ProductMemory, untied_product


@dataclass
class PositionalTerm:
    """What every layer's attention adds to its logits; tensors are per head, shape (H, T, .), and
    ``attn_mask`` the mask with key padding of :meth:`attention_mask`, or the bias alone with the rows'
    unpadded lengths (B,) in ``key_lengths`` for a kernel that takes padding apart.

    A bias of the offset j - i keeps its O(T) form (:mod:`~tupe_plugin.attention.offset_rows`; the dense form
    :func:`~.offset_bias.toeplitz`):
    ``offset_rows`` (H, 2T - 1), the bias of query i and key j at ``j - i + T - 1``, and ``offset_cls``
    (H, 2), the [CLS] reset's theta_1 (row 0) and theta_2 (column 0 of the rows i != 0), which replace the
    rows' values there. They are added to ``bias``, the dense (H, T, T) part (TUPE's untied product when
    folded), by the kernels that read them (the plan's ``offset_bias_as_rows``); for the others
    :meth:`expanded` adds them to ``bias`` once per forward. ``mask_gradient``: where the encoder set one
    (the CPU kernels, chunked and biased flash, :mod:`~tupe_plugin.attention.shared_mask_gradient`), the
    buffer that every layer's kernel adds the gradient of ``attn_mask`` to."""

    scale: float
    q_extra: Optional[torch.Tensor] = None
    k_extra: Optional[torch.Tensor] = None
    q_shift: Optional[torch.Tensor] = None
    k_shift: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None
    rel_table: Optional[torch.Tensor] = None
    rel_index: Optional[torch.Tensor] = None
    rel_offsets: Optional[torch.Tensor] = None
    rel_values: bool = False
    disentangled_table: Optional[torch.Tensor] = None
    disentangled_offsets: Optional[torch.Tensor] = None
    disentangled_p2c_offsets: Optional[torch.Tensor] = None
    rotary_cos: Optional[torch.Tensor] = None
    rotary_sin: Optional[torch.Tensor] = None
    offset_rows: Optional[torch.Tensor] = None
    offset_cls: Optional[torch.Tensor] = None
    attn_mask: Optional[torch.Tensor] = None
    key_lengths: Optional[torch.Tensor] = None
    mask_gradient: Optional[object] = None

    def dense(self):
        """The content-free logits as one (H, T, T) matrix (for analysis and tests); Shaw and DeBERTa
        terms, which depend on the content, excluded."""
        parts = []
        for q, k in ((self.q_extra, self.k_extra), (self.q_shift, self.k_shift)):
            if q is not None:
                # scaled before the product, as the kernels do: in fp16 the unscaled product of
                # large factors overflows (65504) where the scaled logits do not
                parts.append(torch.einsum("hid,hjd->hij", q * self.scale, k))
        if self.bias is not None:
            parts.append(self.bias)
        if self.offset_rows is not None:
            parts.append(toeplitz(self.offset_rows, self.offset_cls))
        return sum(parts) if parts else None

    def expanded(self):
        """The same term with the bias of the offset added to ``bias`` as its dense (H, T, T) form, for the
        paths that take one dense bias."""
        if self.offset_rows is None:
            return self
        rows = toeplitz(self.offset_rows, self.offset_cls)
        bias = rows if self.bias is None else self.bias + rows
        return replace(self, offset_rows=None, offset_cls=None, bias=bias)

    def folded(self, memory=None):
        """The same term with the untied factors multiplied out into ``bias``, once per forward: for
        the explicit path, and wherever a dense bias (the T5 term) is added in every layer anyway —
        there the untied product joins it for free, while widened heads (d_h -> 2 d_h + 2, padded to
        a multiple of 8) would double every layer's attention matmuls. A bias of the offset stays apart.
        ``memory``: the model's :class:`~.untied_product.ProductMemory`, where a large product is written
        in the storage of the previous step's gradient."""
        if self.q_extra is None:
            return self
        untied = untied_product(self.q_extra * self.scale, self.k_extra, memory)
        # an addition, not baddbmm: under autocast the product may be bf16, an expanded bias stays float32
        bias = untied if self.bias is None else self.bias + untied
        return replace(self, q_extra=None, k_extra=None, bias=bias)

    def attention_mask(self, key_padding_mask, dtype):
        """The mask handed to every layer's fused attention, built once per forward.

        ``key_padding_mask`` is (B, T), True at padding. Returns None, a boolean (B, 1, 1, T) mask
        (True = attend) or a float (1 or B, H, T, T) additive mask with padded keys at the most
        negative value of ``dtype``.
        """
        if self.bias is None:
            if key_padding_mask is None:
                return None
            return ~key_padding_mask[:, None, None, :]
        mask = self.bias.to(dtype)[None]
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

    def build(self, seq_len, fold_untied=False, key_padding_mask=None, dtype=torch.float32,
              padding_as_lengths=False, offset_bias_as_rows=False):
        """The term every layer of this forward consumes: the untied factors multiplied out when
        ``fold_untied``, a bias of the offset kept as its rows when ``offset_bias_as_rows`` (else expanded
        into the dense bias), the mask with key padding built once, or with ``padding_as_lengths`` the bias
        alone and the rows' lengths (the attention plan's choices).

        ``key_padding_mask`` is (B, T), True at padding (right padding); ``dtype`` the dtype of the
        hidden states.
        """
        term = self.content_free(seq_len)
        if not torch.is_grad_enabled():  # no backward will hand a gradient's storage on: let the kept one go
            self.product_memory.release()
        if fold_untied:
            term = term.folded(self.product_memory)
        if not offset_bias_as_rows:
            term = term.expanded()
        if padding_as_lengths:
            lengths = None if key_padding_mask is None else (~key_padding_mask).sum(1)
            return replace(term, attn_mask=term.attention_mask(None, dtype), key_lengths=lengths)
        return replace(term, attn_mask=term.attention_mask(key_padding_mask, dtype))

    def content_free(self, seq_len):
        """The unfolded term for positions 0..seq_len-1, no mask (for :meth:`build` and the analysis)."""
        term = PositionalTerm(scale=self.config.scale)
        for encoding in self.encodings():
            encoding.contribute(term, seq_len)
        return term
