"""Flash attention with a learned bias shared by the batch, its batch-summed gradient, key padding by
lengths and attention dropout, in Triton (a GPU kernel; its logic runs on CPU through Triton's interpreter).

``out = dropout(softmax(scale * q k^T + bias + padding)) v`` for q, k, v (B, H, T, D), one bias (H, T, T) for
the whole batch (the shared term of TUPE Eq. 7-11, Ke, He, Liu, "Rethinking Positional Encoding in Language
Pre-training", arXiv 2006.15595, or any learned bias of the offset) and the keys of row b past
``key_lengths[b]`` masked (right padding): the padding stays apart from the bias, so no (B, H, T, T) mask
is ever built. The forward walks the keys block by block with an online softmax (Dao et al.,
"FlashAttention", arXiv 2205.14135) and keeps the rows' log-sum-exp; the backward recomputes the
probabilities per (key block, query block) tile, as FlashAttention-2 does (Dao, arXiv 2307.08691): dk and dv
accumulated by the key block's program, dq and the bias gradient dS added atomically in float32 — the
bias gradient summed over the batch in place, never materialised per row. Attention dropout draws its
keep-mask from Philox (``tl.rand``) at the same (row, query, key) offsets in both passes, one stream per
(batch row, head). The terms that depend on the content, Shaw keys and DeBERTa's c2p and p2c, come as
their small (B, H, T, R) products with the R table rows (:class:`RelativeProducts`): each logit adds the
entry its pair's table row names by the offset j - i, so no (B, H, T, T) term is gathered, and the backward
adds dS onto those entries atomically (a tile whose pairs all read one row by its row sums). Shaw value
vectors (the same papers' ``out_i += sum_j P~_ij a_{clip(j-i)}``, P~ the dropped probabilities rescaled by
1 / (1 - p)) need the probabilities, never materialised: the forward kernel sums them by the pair's table
row into S (B, H, T, 2K + 1) in float32 (the two clipped ends during the online softmax, the band
|j - i| < K recomputed from the log-sum-exp after it), and the output gains S a, a small matmul outside the
kernel. Backward: the table's gradient is sum_{b,h,i} S^T dO; the kernel adds dO_i . a_{r(i,j)} to each
probability's gradient from (dO a^T) (B, H, T, 2K + 1), read by the offset as the query-side products are,
and its rowsum(dO * O) takes the whole output, the value term included. The step-by-step twin is
:func:`~.attend.explicit_attention` (tests) with the products gathered into the mask; the plan of
:mod:`.paths` runs this kernel for ``--attention-backend triton``.
"""

import os
from dataclasses import dataclass
from typing import Optional

import torch

# Triton runs on a GPU, or on CPU with this variable at 1 (its interpreter: the tests).
INTERPRET = "TRITON_INTERPRET"


def _blocks(seq_len, head_dim):
    """(BLOCK_M, BLOCK_N, BLOCK_D): 64-row tiles, smaller for short inputs (at least 16, what ``tl.dot``
    takes), the head dimension padded to a power of two."""
    block = max(16, min(64, 1 << (seq_len - 1).bit_length()))
    return block, block, max(16, 1 << (head_dim - 1).bit_length())


def _precision(dtype):
    """float32 inputs multiply in full precision (the tests' fp32 twins); bf16 / fp16 as the tensor cores
    do."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _lengths(key_lengths, device):
    """The rows' lengths as the kernels read them (int32; one unread zero without padding)."""
    return torch.zeros(1, dtype=torch.int32, device=device) if key_lengths is None else \
        key_lengths.to(device=device, dtype=torch.int32).contiguous()


@dataclass(frozen=True)
class RelativeProducts:
    """The content-dependent relative terms, as the kernel reads them: ``query`` (B, H, T, R_q), scale q_i
    against every row of a table, and ``key`` (B, H, T, R_k), scale k_j against every row of another (each
    or both None); the pair (query i, key j) adds ``query[..., i, query_offsets[j - i + T - 1]]`` and
    ``key[..., j, key_offsets[j - i + T - 1]]`` to its logit (the offsets (2T - 1,) of
    :func:`offsets_of`). Shaw keys (Shaw, Uszkoreit, Vaswani, arXiv 1803.02155; Wang et al., "On Position
    Embeddings in BERT", Eq. 4): ``query`` = scale q a^T over the 2K + 1 rows, by clip(j - i); DeBERTa
    (He et al., arXiv 2006.03654, Eq. 4, in the released form, docs/deberta.md): ``query`` against K^r by
    delta(i, j) (c2p), ``key`` against Q^r by the p2c row of the pair."""

    query: Optional[torch.Tensor] = None
    query_offsets: Optional[torch.Tensor] = None
    key: Optional[torch.Tensor] = None
    key_offsets: Optional[torch.Tensor] = None


def offsets_of(index):
    """The (2T - 1,) row by offset of a (T, T) ``index`` that depends on j - i alone: ``index[i, j]`` at
    ``j - i + T - 1``."""
    return torch.cat([index[:, 0].flip(0), index[0, 1:]])


def band_half_width(offsets):
    """The smallest W >= 1 such that every offset d >= W reads the last entry of ``offsets`` (2T - 1,) (the
    row of the farthest key after the query) and every d <= -W the first: for Shaw's clip(j - i, -K, K) + K,
    K (T - 1 where T <= K). A (1,) int32 tensor on the offsets' device, computed there (no
    synchronisation)."""
    seq_len = (offsets.numel() + 1) // 2
    distances = torch.arange(1, seq_len + 1, device=offsets.device)
    differs = (offsets[seq_len - 1:] != offsets[-1]) | (offsets[:seq_len].flip(0) != offsets[0])
    return (differs * distances).amax().clamp(min=1).to(torch.int32).reshape(1)


def _product_rows(products, offsets, device):
    """A relative product with a last stride of 1 and its offsets as int32, or placeholders (unread)."""
    if products is None:
        return None, torch.zeros(1, dtype=torch.int32, device=device)
    products = products if products.stride(-1) == 1 else products.contiguous()
    return products, offsets.to(device=device, dtype=torch.int32).contiguous()


class TritonBiasedAttention(torch.autograd.Function):
    """See the module docstring; ``bias`` (H, T, T) or None, ``key_lengths`` (B,) or None, the relative
    products and offsets of :class:`RelativeProducts` (or None), Shaw's value table and its offsets (or
    None)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, key_lengths, scale, dropout, seed, query_products=None,
                query_offsets=None, key_products=None, key_offsets=None, value_table=None,
                value_offsets=None):
        from .triton_bias_kernels import forward_kernel

        batch, heads, seq_len, head_dim = q.shape
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        bias_rows = None if bias is None else bias.reshape(heads, seq_len, seq_len)
        if bias_rows is not None and bias_rows.stride(-1) != 1:
            bias_rows = bias_rows.contiguous()
        query_products, query_offsets = _product_rows(query_products, query_offsets, q.device)
        key_products, key_offsets = _product_rows(key_products, key_offsets, q.device)
        out = torch.empty_like(q)
        lse = torch.empty(batch, heads, seq_len, dtype=torch.float32, device=q.device)
        value_sums, value_offsets, band = _value_rows(value_table, value_offsets, q)
        lengths = _lengths(key_lengths, q.device)
        block_m, block_n, block_d = _blocks(seq_len, head_dim)
        forward_kernel[(-(-seq_len // block_m), batch * heads)](
            q, k, v, _or(bias_rows, lse), lengths, out, lse, _or(query_products, lse), query_offsets,
            _or(key_products, lse), key_offsets, _or(value_sums, lse), value_offsets, band,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *_strides(bias_rows, 2),
            *_strides(query_products, 3), *_strides(key_products, 3), _width(value_sums), heads, seq_len,
            head_dim, scale, dropout, seed, HAS_BIAS=bias_rows is not None,
            HAS_LENGTHS=key_lengths is not None, HAS_DROPOUT=dropout > 0, HAS_QREL=query_products is not None,
            HAS_KREL=key_products is not None, HAS_VALUES=value_sums is not None,
            PRECISION=_precision(q.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d)
        if value_sums is not None:
            out[..., :value_table.size(-1)] += torch.matmul(value_sums, value_table.float()).to(out.dtype)
        ctx.save_for_backward(q, k, v, bias_rows, lengths, out, lse, query_products, query_offsets,
                              key_products, key_offsets, value_table, value_offsets, value_sums)
        ctx.scale, ctx.dropout, ctx.seed = scale, dropout, seed
        ctx.has_lengths, ctx.bias_shape = key_lengths is not None, None if bias is None else bias.shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from .triton_bias_kernels import backward_kernel

        (q, k, v, bias_rows, lengths, out, lse, query_products, query_offsets, key_products, key_offsets,
         value_table, value_offsets, value_sums) = ctx.saved_tensors
        batch, heads, seq_len, head_dim = q.shape
        grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
        delta = (grad_out.float() * out.float()).sum(-1)
        # dO_i . a_r for every value-table row r, read by the pairs' offsets in the kernel
        grad_out_values = None if value_table is None else grad_out[..., :value_table.size(-1)].float()
        value_grads = None if value_table is None else torch.matmul(grad_out_values, value_table.float().t())
        grad_q = torch.zeros(batch, heads, seq_len, head_dim, dtype=torch.float32, device=q.device)
        grad_k = torch.empty(batch, heads, seq_len, head_dim, dtype=torch.float32, device=q.device)
        grad_v = torch.empty_like(grad_k)
        bias_grad = bias_rows is not None and ctx.needs_input_grad[3]
        grad_bias = torch.zeros(heads, seq_len, seq_len, dtype=torch.float32, device=q.device) if bias_grad \
            else lse
        grad_query_products, grad_key_products = (
            None if products is None else torch.zeros(products.shape, dtype=torch.float32, device=q.device)
            for products in (query_products, key_products))
        block_m, block_n, block_d = _blocks(seq_len, head_dim)
        backward_kernel[(-(-seq_len // block_n), batch * heads)](
            q, k, v, _or(bias_rows, lse), lengths, grad_out, lse, delta, grad_q, grad_k, grad_v, grad_bias,
            _or(query_products, lse), query_offsets, _or(key_products, lse), key_offsets,
            _or(grad_query_products, lse), _or(grad_key_products, lse), _or(value_grads, lse), value_offsets,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3],
            *_strides(bias_rows, 2), *_strides(query_products, 3), *_strides(key_products, 3),
            _width(query_products), _width(key_products), _width(value_grads), heads, seq_len, head_dim,
            ctx.scale, ctx.dropout, ctx.seed, HAS_BIAS=bias_rows is not None, BIAS_GRAD=bias_grad,
            HAS_LENGTHS=ctx.has_lengths, HAS_DROPOUT=ctx.dropout > 0, HAS_QREL=query_products is not None,
            HAS_KREL=key_products is not None, HAS_VALUES=value_table is not None,
            PRECISION=_precision(q.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d)
        grads = (grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype))
        grad_bias = grad_bias.reshape(ctx.bias_shape).to(bias_rows.dtype) if bias_grad else None
        grad_query_products, grad_key_products = (
            None if grad is None else grad.to(products.dtype)
            for grad, products in ((grad_query_products, query_products), (grad_key_products, key_products)))
        grad_value_table = None
        if value_table is not None and ctx.needs_input_grad[12]:  # sum over b, h, i of S^T dO
            grad_value_table = torch.matmul(value_sums.reshape(-1, value_sums.size(-1)).t(),
                                            grad_out_values.reshape(-1, value_table.size(-1)))
            grad_value_table = grad_value_table.to(value_table.dtype)
        return (*grads, grad_bias, None, None, None, None, grad_query_products, None, grad_key_products, None,
                grad_value_table, None)


def _value_rows(value_table, value_offsets, q):
    """For Shaw value vectors: the (B, H, T, R) float32 zeros the kernel adds the probabilities' sums by
    table row onto, the offsets as int32 and their :func:`band_half_width`; else placeholders (unread)."""
    if value_table is None:
        placeholder = torch.zeros(1, dtype=torch.int32, device=q.device)
        return None, placeholder, placeholder
    value_offsets = value_offsets.to(device=q.device, dtype=torch.int32).contiguous()
    sums = torch.zeros(*q.shape[:3], value_table.size(0), dtype=torch.float32, device=q.device)
    return sums, value_offsets, band_half_width(value_offsets)


def _or(tensor, placeholder):
    """``tensor``, or an unread placeholder pointer for the kernel where it is None."""
    return placeholder if tensor is None else tensor


def _strides(tensor, count):
    """The first ``count`` strides of ``tensor`` (zeros where it is None)."""
    return (0,) * count if tensor is None else tensor.stride()[:count]


def _width(products):
    """The table rows of a relative product (0 where there is none)."""
    return 0 if products is None else products.size(-1)


def biased_attention(q, k, v, bias=None, key_lengths=None, scale=None, dropout=0.0, seed=None, relative=None,
                     value_table=None, value_offsets=None):
    """``dropout(softmax(scale q k^T + bias + relative + padding)) v`` (B, H, T, D) on the Triton kernel:
    ``bias`` the (1, H, T, T) or (H, T, T) bias shared by the batch (or None), ``key_lengths`` (B,) the
    unpadded length of each row (or None), ``seed`` the dropout's Philox seed (drawn from torch's generator
    when None), ``relative`` the :class:`RelativeProducts` read by offset inside the kernel (or None);
    ``value_table`` (R, d_a), d_a <= D, Shaw's value vectors a_r (or None): each output gains
    ``sum_j P~_ij a_{r(i, j)}``, zero-padded to D, with the pair's row ``value_offsets[j - i + T - 1]``
    (:func:`offsets_of`)."""
    if q.device.type != "cuda" and os.environ.get(INTERPRET) != "1":
        raise RuntimeError(f"--attention-backend triton needs a CUDA device ({INTERPRET}=1 runs its kernels "
                           "on CPU, slowly, as the tests do); use --attention-backend auto on CPU")
    scale = q.size(-1) ** -0.5 if scale is None else scale
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, (), device="cpu")) if dropout > 0 else 0
    relative = relative or RelativeProducts()
    return TritonBiasedAttention.apply(q, k, v, bias, key_lengths, scale, dropout, seed, relative.query,
                                       relative.query_offsets, relative.key, relative.key_offsets,
                                       value_table, value_offsets)


def keep_mask(shape, dropout, seed, device="cpu"):
    """The (B, H, T, T) keep-mask the kernel draws for ``seed`` (Philox at the kernel's offsets, one stream
    per batch row and head): what the tests need to give the twin the kernel's dropout."""
    from .triton_bias_kernels import keep_mask_kernel

    batch, heads, seq_len, _ = shape
    out = torch.empty(batch, heads, seq_len, seq_len, dtype=torch.int8, device=device)
    keep_mask_kernel[(batch * heads, seq_len)](out, seq_len, dropout, seed,
                                               BLOCK=max(16, 1 << (seq_len - 1).bit_length()))
    return out.bool()
