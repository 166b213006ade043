"""Attention with a learned bias shared by the batch, the relative products read by offset and key padding by
lengths, on PyTorch's FlexAttention (``torch.nn.attention.flex_attention``), without attention dropout.

``out = softmax(scale * q k^T + bias + distance + relative + padding) v`` for q, k, v (B, H, T, D), as the
Triton kernel of :mod:`.triton_bias_attention` computes it without dropout: one bias (H, T, T) for the whole
batch (the shared term of TUPE Eq. 7-11, Ke, He, Liu, "Rethinking Positional Encoding in Language
Pre-training", arXiv 2006.15595); a bias of the offset alone as its Toeplitz rows (H, 2T - 1), read by
j - i, with TUPE's [CLS] reset as two values per head (H, 2) in their place on query row 0 and key column 0
(Eq. 9-11); the content-dependent terms of Shaw keys and DeBERTa's c2p and p2c as their (B, H, T, R)
products with the table rows (:class:`~.relative_terms.RelativeProducts`: the pair (i, j) reads the row its
offset j - i names); and the keys of row b past ``key_lengths[b]`` masked (right padding). All of them are
added to each logit by the ``score_mod`` (Dong, Feng, Guessous, Liang, He, "Flex Attention: A Programming
Model for Generating Optimized Attention Kernels", arXiv 2412.05496) from tensors it captures, so no
(B, H, T, T) term is built; on CUDA the compiled backward returns the captured bias's gradient summed over
the batch, the Toeplitz rows' and the [CLS] values' (summed by offset) and the products' gradients. The
padding is masked in the score_mod, keys only, as the Triton kernel masks it: padded query rows attend to
their row's keys, and a padded key's logit is the Triton kernel's finite MASKED number rather than -inf, so
that a row whose keys are all padding would get the explicit path's uniform probabilities, not
FlexAttention's zeros (the encoder refuses such rows before either). No block mask: every tile is computed,
where the Triton kernel stops at the row's length. FlexAttention draws no attention dropout
(``--attention-backend flex`` refuses it at model build, :func:`~.paths.backend_problem`).

On CUDA the call is compiled by ``torch.compile`` once per process, lazily, with torch's default
automatic dynamic shapes: the first batch compiles kernels for its (B, T) (a run of fixed length keeps
them), a batch of another shape compiles once more with those dimensions symbolic, after which no length
recompiles; ``dynamic=False`` would compile again for every new T of fairseq's batches and fall back to the
unfused form past dynamo's recompile limit. The score_mod is built inside the compiled function, so the
tensors it captures are graph inputs, not guards. Elsewhere FlexAttention runs eagerly (tests,
evaluation): its unfused form materialises the (B, H, T, T) scores, and it has no backward on CPU, which
this module refuses with the flag's name. The step-by-step twin is :func:`~.attend.explicit_attention`
(tests) with the products gathered into the mask; the plan of :mod:`.paths` runs this module for
``--attention-backend flex``.
"""

import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention

from .relative_terms import RelativeProducts, distance_bias_inputs

# A padded key's logit, the Triton kernel's: finite, so that a row of padded keys stays a number.
MASKED = -1.0e30
# The warning FlexAttention gives for every uncompiled call (the unfused form is what CPU runs here).
UNCOMPILED_WARNING = "flex_attention called without torch.compile"


def scored_attention(q, k, v, bias, key_lengths, query_products, query_offsets, key_products, key_offsets,
                     scale, bias_rows=None, cls=None):
    """FlexAttention with the score_mod that adds ``bias`` (H, T, T) (or None), the distance bias's rows
    ``bias_rows`` (H, 2T - 1) by offset and its [CLS] values ``cls`` (H, 2) in their place (or None), the
    relative products by offset (or None) and masks keys past ``key_lengths`` (B,)."""
    seq_len = q.size(-2)

    def score_mod(score, b, h, i, j):
        if bias is not None:
            score = score + bias[h, i, j]
        if bias_rows is not None or cls is not None:
            distance = torch.zeros_like(score) if bias_rows is None else bias_rows[h, j - i + seq_len - 1]
            if cls is not None:
                distance = torch.where(i == 0, cls[h, 0], torch.where(j == 0, cls[h, 1], distance))
            score = score + distance
        if query_products is not None:
            score = score + query_products[b, h, i, query_offsets[j - i + seq_len - 1]]
        if key_products is not None:
            score = score + key_products[b, h, j, key_offsets[j - i + seq_len - 1]]
        return torch.where(j < key_lengths[b], score, MASKED)

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)


_compiled_attention = None


def compiled_attention():
    """:func:`scored_attention` compiled by ``torch.compile``, once per process (see the module docstring)."""
    global _compiled_attention
    if _compiled_attention is None:
        _compiled_attention = torch.compile(scored_attention)
    return _compiled_attention


def flex_biased_attention(q, k, v, bias=None, key_lengths=None, scale=None, relative=None, bias_rows=None,
                          cls=None):
    """``softmax(scale q k^T + bias + distance + relative + padding) v`` (B, H, T, D) on FlexAttention:
    ``bias`` the (1, H, T, T) or (H, T, T) bias shared by the batch (or None), ``key_lengths`` (B,) the
    unpadded length of each row (or None), ``relative`` the :class:`~.relative_terms.RelativeProducts` read
    by offset (or None); ``bias_rows`` (H, 2T - 1) a bias of the offset alone shared by the batch,
    ``bias_rows[h, j - i + T - 1]`` for query i and key j, and ``cls`` (H, 2) the [CLS] reset in its place,
    ``cls[h, 0]`` on query row 0 and ``cls[h, 1]`` on key column 0 of the other rows (each or both None),
    added to ``bias`` (:func:`~.relative_terms.distance_bias_inputs`)."""
    batch, heads, seq_len, head_dim = q.shape
    relative = relative or RelativeProducts()
    bias_rows, cls = distance_bias_inputs(bias_rows, cls, heads, seq_len)
    inputs = (q, k, v, bias, relative.query, relative.key, bias_rows, cls)
    # under no_grad a parameter handed as it is (the [CLS] reset's thetas) still says requires_grad
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                                  for t in inputs):
        raise RuntimeError(
            "--attention-backend flex trains on CUDA only: FlexAttention has no backward on CPU in torch "
            f"{torch.__version__}; on CPU run it under torch.no_grad() (evaluation), or use "
            "--attention-backend auto")
    scale = head_dim ** -0.5 if scale is None else scale
    dense_bias = None if bias is None else bias.reshape(heads, seq_len, seq_len)
    if key_lengths is None:
        key_lengths = torch.full((batch,), seq_len, dtype=torch.int64, device=q.device)
    arguments = (q, k, v, dense_bias, key_lengths.to(q.device), relative.query, relative.query_offsets,
                 relative.key, relative.key_offsets, scale, bias_rows, cls)
    if q.device.type == "cuda":
        return compiled_attention()(*arguments)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=UNCOMPILED_WARNING, category=UserWarning)
        return scored_attention(*arguments)
