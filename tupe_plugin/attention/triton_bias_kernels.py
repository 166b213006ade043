"""The Triton kernels of :mod:`.triton_bias_attention` (its docstring says what they compute); imported only
where they run, so that CPU installs never need Triton."""

import triton
import triton.language as tl

# A masked logit: finite, so that a row whose keys are all masked stays a number (uniform probabilities,
# as an additive mask of the dtype's most negative value gives), far below any real logit.
MASKED = tl.constexpr(-1.0e30)


@triton.jit
def forward_kernel(Q, K, V, Bias, BiasRows, Cls, Lengths, Out, Lse, QRows, QOff, KRows, KOff, ValueSums,
                   VOff, Band, sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                   so_b, so_h, so_t, sb_h, sb_i, sqr_h, sqr_r, skr_h, skr_r, q_width, k_width, v_width,
                   heads, seq_len, head_dim, scale, dropout, seed,
                   HAS_BIAS: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_CLS: tl.constexpr,
                   HAS_LENGTHS: tl.constexpr, HAS_DROPOUT: tl.constexpr, HAS_QREL: tl.constexpr,
                   HAS_KREL: tl.constexpr, HAS_VALUES: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One block of query rows of one (batch row, head): the output and the rows' log-sum-exp; with
    ``HAS_VALUES``, also the rows' sums of their (dropped, rescaled) probabilities by the row of the value
    table each pair reads (``VOff``), added onto ``ValueSums`` (B, H, T, ``v_width``, float32, zeros).

    The sums need the normalised probabilities, known once the online softmax has ended. The pairs at an
    offset ``|j - i| >= Band`` read one of the table's two end rows (``VOff``'s first, last entry: the
    clipped distances of Shaw's table): their sums run in the main loop as two (BLOCK_M,) sums, rescaled
    with the running maximum as ``acc`` is. The pairs of the band ``|j - i| < Band`` are recomputed
    afterwards (:func:`add_band_sums`), probabilities by the log-sum-exp: the extra cost is the
    logits of ``(BLOCK_M + 2 Band - 2) / BLOCK_N`` key blocks (rounded up) per block of query rows (with
    Shaw's K = 64, 3 of 64 keys beside the main loop's T / 64; 5 of 32 with the 32-row blocks that Shaw
    keys' table rows take) and their atomic additions."""
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
        first = start - row_block * BLOCK_M - (BLOCK_M - 1)
        logits, _ = tile_logits(
            q, k, Bias, BiasRows, Cls, QRows, QOff, KRows, KOff, h, rows, cols, first, row_ok, col_ok, dims,
            length, seq_len, scale, sb_h, sb_i, sqr_h, sqr_r, skr_h, skr_r, q_width, k_width, HAS_BIAS,
            HAS_ROWS, HAS_CLS, HAS_QREL, HAS_KREL, PRECISION, BLOCK_M, BLOCK_N)
        new_max = tl.maximum(row_max, tl.max(logits, 1))
        probs = tl.exp(logits - new_max[:, None])
        rescale = tl.exp(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        if HAS_DROPOUT:
            # the keep-mask as 0 / 1: a boolean tile in the layout of the relative terms' gather does not
            # compile for sm_90 in float32 (Triton 3.9 moves it through shared memory)
            keep = tl.rand(seed + batch_head, rows[:, None] * seq_len + cols[None, :]) >= dropout
            probs *= keep.to(tl.float32)
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
        add_band_sums(q, K, Bias, BiasRows, Cls, QRows, QOff, KRows, KOff, sums, VOff, band, b, h, batch_head,
                      rows, row_ok, dims, dim_ok, lse, length, seq_len, scale, dropout, kept_scale, seed,
                      sk_b, sk_h, sk_t, sb_h, sb_i, sqr_h, sqr_r, skr_h, skr_r, q_width, k_width, HAS_BIAS,
                      HAS_ROWS, HAS_CLS, HAS_DROPOUT, HAS_QREL, HAS_KREL, PRECISION, BLOCK_M, BLOCK_N)


@triton.jit
def add_band_sums(q, K, Bias, BiasRows, Cls, QRows, QOff, KRows, KOff, sums, VOff, band, b, h, batch_head,
                  rows, row_ok, dims, dim_ok, lse, length, seq_len, scale, dropout, kept_scale, seed,
                  sk_b, sk_h, sk_t, sb_h, sb_i, sqr_h, sqr_r, skr_h, skr_r, q_width, k_width,
                  HAS_BIAS: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_CLS: tl.constexpr,
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
        first = start - first_row - (BLOCK_M - 1)
        logits, pair_ok = tile_logits(
            q, k, Bias, BiasRows, Cls, QRows, QOff, KRows, KOff, h, rows, cols, first, row_ok, col_ok, dims,
            length, seq_len, scale, sb_h, sb_i, sqr_h, sqr_r, skr_h, skr_r, q_width, k_width, HAS_BIAS,
            HAS_ROWS, HAS_CLS, HAS_QREL, HAS_KREL, PRECISION, BLOCK_M, BLOCK_N)
        probs = tl.exp(logits - lse[:, None]) * kept_scale
        if HAS_DROPOUT:
            keep = tl.rand(seed + batch_head, rows[:, None] * seq_len + cols[None, :]) >= dropout
            probs = tl.where(keep, probs, 0.0)
        offsets = cols[None, :] - rows[:, None]
        in_band = pair_ok & (cols < length)[None, :] & (offsets < band) & (offsets > -band)
        tl.atomic_add(sums[:, None] + table_rows(VOff, rows, cols, in_band, seq_len), probs, mask=in_band)


@triton.jit
def tile_logits(q, k, Bias, BiasRows, Cls, QRows, QOff, KRows, KOff, h, rows, cols, first, row_ok, col_ok,
                dims, length, seq_len, scale, sb_h, sb_i, sqr_h, sqr_r, skr_h, skr_r, q_width, k_width,
                HAS_BIAS: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_CLS: tl.constexpr, HAS_QREL: tl.constexpr,
                HAS_KREL: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """The logits of a tile of queries ``rows`` (their ``q``) and keys ``cols`` (their ``k``; ``first``: the
    first key minus the last query, the tile's lowest offset): scale q k^T, the shared bias, the distance
    bias (:func:`distance_term`), the relative terms of the table rows read by offset
    (:func:`query_side_term`, :func:`key_side_term`), keys past ``length`` masked. Also returns the pairs
    inside the input."""
    logits = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    pair_ok = row_ok[:, None] & col_ok[None, :]
    if HAS_BIAS:
        logits += tl.load(Bias + h * sb_h + rows[:, None] * sb_i + cols[None, :],
                          mask=pair_ok, other=0.0).to(tl.float32)
    if HAS_ROWS or HAS_CLS:
        logits += distance_term(BiasRows, Cls, h, rows, cols, pair_ok, seq_len, HAS_ROWS, HAS_CLS)
    if HAS_QREL:
        logits += tl.where(pair_ok, query_side_term(q, QRows + h * sqr_h, QOff, first, dims, seq_len, sqr_r,
                                                    q_width, PRECISION, BLOCK_M, BLOCK_N), 0.0) * scale
    if HAS_KREL:
        logits += tl.where(pair_ok, key_side_term(k, KRows + h * skr_h, KOff, first, dims, seq_len, skr_r,
                                                  k_width, PRECISION, BLOCK_M, BLOCK_N), 0.0) * scale
    return tl.where((cols < length)[None, :], logits, MASKED), pair_ok


@triton.jit
def distance_term(BiasRows, Cls, h, rows, cols, pair_ok, seq_len, HAS_ROWS: tl.constexpr,
                  HAS_CLS: tl.constexpr):
    """The distance bias of every pair of a tile, float32: the Toeplitz value ``BiasRows[h, j - i + T - 1]``
    (``BiasRows`` (H, 2T - 1), contiguous; the tile's pointers span its window of BLOCK_M + BLOCK_N - 1
    consecutive values), zero without rows; with ``HAS_CLS`` the [CLS] reset of TUPE Eq. 9-11 in their
    place: ``Cls[h, 0]`` on query row 0, ``Cls[h, 1]`` on key column 0 of the other rows (``Cls`` (H, 2))."""
    term = tl.zeros(pair_ok.shape, tl.float32)
    if HAS_ROWS:
        term = tl.load(BiasRows + h * (2 * seq_len - 1) + cols[None, :] - rows[:, None] + seq_len - 1,
                       mask=pair_ok, other=0.0).to(tl.float32)
    if HAS_CLS:
        first_row = tl.load(Cls + 2 * h).to(tl.float32)
        first_column = tl.load(Cls + 2 * h + 1).to(tl.float32)
        term = tl.where(rows[:, None] == 0, first_row, tl.where(cols[None, :] == 0, first_column, term))
    return term


@triton.jit
def add_distance_grads(grad_logits, GradRows, GradCls, rows, cols, query_start, key_start, first, seq_len,
                       HAS_CLS: tl.constexpr, ROWS_GRAD: tl.constexpr, CLS_GRAD: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Add a tile's logit gradients dS onto the distance bias's gradients of this batch row and head:
    ``GradRows`` (2T - 1,) float32 each diagonal's sum (D[i, w] = dS_ij of the pair whose offset is
    first + w, summed over i, then one atomic addition per offset of the window), without the cells the
    [CLS] reset replaces; ``GradCls`` (2,) float32 the sums over query row 0 and over key column 0 of the
    other rows."""
    first_row, first_column = rows[:, None] == 0, (cols[None, :] == 0) & (rows[:, None] != 0)
    if CLS_GRAD:
        if query_start == 0:
            tl.atomic_add(GradCls, tl.sum(tl.sum(tl.where(first_row, grad_logits, 0.0), 1), 0))
        if key_start == 0:
            tl.atomic_add(GradCls + 1, tl.sum(tl.sum(tl.where(first_column, grad_logits, 0.0), 1), 0))
    if ROWS_GRAD:
        if HAS_CLS:
            grad_logits = tl.where(first_row | first_column, 0.0, grad_logits)
        entries = tl.arange(0, BLOCK_M + BLOCK_N)
        keys = entries[None, :] + tl.arange(0, BLOCK_M)[:, None] - (BLOCK_M - 1)
        by_entry = tl.where((keys >= 0) & (keys < BLOCK_N),
                            tl.gather(grad_logits, tl.minimum(tl.maximum(keys, 0), BLOCK_N - 1), 1), 0.0)
        offsets = first + entries
        tl.atomic_add(GradRows + offsets + seq_len - 1, tl.sum(by_entry, 0),
                      mask=(offsets > -seq_len) & (offsets < seq_len))


@triton.jit
def offset_window(Offsets, first, seq_len, WINDOW: tl.constexpr):
    """The table rows of the ``WINDOW`` offsets from ``first`` on (``Offsets[o + T - 1]`` for offset o),
    which of them lie within -(T - 1)..T - 1 (the others read nothing), whether those all name one row, and
    the lowest row they name."""
    offsets = first + tl.arange(0, WINDOW)
    inside = (offsets > -seq_len) & (offsets < seq_len)
    table_rows = tl.load(Offsets + offsets + seq_len - 1, mask=inside, other=0)
    lowest = tl.min(tl.where(inside, table_rows, 2147483647), 0)
    return table_rows, inside, lowest == tl.max(tl.where(inside, table_rows, -1), 0), lowest


@triton.jit
def load_window(Rows, table_rows, inside, dims, s_r, width):
    """The (window, BLOCK_D) table rows ``table_rows`` (zeros outside ``inside`` and past ``width``)."""
    return tl.load(Rows + table_rows[:, None] * s_r + dims[None, :],
                   mask=inside[:, None] & (dims < width)[None, :], other=0.0)


@triton.jit
def skew(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N): the window entry of each pair of a tile, j - i + BLOCK_M - 1 in the tile: the
    tile's offsets run from ``first`` (its first key minus its last query) over BLOCK_M + BLOCK_N - 1."""
    return tl.arange(0, BLOCK_N)[None, :] - tl.arange(0, BLOCK_M)[:, None] + BLOCK_M - 1


@triton.jit
def query_side_term(q, Rows, Offsets, first, dims, seq_len, s_r, width, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """q_i . Rows[Offsets[j - i + T - 1]] of every pair of the tile (unscaled): q against the window of the
    tile's BLOCK_M + BLOCK_N offsets, each pair taking its entry (a tile that reads one row: q against it)."""
    table_rows, inside, single, lowest = offset_window(Offsets, first, seq_len, BLOCK_M + BLOCK_N)
    if single:
        row = tl.load(Rows + lowest * s_r + dims, mask=dims < width, other=0.0).to(tl.float32)
        term = tl.broadcast_to(tl.sum(q.to(tl.float32) * row[None, :], 1)[:, None], (BLOCK_M, BLOCK_N))
    else:
        window = load_window(Rows, table_rows, inside, dims, s_r, width)
        term = tl.gather(tl.dot(q, tl.trans(window), input_precision=PRECISION), skew(BLOCK_M, BLOCK_N), 1)
    return term


@triton.jit
def key_side_term(k, Rows, Offsets, first, dims, seq_len, s_r, width, PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """k_j . Rows[Offsets[j - i + T - 1]] of every pair of the tile (unscaled), as :func:`query_side_term`
    with the window against k."""
    table_rows, inside, single, lowest = offset_window(Offsets, first, seq_len, BLOCK_M + BLOCK_N)
    if single:
        row = tl.load(Rows + lowest * s_r + dims, mask=dims < width, other=0.0).to(tl.float32)
        term = tl.broadcast_to(tl.sum(k.to(tl.float32) * row[None, :], 1)[None, :], (BLOCK_M, BLOCK_N))
    else:
        window = load_window(Rows, table_rows, inside, dims, s_r, width)
        term = tl.gather(tl.dot(window, tl.trans(k), input_precision=PRECISION), skew(BLOCK_M, BLOCK_N), 0)
    return term


@triton.jit
def query_side_grads(grad_logits, q, Rows, Offsets, GradRows, first, dims, seq_len, s_r, width, scale,
                     ROWS_GRAD: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """For the logit gradients dS of a tile: returns the query side's part of dq / scale, (BLOCK_M,
    BLOCK_D); with ``ROWS_GRAD`` adds scale dS_ij q_i onto ``GradRows`` (2T - 1, ``width``), the float32
    gradient of this batch row and head by offset. dS by window entry (D[i, w] = dS_ij of the pair whose
    offset is first + w) gives dq = D window and the window's gradient D^T q; a tile that reads one row
    takes dS's row sums."""
    table_rows, inside, single, lowest = offset_window(Offsets, first, seq_len, BLOCK_M + BLOCK_N)
    width_ok = dims < width
    if single:
        row = tl.load(Rows + lowest * s_r + dims, mask=width_ok, other=0.0).to(tl.float32)
        by_row = tl.sum(grad_logits, 1)
        grad_q = by_row[:, None] * row[None, :]
        if ROWS_GRAD:
            offset = tl.minimum(tl.maximum(first, 1 - seq_len), seq_len - 1)
            tl.atomic_add(GradRows + (offset + seq_len - 1) * width + dims,
                          tl.sum(by_row[:, None] * q.to(tl.float32), 0) * scale, mask=width_ok)
    else:
        window = load_window(Rows, table_rows, inside, dims, s_r, width)
        entries = tl.arange(0, BLOCK_M + BLOCK_N)
        keys = entries[None, :] + tl.arange(0, BLOCK_M)[:, None] - (BLOCK_M - 1)
        by_entry = tl.where((keys >= 0) & (keys < BLOCK_N),
                            tl.gather(grad_logits, tl.minimum(tl.maximum(keys, 0), BLOCK_N - 1), 1), 0.0)
        grad_q = tl.dot(by_entry.to(window.dtype), window, input_precision=PRECISION)
        if ROWS_GRAD:
            grad_window = tl.dot(tl.trans(by_entry).to(q.dtype), q, input_precision=PRECISION) * scale
            tl.atomic_add(GradRows + (first + entries + seq_len - 1)[:, None] * width + dims[None, :],
                          grad_window, mask=inside[:, None] & width_ok[None, :])
    return grad_q


@triton.jit
def key_side_grads(grad_logits, k, Rows, Offsets, GradRows, first, dims, seq_len, s_r, width, scale,
                   ROWS_GRAD: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """As :func:`query_side_grads` for the key side: returns its part of dk / scale, (BLOCK_N, BLOCK_D),
    from E[w, j] = dS_ij of the pair whose offset is first + w (dk = E^T window, the window's gradient
    E k); a tile that reads one row takes dS's column sums."""
    table_rows, inside, single, lowest = offset_window(Offsets, first, seq_len, BLOCK_M + BLOCK_N)
    width_ok = dims < width
    if single:
        row = tl.load(Rows + lowest * s_r + dims, mask=width_ok, other=0.0).to(tl.float32)
        by_column = tl.sum(grad_logits, 0)
        grad_k = by_column[:, None] * row[None, :]
        if ROWS_GRAD:
            offset = tl.minimum(tl.maximum(first, 1 - seq_len), seq_len - 1)
            tl.atomic_add(GradRows + (offset + seq_len - 1) * width + dims,
                          tl.sum(by_column[:, None] * k.to(tl.float32), 0) * scale, mask=width_ok)
    else:
        window = load_window(Rows, table_rows, inside, dims, s_r, width)
        entries = tl.arange(0, BLOCK_M + BLOCK_N)
        queries = tl.arange(0, BLOCK_N)[None, :] - entries[:, None] + BLOCK_M - 1
        by_entry = tl.where((queries >= 0) & (queries < BLOCK_M),
                            tl.gather(grad_logits, tl.minimum(tl.maximum(queries, 0), BLOCK_M - 1), 0), 0.0)
        grad_k = tl.dot(tl.trans(by_entry).to(window.dtype), window, input_precision=PRECISION)
        if ROWS_GRAD:
            grad_window = tl.dot(by_entry.to(k.dtype), k, input_precision=PRECISION) * scale
            tl.atomic_add(GradRows + (first + entries + seq_len - 1)[:, None] * width + dims[None, :],
                          grad_window, mask=inside[:, None] & width_ok[None, :])
    return grad_k


@triton.jit
def table_rows(Offsets, rows, cols, pair_ok, seq_len):
    """The row of a relative table each (query, key) pair of a tile reads: ``Offsets[key - query + T-1]``."""
    return tl.load(Offsets + cols[None, :] - rows[:, None] + seq_len - 1, mask=pair_ok, other=0)


@triton.jit
def backward_kernel(Q, K, V, Bias, BiasRows, Cls, Lengths, GradOut, Lse, Delta, GradQ, GradK, GradV, GradBias,
                    GradBiasRows, GradCls, QRows, QOff, KRows, KOff, GradQRows, GradKRows, ValueGrads, VOff,
                    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sg_b, sg_h, sg_t, sb_h, sb_i,
                    sqr_h, sqr_r, skr_h, skr_r, q_width, k_width, v_width,
                    heads, seq_len, head_dim, scale, dropout, seed,
                    HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, HAS_ROWS: tl.constexpr,
                    HAS_CLS: tl.constexpr, BIAS_ROWS_GRAD: tl.constexpr, CLS_GRAD: tl.constexpr,
                    HAS_LENGTHS: tl.constexpr,
                    HAS_DROPOUT: tl.constexpr, HAS_QREL: tl.constexpr, HAS_KREL: tl.constexpr,
                    QROWS_GRAD: tl.constexpr, KROWS_GRAD: tl.constexpr, HAS_VALUES: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """One block of keys of one (batch row, head): its dk and dv; dq and the bias gradient added atomically
    for every block of query rows (``Delta``: rowsum(dO * O), O with the value term), the relative terms'
    parts of dq and dk taken from their table rows (:func:`query_side_grads`, :func:`key_side_grads`),
    which add the rows' gradients by offset onto ``GradQRows``, ``GradKRows`` (B, H, 2T - 1, width, float32:
    one buffer per batch row and head, so that only the key blocks of one (batch row, head) add onto the
    same entries; the caller sums them and adds each offset onto its row); the distance bias's gradients
    likewise by batch row and head onto ``GradBiasRows`` (B, H, 2T - 1) and ``GradCls`` (B, H, 2), float32
    (:func:`add_distance_grads`). With ``HAS_VALUES`` the gradient
    of a (dropped) probability gains dO_i . a_r of its pair's value-table row r: ``ValueGrads`` (B, H, T,
    ``v_width``, float32) holds dO a^T, read by the offset (``VOff``)."""
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
        first = col_block * BLOCK_N - start - (BLOCK_M - 1)
        logits, pair_ok = tile_logits(
            q, k, Bias, BiasRows, Cls, QRows, QOff, KRows, KOff, h, rows, cols, first, row_ok, col_ok, dims,
            length, seq_len, scale, sb_h, sb_i, sqr_h, sqr_r, skr_h, skr_r, q_width, k_width, HAS_BIAS,
            HAS_ROWS, HAS_CLS, HAS_QREL, HAS_KREL, PRECISION, BLOCK_M, BLOCK_N)
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
        grad_logits = tl.where(pair_ok, probs * (grad_probs - delta[:, None]), 0.0)
        grad_k += tl.dot(tl.trans(grad_logits).to(q.dtype), q, input_precision=PRECISION)
        grad_q = tl.dot(grad_logits.to(k.dtype), k, input_precision=PRECISION)
        if HAS_QREL:
            grad_q += query_side_grads(
                grad_logits, q, QRows + h * sqr_h, QOff, GradQRows + batch_head * (2 * seq_len - 1) * q_width,
                first, dims, seq_len, sqr_r, q_width, scale, QROWS_GRAD, PRECISION, BLOCK_M, BLOCK_N)
        if HAS_KREL:
            grad_k += key_side_grads(
                grad_logits, k, KRows + h * skr_h, KOff, GradKRows + batch_head * (2 * seq_len - 1) * k_width,
                first, dims, seq_len, skr_r, k_width, scale, KROWS_GRAD, PRECISION, BLOCK_M, BLOCK_N)
        tl.atomic_add(GradQ + batch_head * seq_len * head_dim + rows[:, None] * head_dim + dims[None, :],
                      grad_q * scale, mask=rows_tile)
        if BIAS_GRAD:
            tl.atomic_add(GradBias + h * seq_len * seq_len + rows[:, None] * seq_len + cols[None, :],
                          grad_logits, mask=pair_ok)
        if BIAS_ROWS_GRAD or CLS_GRAD:
            add_distance_grads(grad_logits, GradBiasRows + batch_head * (2 * seq_len - 1),
                               GradCls + 2 * batch_head, rows, cols, start, col_block * BLOCK_N, first,
                               seq_len, HAS_CLS, BIAS_ROWS_GRAD, CLS_GRAD, BLOCK_M, BLOCK_N)
    offsets = batch_head * seq_len * head_dim + cols[:, None] * head_dim + dims[None, :]
    tl.store(GradK + offsets, grad_k * scale, mask=tile_ok)
    tl.store(GradV + offsets, grad_v, mask=tile_ok)


@triton.jit
def keep_mask_kernel(Out, seq_len, dropout, seed, BLOCK: tl.constexpr):
    """The keep-mask of one (batch row, head) on a BLOCK of query rows, as the two kernels draw it: Philox
    at offset query * T + key of the stream seed + batch row * H + head."""
    batch_head = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    for start in range(0, seq_len, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        offsets = rows[:, None] * seq_len + cols[None, :]
        keep = tl.rand(seed + batch_head, offsets) >= dropout
        tl.store(Out + batch_head * seq_len * seq_len + offsets, keep.to(tl.int8),
                 mask=(rows[:, None] < seq_len) & (cols[None, :] < seq_len))
