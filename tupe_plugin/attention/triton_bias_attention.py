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
bias gradient summed over the batch in place, never materialised per row. A bias of the offset alone (T5's
buckets, ALiBi, KERPLE, Sandwich, FIRE: a Toeplitz matrix) comes as its rows (H, 2T - 1), the pair (i, j)
reading ``rows[h, j - i + T - 1]``, and TUPE's [CLS] reset (Eq. 9-11) as two values per head (H, 2) in
their place on query row 0 and key column 0; both are added to the dense bias (or stand alone): a tile
reads the window of BLOCK_M + BLOCK_N - 1 consecutive values its offsets span, and the backward sums the
tile's dS along its diagonals (gathered by offset into (BLOCK_M, BLOCK_M + BLOCK_N), summed over the
rows), adding one value per offset onto a float32 (B, H, 2T - 1) buffer by batch row (the [CLS] values'
two sums onto (B, H, 2)) that is summed over the batch after the kernel: no (H, T, T) tensor for them,
forward or backward. Attention dropout draws its
keep-mask from Philox (``tl.rand``) at the same (row, query, key) offsets in both passes, one stream per
(batch row, head). The terms that depend on the content, Shaw keys and DeBERTa's c2p and p2c, come as the
table rows themselves (:class:`~.relative_terms.RelativeRows`, (H or 1, R, d)), the pair (i, j) reading the
row its offset j - i names: a tile of BLOCK_M queries and BLOCK_N keys spans BLOCK_M + BLOCK_N - 1
consecutive offsets, so the kernel loads the rows of that window of offsets, multiplies q by them
(BLOCK_M, BLOCK_M + BLOCK_N) (the key side: them by k) and each pair takes its entry (``tl.gather`` by
j - i); a tile whose offsets all name one row (past Shaw's clipped distance) multiplies q by that row alone.
Any index of the offset alone works, monotone or not. No (B, H, T, R) product is kept for the backward:
it reforms the window, gathers dS by offset into D (BLOCK_M, window), adds D times the rows to dq and adds
D^T q onto a float32 gradient by batch row, head and offset (B, H, 2T - 1, d), one per batch row so that
only the key blocks of one (batch row, head) contend for an entry (at base size, B = 64, H = 12, T = 512,
d = 64: 0.2 GB per side, for the backward only); summed over the batch outside the kernel, each offset is
added onto its row, and the table's projections get their gradients by autograd. Shaw value
vectors (the same papers' ``out_i += sum_j P~_ij a_{clip(j-i)}``, P~ the dropped probabilities rescaled by
1 / (1 - p)) need the probabilities, never materialised: the forward kernel sums them by the pair's table
row into S (B, H, T, 2K + 1) in float32 (the two clipped ends during the online softmax, the band
|j - i| < K recomputed from the log-sum-exp after it), and the output gains S a, a small matmul outside the
kernel. Backward: the table's gradient is sum_{b,h,i} S^T dO; the kernel adds dO_i . a_{r(i,j)} to each
probability's gradient from (dO a^T) (B, H, T, 2K + 1), read by the offset, and its rowsum(dO * O) takes
the whole output, the value term included. The step-by-step twin is :func:`~.attend.explicit_attention`
(tests) with the relative terms gathered into the mask; the plan of :mod:`.paths` runs this kernel for
``--attention-backend triton``.
"""

import os

import torch

from .relative_terms import RelativeRows, distance_bias_inputs

# Triton runs on a GPU, or on CPU with this variable at 1 (its interpreter: the tests).
INTERPRET = "TRITON_INTERPRET"


def _blocks(seq_len, head_dim, by_offset=False):
    """(BLOCK_M, BLOCK_N, BLOCK_D): 64-row tiles, 32-row ones where a tile works on the window of its
    offsets (``by_offset``): with relative table rows (the window doubles a tile's products: at 64 rows and
    d_h = 64 ptxas spills kilobytes of registers for sm_90, at 32 none but about 200 bytes in the backward
    of both sides, which runs 8 warps) and in the backward that sums dS by offset for the distance rows'
    gradient (a (BLOCK_M, BLOCK_M + BLOCK_N) gather: in bf16 at d_h = 64, 1.3 kB of spills at 64 rows and
    4 warps, 0.4 kB at 8, none to 32 bytes at 32 rows and 8 warps); chosen by register use, not timed;
    smaller for short inputs (at least 16, what ``tl.dot`` takes), the head dimension padded to a power of
    two."""
    block = max(16, min(32 if by_offset else 64, 1 << (seq_len - 1).bit_length()))
    return block, block, max(16, 1 << (head_dim - 1).bit_length())


def _precision(dtype):
    """float32 inputs multiply in full precision (the tests' fp32 twins); bf16 / fp16 as the tensor cores
    do."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _lengths(key_lengths, device):
    """The rows' lengths as the kernels read them (int32; one unread zero without padding)."""
    return torch.zeros(1, dtype=torch.int32, device=device) if key_lengths is None else \
        key_lengths.to(device=device, dtype=torch.int32).contiguous()


def band_half_width(offsets):
    """The smallest W >= 1 such that every offset d >= W reads the last entry of ``offsets`` (2T - 1,) (the
    row of the farthest key after the query) and every d <= -W the first: for Shaw's clip(j - i, -K, K) + K,
    K (T - 1 where T <= K). A (1,) int32 tensor on the offsets' device, computed there (no
    synchronisation)."""
    seq_len = (offsets.numel() + 1) // 2
    distances = torch.arange(1, seq_len + 1, device=offsets.device)
    differs = (offsets[seq_len - 1:] != offsets[-1]) | (offsets[:seq_len].flip(0) != offsets[0])
    return (differs * distances).amax().clamp(min=1).to(torch.int32).reshape(1)


def _table_rows(rows, offsets, q):
    """Relative table rows as the kernels read them: in q's dtype, (H, R, d) (a table shared by the heads
    repeated by a zero stride), a last stride of 1, with their offsets as int32; or placeholders (unread)."""
    if rows is None:
        return None, torch.zeros(1, dtype=torch.int32, device=q.device)
    heads, seq_len, head_dim = q.shape[1:]
    if rows.dim() != 3 or rows.size(0) not in (1, heads) or rows.size(-1) > head_dim:
        raise ValueError(f"relative table rows must be (1 or H = {heads}, R, d) with d at most the head "
                         f"dimension {head_dim}, got {tuple(rows.shape)}")
    if offsets is None or offsets.shape != (2 * seq_len - 1,):
        got = None if offsets is None else tuple(offsets.shape)
        raise ValueError(f"relative offsets must be (2T - 1,) = ({2 * seq_len - 1},) for T = {seq_len} (one "
                         f"table row per offset j - i), got {got}")
    rows = rows.to(q.dtype).expand(heads, -1, -1)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    return rows, offsets.to(device=q.device, dtype=torch.int32).contiguous()


def _rows_gradient(by_offset, offsets, shape, dtype):
    """The gradient of table rows of ``shape`` (H or 1, R, d) and ``dtype`` from the kernel's gradient by
    batch row, head and offset (B, H, 2T - 1, d), float32: summed over the batch (and the heads for rows they
    share), each offset added onto its row."""
    by_offset = by_offset.sum(0)
    if shape[0] == 1:
        by_offset = by_offset.sum(0, keepdim=True)
    grad = torch.zeros(shape, dtype=torch.float32, device=by_offset.device)
    return grad.index_add_(1, offsets.long(), by_offset).to(dtype)


class TritonBiasedAttention(torch.autograd.Function):
    """See the module docstring; ``bias`` (H, T, T) or None, ``key_lengths`` (B,) or None, the relative
    table rows and offsets of :class:`~.relative_terms.RelativeRows` (or None), Shaw's value table and its
    offsets (or None), the distance bias's Toeplitz rows (H, 2T - 1) and [CLS] values (H, 2) (or None)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, key_lengths, scale, dropout, seed, query_rows=None, query_offsets=None,
                key_rows=None, key_offsets=None, value_table=None, value_offsets=None, bias_rows=None,
                cls=None):
        from .triton_bias_kernels import forward_kernel

        batch, heads, seq_len, head_dim = q.shape
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        dense_bias = None if bias is None else bias.reshape(heads, seq_len, seq_len)
        if dense_bias is not None and dense_bias.stride(-1) != 1:
            dense_bias = dense_bias.contiguous()
        bias_rows, cls = distance_bias_inputs(bias_rows, cls, heads, seq_len)
        query_window, query_offsets = _table_rows(query_rows, query_offsets, q)
        key_window, key_offsets = _table_rows(key_rows, key_offsets, q)
        out = torch.empty_like(q)
        lse = torch.empty(batch, heads, seq_len, dtype=torch.float32, device=q.device)
        value_sums, value_offsets, band = _value_rows(value_table, value_offsets, q)
        lengths = _lengths(key_lengths, q.device)
        relative = query_window is not None or key_window is not None
        block_m, block_n, block_d = _blocks(seq_len, head_dim, relative)
        forward_kernel[(-(-seq_len // block_m), batch * heads)](
            q, k, v, _or(dense_bias, lse), _or(bias_rows, lse), _or(cls, lse), lengths, out, lse,
            _or(query_window, lse), query_offsets, _or(key_window, lse), key_offsets, _or(value_sums, lse),
            value_offsets, band, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            *_strides(dense_bias, 2),
            *_strides(query_window, 2), *_strides(key_window, 2), _width(query_window), _width(key_window),
            _width(value_sums), heads, seq_len, head_dim, scale, dropout, seed,
            HAS_BIAS=dense_bias is not None, HAS_ROWS=bias_rows is not None, HAS_CLS=cls is not None,
            HAS_LENGTHS=key_lengths is not None, HAS_DROPOUT=dropout > 0,
            HAS_QREL=query_window is not None, HAS_KREL=key_window is not None,
            HAS_VALUES=value_sums is not None, PRECISION=_precision(q.dtype), BLOCK_M=block_m,
            BLOCK_N=block_n, BLOCK_D=block_d)
        if value_sums is not None:
            out[..., :value_table.size(-1)] += torch.matmul(value_sums, value_table.float()).to(out.dtype)
            # kept for the table's gradient in the queries' dtype: summed in float32, each sum is one number
            # (in bf16, half the memory of float32 sums, B H T (2K + 1) a layer)
            value_sums = value_sums.to(q.dtype)
        ctx.save_for_backward(q, k, v, dense_bias, bias_rows, cls, lengths, out, lse, query_window,
                              query_offsets, key_window, key_offsets, value_table, value_offsets, value_sums)
        ctx.distance_dtypes = tuple(None if t is None else t.dtype for t in (bias_rows, cls))
        ctx.rows_shapes = tuple(None if rows is None else (rows.shape, rows.dtype)
                                for rows in (query_rows, key_rows))
        ctx.scale, ctx.dropout, ctx.seed = scale, dropout, seed
        ctx.has_lengths, ctx.bias_shape = key_lengths is not None, None if bias is None else bias.shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from .triton_bias_kernels import backward_kernel

        (q, k, v, dense_bias, bias_rows, cls, lengths, out, lse, query_window, query_offsets, key_window,
         key_offsets, value_table, value_offsets, value_sums) = ctx.saved_tensors
        batch, heads, seq_len, head_dim = q.shape
        grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
        delta = (grad_out.float() * out.float()).sum(-1)
        # dO_i . a_r for every value-table row r, read by the pairs' offsets in the kernel
        grad_out_values = None if value_table is None else grad_out[..., :value_table.size(-1)].float()
        value_grads = None if value_table is None else torch.matmul(grad_out_values, value_table.float().t())
        grad_q = torch.zeros(batch, heads, seq_len, head_dim, dtype=torch.float32, device=q.device)
        grad_k = torch.empty(batch, heads, seq_len, head_dim, dtype=torch.float32, device=q.device)
        grad_v = torch.empty_like(grad_k)
        bias_grad = dense_bias is not None and ctx.needs_input_grad[3]
        grad_bias = torch.zeros(heads, seq_len, seq_len, dtype=torch.float32, device=q.device) if bias_grad \
            else lse
        # the distance bias's gradients by batch row and head, float32: (B, H, 2T - 1), (B, H, 2)
        grad_bias_rows, grad_cls = (
            torch.zeros(batch, heads, width, dtype=torch.float32, device=q.device)
            if tensor is not None and ctx.needs_input_grad[index] else None
            for tensor, index, width in ((bias_rows, 14, 2 * seq_len - 1), (cls, 15, 2)))
        # the rows' gradients by batch row, head and offset (B, H, 2T - 1, d), float32
        grad_query_rows, grad_key_rows = (
            torch.zeros(batch, heads, 2 * seq_len - 1, window.size(-1), dtype=torch.float32, device=q.device)
            if window is not None and ctx.needs_input_grad[index] else None
            for window, index in ((query_window, 8), (key_window, 10)))
        by_offset = query_window is not None or key_window is not None or grad_bias_rows is not None
        block_m, block_n, block_d = _blocks(seq_len, head_dim, by_offset)
        backward_kernel[(-(-seq_len // block_n), batch * heads)](
            q, k, v, _or(dense_bias, lse), _or(bias_rows, lse), _or(cls, lse), lengths, grad_out, lse, delta,
            grad_q, grad_k, grad_v, grad_bias, _or(grad_bias_rows, lse), _or(grad_cls, lse),
            _or(query_window, lse), query_offsets, _or(key_window, lse), key_offsets,
            _or(grad_query_rows, lse), _or(grad_key_rows, lse), _or(value_grads, lse), value_offsets,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3],
            *_strides(dense_bias, 2), *_strides(query_window, 2), *_strides(key_window, 2),
            _width(query_window), _width(key_window), _width(value_grads), heads, seq_len, head_dim,
            ctx.scale, ctx.dropout, ctx.seed, HAS_BIAS=dense_bias is not None, BIAS_GRAD=bias_grad,
            HAS_ROWS=bias_rows is not None, HAS_CLS=cls is not None,
            BIAS_ROWS_GRAD=grad_bias_rows is not None, CLS_GRAD=grad_cls is not None,
            HAS_LENGTHS=ctx.has_lengths, HAS_DROPOUT=ctx.dropout > 0, HAS_QREL=query_window is not None,
            HAS_KREL=key_window is not None, QROWS_GRAD=grad_query_rows is not None,
            KROWS_GRAD=grad_key_rows is not None, HAS_VALUES=value_table is not None,
            PRECISION=_precision(q.dtype), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
            num_warps=8 if by_offset else 4)
        grads = (grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype))
        grad_bias = grad_bias.reshape(ctx.bias_shape).to(dense_bias.dtype) if bias_grad else None
        grad_bias_rows, grad_cls = (None if by_row is None else by_row.sum(0).to(dtype)
                                    for by_row, dtype in zip((grad_bias_rows, grad_cls), ctx.distance_dtypes))
        grad_query_rows, grad_key_rows = (
            None if by_offset is None else _rows_gradient(by_offset, offsets, *shape)
            for by_offset, offsets, shape in zip((grad_query_rows, grad_key_rows),
                                                 (query_offsets, key_offsets), ctx.rows_shapes))
        grad_value_table = None
        if value_table is not None and ctx.needs_input_grad[12]:  # sum over b, h, i of S^T dO
            sums = value_sums.reshape(-1, value_sums.size(-1))
            values = grad_out_values.reshape(-1, value_table.size(-1)).to(sums.dtype)
            grad_value_table = torch.matmul(sums.t(), values)
            grad_value_table = grad_value_table.to(value_table.dtype)
        return (*grads, grad_bias, None, None, None, None, grad_query_rows, None, grad_key_rows, None,
                grad_value_table, None, grad_bias_rows, grad_cls)


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


def _width(tensor):
    """The last dimension of relative table rows or of the value sums (0 where there are none)."""
    return 0 if tensor is None else tensor.size(-1)


def biased_attention(q, k, v, bias=None, key_lengths=None, scale=None, dropout=0.0, seed=None, relative=None,
                     value_table=None, value_offsets=None, bias_rows=None, cls=None):
    """``dropout(softmax(scale q k^T + bias + distance + relative + padding)) v`` (B, H, T, D) on the Triton
    kernel: ``bias`` the (1, H, T, T) or (H, T, T) bias shared by the batch (or None); ``bias_rows`` (H,
    2T - 1) a bias of the offset alone shared by the batch, ``bias_rows[h, j - i + T - 1]`` for query i and
    key j (or None), ``cls`` (H, 2) the [CLS] reset of TUPE Eq. 9-11 in its place, ``cls[h, 0]`` on query
    row 0 and ``cls[h, 1]`` on key column 0 of the other rows (or None), both added to ``bias``
    and given their gradients summed over the batch; ``key_lengths`` (B,) the
    unpadded length of each row (or None), ``seed`` the dropout's Philox seed (drawn from torch's generator
    when None), ``relative`` the :class:`~.relative_terms.RelativeRows` whose dot products with q and k
    the kernel forms per tile (or None); ``value_table`` (R, d_a), d_a <= D, Shaw's value vectors a_r (or
    None): each output gains ``sum_j P~_ij a_{r(i, j)}``, zero-padded to D, with the pair's row
    ``value_offsets[j - i + T - 1]`` (:func:`~.relative_terms.offsets_of`)."""
    if q.device.type != "cuda" and os.environ.get(INTERPRET) != "1":
        raise RuntimeError(f"--attention-backend triton needs a CUDA device ({INTERPRET}=1 runs its kernels "
                           "on CPU, slowly, as the tests do); use --attention-backend auto on CPU")
    scale = q.size(-1) ** -0.5 if scale is None else scale
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, (), device="cpu")) if dropout > 0 else 0
    relative = relative or RelativeRows()
    return TritonBiasedAttention.apply(q, k, v, bias, key_lengths, scale, dropout, seed, relative.query,
                                       relative.query_offsets, relative.key, relative.key_offsets,
                                       value_table, value_offsets, bias_rows, cls)


def keep_mask(shape, dropout, seed, device="cpu"):
    """The (B, H, T, T) keep-mask the kernel draws for ``seed`` (Philox at the kernel's offsets, one stream
    per batch row and head): what the tests need to give the twin the kernel's dropout."""
    from .triton_bias_kernels import keep_mask_kernel

    batch, heads, seq_len, _ = shape
    out = torch.empty(batch, heads, seq_len, seq_len, dtype=torch.int8, device=device)
    block = min(64, max(16, 1 << (seq_len - 1).bit_length()))
    keep_mask_kernel[(batch * heads, -(-seq_len // block))](out, seq_len, dropout, seed, BLOCK=block)
    return out.bool()
