"""The Triton kernels of :mod:`.triton_bias_attention` (its docstring says what they compute); imported only
where they run, so that CPU installs never need Triton."""

import triton
import triton.language as tl

# A masked logit: finite, so that a row whose keys are all masked stays a number (uniform probabilities,
# as an additive mask of the dtype's most negative value gives), far below any real logit.
MASKED = tl.constexpr(-1.0e30)


@triton.jit
def forward_kernel(Q, K, V, Bias, Lengths, Out, Lse, QRel, QOff, KRel, KOff, ValueSums, VOff, Band,
                   sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                   so_b, so_h, so_t, sb_h, sb_i, sqr_b, sqr_h, sqr_t, skr_b, skr_h, skr_t, v_width,
                   heads, seq_len, head_dim, scale, dropout, seed,
                   HAS_BIAS: tl.constexpr, HAS_LENGTHS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   HAS_QREL: tl.constexpr, HAS_KREL: tl.constexpr, HAS_VALUES: tl.constexpr,
                   PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """One block of query rows of one (batch row, head): the output and the rows' log-sum-exp; with
    ``HAS_VALUES``, also the rows' sums of their (dropped, rescaled) probabilities by the row of the value
    table each pair reads (``VOff``), added onto ``ValueSums`` (B, H, T, ``v_width``, float32, zeros).

    The sums need the normalised probabilities, known once the online softmax has ended. The pairs at an
    offset ``|j - i| >= Band`` read one of the table's two end rows (``VOff``'s first, last entry: the
    clipped distances of Shaw's table): their sums run in the main loop as two (BLOCK_M,) sums, rescaled
    with the running maximum as ``acc`` is. The pairs of the band ``|j - i| < Band`` are recomputed
    afterwards (:func:`add_band_sums`), probabilities by the log-sum-exp: the extra cost is the
    logits of ``(BLOCK_M + 2 Band - 2) / BLOCK_N`` key blocks (rounded up) per block of query rows (with
    Shaw's K = 64 and 64-row blocks, 3 beside the main loop's T / 64) and their atomic additions."""
    row_block, batch_head = tl.program_id(0), tl.program_id(1)
    b, h = batch_head // heads, batch_head % heads
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok, dim_ok = rows < seq_len, dims < head_dim
    q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    length = tl.load(Lengths + b) if HAS_LENGTHS else seq_len
    row_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    row_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    if HAS_VALUES:
        band = tl.load(Band)
        far_before = tl.zeros((BLOCK_M,), tl.float32)
        far_after = tl.zeros((BLOCK_M,), tl.float32)
    for start in range(0, length, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < seq_len
        k = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_t + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        v = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_t + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        logits, _, _, _ = tile_logits(
            q, k, Bias, QRel, QOff, KRel, KOff, b, h, rows, cols, row_ok, col_ok, length, seq_len, scale,
            sb_h, sb_i, sqr_b, sqr_h, sqr_t, skr_b, skr_h, skr_t, HAS_BIAS, HAS_QREL, HAS_KREL, PRECISION)
        new_max = tl.maximum(row_max, tl.max(logits, 1))
        probs = tl.exp(logits - new_max[:, None])
        rescale = tl.exp(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        if HAS_DROPOUT:
            keep = tl.rand(seed + batch_head, rows[:, None] * seq_len + cols[None, :]) >= dropout
            probs = tl.where(keep, probs, 0.0)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
        if HAS_VALUES:
            offsets = cols[None, :] - rows[:, None]
            far_before = far_before * rescale + tl.sum(tl.where(offsets <= -band, probs, 0.0), 1)
            far_after = far_after * rescale + tl.sum(tl.where(offsets >= band, probs, 0.0), 1)
        row_max = new_max
    out = acc / row_sum[:, None]
    if HAS_DROPOUT:
        out = out / (1.0 - dropout)
    lse = row_max + tl.log(row_sum)
    tl.store(Out + b * so_b + h * so_h + rows[:, None] * so_t + dims[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(Lse + batch_head * seq_len + rows, lse, mask=row_ok)
    if HAS_VALUES:
        kept_scale = 1.0 / (1.0 - dropout) if HAS_DROPOUT else 1.0
        sums = ValueSums + batch_head * seq_len * v_width + rows * v_width
        tl.atomic_add(sums + tl.load(VOff), far_before * (kept_scale / row_sum), mask=row_ok)
        tl.atomic_add(sums + tl.load(VOff + 2 * seq_len - 2), far_after * (kept_scale / row_sum), mask=row_ok)
        add_band_sums(q, K, Bias, QRel, QOff, KRel, KOff, sums, VOff, band, b, h, batch_head, rows, row_ok,
                      dims, dim_ok, lse, length, seq_len, scale, dropout, kept_scale, seed, sk_b, sk_h, sk_t,
                      sb_h, sb_i, sqr_b, sqr_h, sqr_t, skr_b, skr_h, skr_t, HAS_BIAS, HAS_DROPOUT,
                      HAS_QREL, HAS_KREL, PRECISION, BLOCK_M, BLOCK_N)


@triton.jit
def add_band_sums(q, K, Bias, QRel, QOff, KRel, KOff, sums, VOff, band, b, h, batch_head, rows, row_ok, dims,
                  dim_ok, lse, length, seq_len, scale, dropout, kept_scale, seed, sk_b, sk_h, sk_t,
                  sb_h, sb_i, sqr_b, sqr_h, sqr_t, skr_b, skr_h, skr_t, HAS_BIAS: tl.constexpr,
                  HAS_DROPOUT: tl.constexpr, HAS_QREL: tl.constexpr, HAS_KREL: tl.constexpr,
                  PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Add the (dropped, rescaled) probabilities of the pairs ``|j - i| < band`` of a block of query rows
    onto their rows' value-table rows (``sums``: the rows' first entries), recomputed from the logits and the
    rows' log-sum-exp ``lse`` over the key blocks that reach the band."""
    first_row = tl.min(rows)
    first_key = tl.maximum(first_row - band + 1, 0)
    end_key = tl.minimum(first_row + BLOCK_M + band - 1, length)
    for start in range(first_key, end_key, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < seq_len
        k = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_t + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        logits, pair_ok, _, _ = tile_logits(
            q, k, Bias, QRel, QOff, KRel, KOff, b, h, rows, cols, row_ok, col_ok, length, seq_len, scale,
            sb_h, sb_i, sqr_b, sqr_h, sqr_t, skr_b, skr_h, skr_t, HAS_BIAS, HAS_QREL, HAS_KREL, PRECISION)
        probs = tl.exp(logits - lse[:, None]) * kept_scale
        if HAS_DROPOUT:
            keep = tl.rand(seed + batch_head, rows[:, None] * seq_len + cols[None, :]) >= dropout
            probs = tl.where(keep, probs, 0.0)
        offsets = cols[None, :] - rows[:, None]
        in_band = pair_ok & (cols < length)[None, :] & (offsets < band) & (offsets > -band)
        tl.atomic_add(sums[:, None] + table_rows(VOff, rows, cols, in_band, seq_len), probs, mask=in_band)


@triton.jit
def tile_logits(q, k, Bias, QRel, QOff, KRel, KOff, b, h, rows, cols, row_ok, col_ok, length, seq_len, scale,
                sb_h, sb_i, sqr_b, sqr_h, sqr_t, skr_b, skr_h, skr_t, HAS_BIAS: tl.constexpr,
                HAS_QREL: tl.constexpr, HAS_KREL: tl.constexpr, PRECISION: tl.constexpr):
    """The logits of a tile of queries ``rows`` (their ``q``) and keys ``cols`` (their ``k``): scale q k^T,
    the shared bias, the relative products read by offset, keys past ``length`` masked. Also returns the
    pairs inside the input and the table rows the pairs read in the query-side and key-side products
    (0 without them), which the backward adds the products' gradients onto."""
    logits = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    pair_ok = row_ok[:, None] & col_ok[None, :]
    q_rows = 0
    k_rows = 0
    if HAS_BIAS:
        logits += tl.load(Bias + h * sb_h + rows[:, None] * sb_i + cols[None, :],
                          mask=pair_ok, other=0.0).to(tl.float32)
    if HAS_QREL:
        q_rows = table_rows(QOff, rows, cols, pair_ok, seq_len)
        logits += tl.load(QRel + b * sqr_b + h * sqr_h + rows[:, None] * sqr_t + q_rows, mask=pair_ok,
                          other=0.0).to(tl.float32)
    if HAS_KREL:
        k_rows = table_rows(KOff, rows, cols, pair_ok, seq_len)
        logits += tl.load(KRel + b * skr_b + h * skr_h + cols[None, :] * skr_t + k_rows, mask=pair_ok,
                          other=0.0).to(tl.float32)
    return tl.where((cols < length)[None, :], logits, MASKED), pair_ok, q_rows, k_rows


@triton.jit
def table_rows(Offsets, rows, cols, pair_ok, seq_len):
    """The row of a relative table each (query, key) pair of a tile reads: ``Offsets[key - query + T-1]``."""
    return tl.load(Offsets + cols[None, :] - rows[:, None] + seq_len - 1, mask=pair_ok, other=0)


@triton.jit
def add_by_table_row(Grad, positions, positions_ok, width, rows_of_pairs, grad_logits, pair_ok,
                     AXIS: tl.constexpr):
    """Add a tile's logit gradients onto the (position, table row) entries of ``Grad`` (positions by width,
    float32) they came from: ``positions`` the tile's queries (``AXIS`` 1) or keys (``AXIS`` 0). A tile
    whose pairs all read one row (beyond the clipped distance) adds its row (column) sums, one atomic
    addition per position instead of one per pair onto the same entry."""
    first = tl.min(tl.where(pair_ok, rows_of_pairs, 2147483647))
    last = tl.max(tl.where(pair_ok, rows_of_pairs, -1))
    if first == last:
        tl.atomic_add(Grad + positions * width + first, tl.sum(tl.where(pair_ok, grad_logits, 0.0), AXIS),
                      mask=positions_ok)
    elif AXIS == 1:
        tl.atomic_add(Grad + positions[:, None] * width + rows_of_pairs, grad_logits, mask=pair_ok)
    else:
        tl.atomic_add(Grad + positions[None, :] * width + rows_of_pairs, grad_logits, mask=pair_ok)


@triton.jit
def backward_kernel(Q, K, V, Bias, Lengths, GradOut, Lse, Delta, GradQ, GradK, GradV, GradBias,
                    QRel, QOff, KRel, KOff, GradQRel, GradKRel, ValueGrads, VOff,
                    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, sb_h, sb_i,
                    sqr_b, sqr_h, sqr_t, skr_b, skr_h, skr_t, q_width, k_width, v_width,
                    heads, seq_len, head_dim, scale, dropout, seed,
                    HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, HAS_LENGTHS: tl.constexpr,
                    HAS_DROPOUT: tl.constexpr, HAS_QREL: tl.constexpr, HAS_KREL: tl.constexpr,
                    HAS_VALUES: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One block of keys of one (batch row, head): its dk and dv; dq, the bias gradient and those of the
    relative products (``q_width``, ``k_width``: their table rows) added atomically for every block of
    query rows (``Delta``: rowsum(dO * O), O with the value term). With ``HAS_VALUES`` the gradient of a
    (dropped) probability gains dO_i . a_r of its pair's value-table row r: ``ValueGrads`` (B, H, T,
    ``v_width``, float32) holds dO a^T, read by the offset (``VOff``) as the query-side products are."""
    col_block, batch_head = tl.program_id(0), tl.program_id(1)
    b, h = batch_head // heads, batch_head % heads
    cols = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    col_ok, dim_ok = cols < seq_len, dims < head_dim
    tile_ok = col_ok[:, None] & dim_ok[None, :]
    k = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_t + dims[None, :], mask=tile_ok, other=0.0)
    v = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_t + dims[None, :], mask=tile_ok, other=0.0)
    length = tl.load(Lengths + b) if HAS_LENGTHS else seq_len
    grad_k = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    grad_v = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    for start in range(0, seq_len, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < seq_len
        rows_tile = row_ok[:, None] & dim_ok[None, :]
        q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :], mask=rows_tile, other=0.0)
        grad_out = tl.load(GradOut + b * sg_b + h * sg_h + rows[:, None] * sg_t + dims[None, :],
                           mask=rows_tile, other=0.0)
        lse = tl.load(Lse + batch_head * seq_len + rows, mask=row_ok, other=0.0)
        delta = tl.load(Delta + batch_head * seq_len + rows, mask=row_ok, other=0.0)
        logits, pair_ok, q_rows, k_rows = tile_logits(
            q, k, Bias, QRel, QOff, KRel, KOff, b, h, rows, cols, row_ok, col_ok, length, seq_len, scale,
            sb_h, sb_i, sqr_b, sqr_h, sqr_t, skr_b, skr_h, skr_t, HAS_BIAS, HAS_QREL, HAS_KREL, PRECISION)
        probs = tl.exp(logits - lse[:, None])
        grad_probs = tl.dot(grad_out, tl.trans(v), input_precision=PRECISION)
        if HAS_VALUES:
            grad_probs += tl.load(ValueGrads + (batch_head * seq_len + rows[:, None]) * v_width
                                  + table_rows(VOff, rows, cols, pair_ok, seq_len), mask=pair_ok, other=0.0)
        dropped = probs
        if HAS_DROPOUT:
            keep = tl.rand(seed + batch_head, rows[:, None] * seq_len + cols[None, :]) >= dropout
            dropped = tl.where(keep, probs / (1.0 - dropout), 0.0)
            grad_probs = tl.where(keep, grad_probs / (1.0 - dropout), 0.0)
        grad_v += tl.dot(tl.trans(dropped).to(grad_out.dtype), grad_out, input_precision=PRECISION)
        grad_logits = probs * (grad_probs - delta[:, None])
        grad_k += tl.dot(tl.trans(grad_logits).to(q.dtype), q, input_precision=PRECISION)
        grad_q = tl.dot(grad_logits.to(k.dtype), k, input_precision=PRECISION) * scale
        tl.atomic_add(GradQ + batch_head * seq_len * head_dim + rows[:, None] * head_dim + dims[None, :],
                      grad_q, mask=rows_tile)
        if BIAS_GRAD:
            tl.atomic_add(GradBias + h * seq_len * seq_len + rows[:, None] * seq_len + cols[None, :],
                          grad_logits, mask=pair_ok)
        if HAS_QREL:
            add_by_table_row(GradQRel + batch_head * seq_len * q_width, rows, row_ok, q_width, q_rows,
                             grad_logits, pair_ok, 1)
        if HAS_KREL:
            add_by_table_row(GradKRel + batch_head * seq_len * k_width, cols, col_ok, k_width, k_rows,
                             grad_logits, pair_ok, 0)
    offsets = batch_head * seq_len * head_dim + cols[:, None] * head_dim + dims[None, :]
    tl.store(GradK + offsets, grad_k * scale, mask=tile_ok)
    tl.store(GradV + offsets, grad_v, mask=tile_ok)


@triton.jit
def keep_mask_kernel(Out, seq_len, dropout, seed, BLOCK: tl.constexpr):
    """The keep-mask of one query row of one (batch row, head), as the two kernels draw it."""
    batch_head, row = tl.program_id(0), tl.program_id(1)
    for start in range(0, seq_len, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        keep = tl.rand(seed + batch_head, row * seq_len + cols) >= dropout
        tl.store(Out + (batch_head * seq_len + row) * seq_len + cols, keep.to(tl.int8), mask=cols < seq_len)
