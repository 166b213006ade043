"""Run the path an :class:`~.paths.AttentionPlan` chose: SDPA, the CPU kernels, the Triton kernel,
FlexAttention, cuDNN's graph or the explicit matmul-softmax-matmul, and the masks they take.

The explicit path is the plain step-by-step form of ``softmax(scale q k^T + mask) v`` (with Shaw value
vectors, Wang et al., "On Position Embeddings in BERT", ICLR 2021, Eq. 4), and the twin the kernels are
tested against.
"""

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from .clipped_distances import distance_sums
from .cpu_kernels import BiasedFlashAttention, ChunkedAttention
from .cudnn_graph_attention import cudnn_biased_attention
from .dropout import keep_mask, keep_probability
from .flex_bias_attention import flex_biased_attention
from .offset_rows import edges
from .paths import OFFSET_ROWS_PATHS, RELATIVE_OFFSET_PATHS, AttentionPath
from .triton_bias_attention import biased_attention


def sdpa_mask(mask, dtype):
    """``mask`` as SDPA takes it with queries of ``dtype``: an additive float mask in that dtype (under
    autocast the mask is built in the hidden states' float32 while q is bf16/fp16, and recent cuDNN
    kernels misread a mask of another dtype, pytorch#191612), its most negative values clamped to the
    dtype's so that padding stays finite."""
    if mask is None or mask.dtype == torch.bool or mask.dtype == dtype:
        return mask
    return mask.clamp(min=torch.finfo(dtype).min).to(dtype)


def attend(path, q, k, v, mask, scale, dropout, value_table=None, value_index=None, backends=None,
           key_lengths=None, relative=None, value_offsets=None, offset_rows=None, offset_cls=None,
           mask_gradient=None, layer_logits=None):
    """Run ``path``: (output (B, H, T, d), probabilities (B, H, T, T) on the explicit path, else None).

    ``mask`` is None, a boolean keep-mask or an additive float mask (always the float mask of a
    learned dense bias on BIASED_FLASH, see :func:`choose_path`; on TRITON, FLEX and CUDNN_GRAPH the
    (1, H, T, T) bias shared by the batch, without padding, which ``key_lengths`` (B,) gives);
    ``value_table`` (2K + 1, d) and its (T, T) ``value_index`` add Shaw value vectors
    ``sum_j alpha_ij a_{clip(j-i)}`` (explicit and Triton paths: they need the probabilities; the Triton
    kernel reads the index as its (2T - 1,) row by offset, ``value_offsets``);
    ``backends`` are the SDPA kernels allowed (:func:`sdpa_backends`; None: torch chooses); ``relative``
    the Shaw key or DeBERTa terms as their table rows read by offset
    (:class:`~.relative_terms.RelativeRows`; TRITON and FLEX only, the other paths take them in the mask):
    the Triton kernel multiplies them by q and k per tile, FLEX reads their (B, H, T, R) products
    (:meth:`~.relative_terms.RelativeRows.products`). FLEX runs no attention dropout. ``offset_rows``
    (H, 2T - 1) and ``offset_cls`` (H, 2) or None: a bias of the offset j - i and its [CLS] reset
    (:mod:`.offset_rows`), added to the mask (the dense part alone, or None) by the kernels that read them,
    CHUNKED, BIASED_FLASH, TRITON and FLEX (the plan expands it into the mask for the other paths).
    ``mask_gradient``: CHUNKED and BIASED_FLASH add the float mask's gradient to this
    :class:`~.shared_mask_gradient.SharedMaskGradient` (the mask being its
    :func:`~.shared_mask_gradient.gather_mask_gradient`'s) rather than returning it. ``layer_logits``: what
    the layer's own terms add to its scaled logits, a function of them (EXPLICIT only,
    :class:`~tupe_plugin.terms.parts.LayerTerm`).
    """
    if path is AttentionPath.EXPLICIT:
        return explicit_attention(q, k, v, mask, scale, dropout, value_table, value_index, layer_logits)
    if layer_logits is not None:
        raise ValueError("a term a layer computes from its own logits is read by the explicit path only: "
                         "choose_path gives EXPLICIT")
    if value_table is not None and path is not AttentionPath.TRITON:
        raise ValueError("Shaw value vectors need the probabilities: choose_path gives EXPLICIT or TRITON")
    if relative is not None and path not in RELATIVE_OFFSET_PATHS:
        raise ValueError("relative table rows are read by the Triton kernel and FlexAttention only: the "
                         "other paths take their terms gathered into the mask")
    if offset_rows is not None and path not in OFFSET_ROWS_PATHS:
        raise ValueError("the rows of a bias of the offset are read by the CPU kernels, the Triton kernel "
                         "and FlexAttention only: the other paths take it expanded into the mask "
                         "(PositionalTerm.expanded)")
    if path is AttentionPath.TRITON:
        return biased_attention(q, k, v, mask, key_lengths, scale, dropout, relative=relative,
                                value_table=value_table, value_offsets=value_offsets, bias_rows=offset_rows,
                                cls=offset_cls), None
    if path is AttentionPath.FLEX:
        if dropout > 0:
            raise ValueError(f"--attention-backend flex runs no attention dropout (FlexAttention has none), "
                             f"got {dropout}: pass --attention-dropout 0")
        products = None if relative is None else relative.products(q, k, scale)
        return flex_biased_attention(q, k, v, mask, key_lengths, scale, products, bias_rows=offset_rows,
                                     cls=offset_cls), None
    offset = () if offset_rows is None else \
        (offset_rows, *((None, None) if offset_cls is None else edges(offset_rows, offset_cls)))
    if path is AttentionPath.BIASED_FLASH:
        offset = offset or (None, None, None)
        return BiasedFlashAttention.apply(q, k, v, mask, scale, *offset, mask_gradient), None
    if path is AttentionPath.CHUNKED:
        offset = offset or (None, None, None)
        return ChunkedAttention.apply(q, k, v, mask, scale, dropout, *offset, mask_gradient), None
    if path is AttentionPath.CUDNN_GRAPH:
        return cudnn_biased_attention(q, k, v, mask, key_lengths, scale, dropout), None
    with sdpa_kernel(list(backends)) if backends else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask(mask, q.dtype), dropout_p=dropout,
                                             scale=scale)
    return out, None


def explicit_attention(q, k, v, mask, scale, dropout, value_table=None, value_index=None, layer_logits=None):
    """softmax(scale q k^T + mask) v step by step, with the probabilities (and Shaw value vectors);
    attention dropout with :func:`~.dropout.keep_mask`; ``layer_logits(logits)``: what the layer's own
    terms add to its scaled logits (B, H, T, T), computed from them before the mask is added."""
    # float32 logits before the mask is added: a float32 mask's padding value (its most negative
    # number) would round to -inf in bf16 and turn an all-padded row into NaN.
    logits = torch.matmul(q * scale, k.transpose(-1, -2))
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if layer_logits is not None:
        logits = logits + layer_logits(logits)
    if mask is not None:
        add_mask_(logits, mask)
    probs = torch.softmax(logits, dim=-1).to(q.dtype)
    dropped = probs if dropout == 0 else probs * keep_mask(probs.shape, dropout, probs.device)
    out = torch.matmul(dropped, v)
    if value_table is not None:
        # each clipped distance sums up to T - K probabilities: in float32, since in bf16 (fp16) every
        # addition to a sum near 1 drops what lies below 2^-8 (2^-11), most of a probability of ~1/T
        per_distance = distance_sums(dropped, value_index, (value_table.size(0) - 1) // 2).to(probs.dtype)
        shaw = torch.matmul(per_distance, value_table.to(probs.dtype))
        out = out + F.pad(shaw, (0, out.size(-1) - shaw.size(-1)))
    if dropout > 0:  # the kept probabilities' scale, applied to the (B, H, T, d) output: linear in them
        out = out * (1.0 / keep_probability(dropout, probs.device.type))
    return out, probs


def add_mask_(logits, mask):
    """Add an attention mask (boolean keep-mask or additive float) to fresh logits, in place."""
    if mask.dtype == torch.bool:
        return logits.masked_fill_(~mask, torch.finfo(logits.dtype).min)
    return logits.add_(mask)


def add_bias(mask, bias):
    """Combine an attention mask (None, boolean keep-mask, or additive float) with a fresh float bias
    (B, H, T, T), in place where the sum keeps the bias's dtype (one pass fewer); a float32 mask joins a
    bf16/fp16 bias out of place, so that its padding value does not round to -inf."""
    if mask is None:
        return bias
    if mask.dtype == torch.bool or torch.promote_types(bias.dtype, mask.dtype) == bias.dtype:
        return add_mask_(bias, mask)
    return bias + mask
