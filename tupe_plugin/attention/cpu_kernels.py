"""The CPU attention kernels for what SDPA cannot run fast there (chosen by :mod:`.paths`).

:class:`ChunkedAttention` runs attention with dropout (SDPA has no fused CPU kernel for it and its math
fallback is slower still): matmul-softmax-dropout-matmul one cache-sized block of query rows of heads of one
batch row at a time, the mask (a learned bias included) added inside the logits' product, the probabilities
and the keep-mask kept for an exact backward that reduces the bias gradient in the same block.
:class:`BiasedFlashAttention` runs dropout-free attention whose bias needs a gradient (SDPA would take its
slow math path), or whose fixed bias of the offset leaves most probabilities subnormal (SDPA's CPU backward
computes with them; this one drops them, see ``NEGLIGIBLE_PROBABILITY``): for a dense additive mask the CPU
flash kernel forward with the mask as a constant, for a bias of the offset the blocks' forward below (the
log-sum-exp of each row kept), then an exact backward that keeps no (B, H, T, T) tensor: the compiled
kernel of :mod:`.compiled_kernels` (blocks of query rows, the bias gradient in the pass that computes dS)
where it can be built, else the blocks' backward below.

Both compute ``softmax(scale * q k^T + mask + bias) v`` (with dropout: the probabilities times a keep-mask
over the keep probability) and share one backward over blocks (:func:`_block_gradients`): from the
probabilities ``P`` of the block and the softmax gradient ``dS = P * (dP - rowsum(dO * O))``, where
``dP = dO v^T`` (times the keep-mask over the keep probability with dropout), come dq = scale dS k,
dk = scale (q^T dS)^T, dv = (dO^T P~)^T with ``P~`` the dropped probabilities, and the bias gradients from
dS (summed over the batch when the bias is shared). :class:`BiasedFlashAttention` recomputes ``P`` in the
backward (one ``baddbmm`` and one softmax per block); :class:`ChunkedAttention` keeps ``P`` (and the
keep-mask, one byte an element) from its forward. At most ``CHUNK_LOGITS`` logits live at a time; heads are
the outer loop, so that a shared bias and its gradient stay in cache while every batch row reads and adds to
them.

A bias of the offset j - i (the ``--rel-pos`` biases) comes as its Toeplitz rows (H, 2T - 1) with the [CLS]
reset's edges (:mod:`.offset_rows`): a block adds its bias row by row from the rows (or, without the
compiled ops, reads it as a strided view of the rows laid out periodically), adds its dS back by offset, and
no (H, T, T) tensor is made; the rows' gradient is the dS of every cell summed by offset j - i, the edges'
gradients dS's row 0 and column 0.
A dense mask (TUPE's untied product, key padding) is added to it. A learned mask read by every layer gets
its gradient in one buffer (``mask_gradient``, :mod:`.shared_mask_gradient`), on both kernels and the
compiled backward: the first layer's backward computes its blocks' dS in the buffer, the others add theirs;
where that buffer takes the gradient of a bias of the offset too, the kernel computes none. The explicit
path of :mod:`.attend` is their step-by-step twin in the tests, and the path for a gradient of a gradient
(``create_graph=True``), which both kernels refuse (:class:`DoubleBackwardError`).
"""


import torch

from . import compiled_kernels
from .dropout import keep_mask, keep_probability
from .offset_rows import OffsetRows, seq_len_of

# Logits of one chunk (heads of one batch row): 1 MiB of float32, which stays in the CPU's caches
# while it is normalised, dropped, multiplied and reduced.
CHUNK_LOGITS = 2**18
# Where one head's (T, T) logits exceed CHUNK_LOGITS (with a bias of the offset, past WHOLE_ROWS_UP_TO
# positions), a block holds ROW_BLOCK_LOGITS logits of one head (at least MIN_ROW_BLOCK_ROWS query rows): the
# periodic layout of the rows of a bias of the offset holds 2 T a block row and head, 4 MiB of float32 a head
# (up to WHOLE_ROWS_UP_TO, 0.5 MiB), and fewer blocks cost less Python (64-row blocks at T = 2048: a tenth
# of the step)
ROW_BLOCK_LOGITS = 2**19
MIN_ROW_BLOCK_ROWS = 64
WHOLE_ROWS_UP_TO = 256

# Probabilities below this are set to 0 under an additive bias, a bias of the offset's rows or a dense float
# mask: ALiBi's and KERPLE's long rows put most of a row's probabilities far below float32's smallest normal
# number, and so their products with a training step's small gradients, and arithmetic on subnormal numbers
# runs several times slower on Intel CPUs (ALiBi's step against no bias: 1.4 x at T = 2048, tiny; 1.27 x
# against BERT-A's at T = 512, medium, with the bias expanded, its bmm's 3.5 x slower). What is dropped, at
# most T 2^-64 of a row, is below float32's rounding of it.
NEGLIGIBLE_PROBABILITY = 2.0**-64

# The compiled backward's block of query rows: BLOCK_LOGITS logits (1 MiB of float32, as much again for
# their gradient), at least MIN_BLOCK_ROWS rows. Larger than an L2 cache, yet faster than L2-sized blocks
# (256 KiB: 1.06 x slower at T = 512): dk and dv come from fewer, deeper GEMMs (docs/benchmarks.md).
BLOCK_LOGITS = 2**18
MIN_BLOCK_ROWS = 16


def reads_offset_rows(seq_len):
    """Whether the chunked kernel, and a forward without gradients, read a bias of the offset from its rows
    at length T (the biased flash kernel in training reads them at every length:
    :func:`.paths.offset_bias_as_rows`): where a head's (T, T) logits exceed CHUNK_LOGITS. Below, the dense
    bias built once per forward costs less than the rows' periodic layout that every layer builds (2 T^2
    numbers a head for whole rows): TUPE-R's training step at T = 512, medium size, 1.09 x BERT-A's with the
    rows, 1.04 x with the dense bias."""
    return seq_len * seq_len > CHUNK_LOGITS


def _block_rows(seq_len, offset_bias):
    """Query rows of a block: all of them where a head's logits fit CHUNK_LOGITS (with a bias of the offset,
    up to WHOLE_ROWS_UP_TO positions), else ROW_BLOCK_LOGITS logits' worth."""
    if (seq_len <= WHOLE_ROWS_UP_TO) if offset_bias else (seq_len * seq_len <= CHUNK_LOGITS):
        return seq_len
    return min(seq_len, max(MIN_ROW_BLOCK_ROWS, ROW_BLOCK_LOGITS // seq_len))


def _blocks(batch, heads, seq_len, block_rows):
    """(batch row, slice of heads, slice of query rows) of every block, heads outer (see the module
    docstring); a block of fewer rows than T is of one head (a head's rows of logits are contiguous)."""
    group = 1 if block_rows < seq_len else min(heads, max(1, CHUNK_LOGITS // (seq_len * seq_len)))
    for start in range(0, heads, group):
        for b in range(batch):
            for first in range(0, seq_len, block_rows):
                yield b, slice(start, start + group), slice(first, min(first + block_rows, seq_len))


class ToeplitzBias:
    """The rows of a bias of the offset (:class:`~.offset_rows.OffsetRows`) and the [CLS] reset's edges
    (row (H, T), column (H, T), or None) as the blocks read them (unless ``reads`` is False: a backward from
    the kept probabilities), and their gradients."""

    def __init__(self, rows, edge_row, edge_col, block_rows, needs_grad, dtype, reads=True):
        self.offset_rows = OffsetRows(rows.to(dtype), block_rows, values=reads)
        self.edge_row = None if edge_row is None else edge_row.detach().to(dtype)
        self.edge_col = None if edge_col is None else edge_col.detach().to(dtype)
        self.needs_grad = needs_grad
        self.grad_row = self.grad_col = None
        if needs_grad and edge_row is not None:
            self.grad_row, self.grad_col = torch.zeros_like(self.edge_row), torch.zeros_like(self.edge_col)

    def zeros(self, heads, queries):
        """A block of zeros (heads, m, T) for ``heads`` and ``queries`` (slices), in the rows' dtype."""
        rows = self.offset_rows.rows
        return rows.new_zeros(heads.stop - heads.start, queries.stop - queries.start, seq_len_of(rows))

    def accumulator(self, heads, queries):
        """The rows' bias of ``heads`` and ``queries`` as a view for a product to accumulate into, or None
        (:meth:`~.offset_rows.OffsetRows.accumulator`)."""
        return self.offset_rows.accumulator(heads, queries)

    def add_(self, logits, heads, queries):
        """Add to the logits (heads, m, T) of the query rows ``queries`` what :meth:`accumulator` did not
        give: the rows' bias where it gave None, and the reset's edges."""
        self.offset_rows.add_(logits, heads, queries)
        if self.edge_row is None:
            return
        if queries.start == 0:
            logits[:, 0].add_(self.edge_row[heads])
        logits[:, :, 0].add_(self.edge_col[heads, queries])

    def add_gradient(self, grad_logits, heads, queries):
        """Add a block's dS to the rows' and the edges' gradients."""
        if not self.needs_grad:
            return
        self.offset_rows.add_gradient(grad_logits, heads, queries)
        if self.grad_row is not None:
            if queries.start == 0:
                self.grad_row[heads] += grad_logits[:, 0]
            self.grad_col[heads, queries] += grad_logits[:, :, 0]

    def gradients(self):
        """(rows, edge row, edge column) gradients, None where not needed."""
        if not self.needs_grad:
            return None, None, None
        return self.offset_rows.folded(), self.grad_row, self.grad_col


def _offset_bias(rows, edge_row, edge_col, q, needs_grad, reads=True):
    """The :class:`ToeplitzBias` of a call with queries ``q`` (B, H, T, d), in their dtype; None without
    rows."""
    if rows is None:
        return None
    return ToeplitzBias(rows, edge_row, edge_col, _block_rows(q.size(2), True), needs_grad, q.dtype, reads)


def _block_gradients(q, k, v, grad_out, minus_delta, probs, keep, grads, index, out=None):
    """The gradients of one block (``index`` = (b, heads, queries)) written into ``grads`` = (dq, dk^T, dv^T)
    (added to them past a head's first block of rows); ``grad_out`` already divided by the keep probability
    when ``keep`` is given. Returns dS (the unscaled logits' gradient, also the bias's), computed in ``out``
    when given."""
    b, heads, queries = index
    q, k, v, grad_out = q[index], k[b, heads], v[b, heads], grad_out[index]
    if keep is None:
        grad_logits = torch.baddbmm(minus_delta[index], grad_out, v.transpose(-1, -2), out=out).mul_(probs)
        dropped = probs
    else:
        # P * (keep * dP + minus_delta) as (P * keep) * dP + P * minus_delta: P * keep is dv's factor anyway
        dropped = probs * keep
        grad_logits = torch.bmm(grad_out, v.transpose(-1, -2), out=out).mul_(dropped)
        grad_logits.addcmul_(probs, minus_delta[index])
    grad_q, grad_k_t, grad_v_t = grads
    torch.bmm(grad_logits, k, out=grad_q[index])
    # dk and dv are computed transposed (q^T dS, dO^T P): a plain-layout product, faster than
    # (dS^T q) on this CPU's GEMM; their transposed views are the gradients
    if queries.start == 0:
        torch.bmm(q.transpose(-1, -2), grad_logits, out=grad_k_t[b, heads])
        torch.bmm(grad_out.transpose(-1, -2), dropped, out=grad_v_t[b, heads])
    else:
        grad_k_t[b, heads].baddbmm_(q.transpose(-1, -2), grad_logits)
        grad_v_t[b, heads].baddbmm_(grad_out.transpose(-1, -2), dropped)
    return grad_logits


def _backward(q, k, v, out, grad_out, scale, mask_shape, probs_of, keep=None, keep_prob=1.0, offset=None,
              mask_gradient=None):
    """dq, dk, dv and the mask's gradient (None when ``mask_shape`` is None; added to ``mask_gradient``'s
    buffer, a :class:`~.shared_mask_gradient.SharedMaskGradient`, when given) by blocks, the gradients of the
    bias of the offset into ``offset`` (a :class:`ToeplitzBias`); ``probs_of(index)`` gives the probabilities
    of a block, ``keep`` (B, H, T, T) the dropout keep-mask."""
    grad_out = grad_out.contiguous()
    batch, heads, seq_len, head_dim = q.shape
    minus_delta = (grad_out * out).sum(-1, keepdim=True).neg_()
    if keep is not None:
        grad_out = grad_out * (1.0 / keep_prob)
    grads = (torch.empty_like(q), q.new_empty(batch, heads, head_dim, seq_len),
             v.new_empty(batch, heads, v.size(-1), seq_len))
    shared = mask_shape is not None and mask_shape[0] == 1
    grad_mask, written = None, False
    if mask_shape is not None:
        grad_mask, written = (q.new_empty(mask_shape), False) if mask_gradient is None else \
            mask_gradient.buffer(mask_shape, q)
    for index in _blocks(batch, heads, seq_len, _block_rows(seq_len, offset is not None)):
        b, h, queries = index
        cells = None if grad_mask is None else grad_mask[0 if shared else b, h, queries]
        # dS is computed in the mask's gradient where it is the first to reach its cells, else added to it
        first = cells is not None and not written and not (shared and b > 0)
        grad_logits = _block_gradients(q, k, v, grad_out, minus_delta, probs_of(index),
                                       None if keep is None else keep[index], grads, index,
                                       cells if first else None)
        if cells is not None and not first:
            cells += grad_logits
        if offset is not None:
            offset.add_gradient(grad_logits, h, queries)
    grad_q, grad_k_t, grad_v_t = grads
    return grad_q.mul_(scale), grad_k_t.mul_(scale).transpose(-1, -2), grad_v_t.transpose(-1, -2), grad_mask


def _block_logits(q, k, mask, scale, index, offset=None, out=None):
    """scale * q k^T + mask + bias of one block (into ``out`` when given): a float mask or the bias of the
    offset, or their sum, is the product's accumulator; a boolean key-padding mask (B, 1, 1, T), True =
    attend, fills the padded keys."""
    b, heads, queries = index
    k_t = k[b, heads].transpose(-1, -2)
    bias = None if offset is None else offset.accumulator(heads, queries)
    if mask is not None and mask.dtype != torch.bool:
        mask_rows = mask[0 if mask.size(0) == 1 else b, heads, queries]
        bias = mask_rows if bias is None else torch.add(mask_rows, bias, out=out)
    if bias is None:
        logits = torch.baddbmm(q.new_empty(()), q[index], k_t, beta=0, alpha=scale, out=out)
    elif bias is out:
        logits = out.baddbmm_(q[index], k_t, alpha=scale)
    else:
        logits = torch.baddbmm(bias, q[index], k_t, alpha=scale, out=out)
    if offset is not None:
        offset.add_(logits, heads, queries)
    if mask is not None and mask.dtype == torch.bool:
        logits.masked_fill_(~mask[b], torch.finfo(logits.dtype).min)
    return logits


def _normal_probabilities_(probs, biased):
    """``probs`` with those below NEGLIGIBLE_PROBABILITY set to 0, in place, when ``biased`` (see there)."""
    if not biased:
        return probs
    return torch.threshold_(probs, NEGLIGIBLE_PROBABILITY, 0.0)


def _biased(mask, offset):
    """Whether the logits carry an additive bias: a bias of the offset or a float mask (a boolean mask is
    key padding alone)."""
    return offset is not None or (mask is not None and mask.dtype != torch.bool)


class DoubleBackwardError(RuntimeError):
    """A gradient of a gradient (``create_graph=True``) asked through a CPU attention kernel."""


def _refuse_double_backward(kernel):
    """Raise :class:`DoubleBackwardError` when this backward is asked to build a graph of its own: the
    backward runs with gradients enabled only under ``create_graph=True``. Its arithmetic (the compiled
    kernel, blocks written in place) has no gradient: torch would warn that the compiled op has no autograd
    kernel and hand on gradients that are wrong (NaN a step later)."""
    if torch.is_grad_enabled():
        raise DoubleBackwardError(
            f"a gradient of a gradient (create_graph=True) through the CPU attention kernel {kernel} is not "
            "supported: its backward has no gradient of its own; run the forward on the explicit path "
            "(need_attn=True: torch's operations, which have one) for second-order gradients")


def _as_float32(*tensors):
    """The tensors (None kept) in float32 at least."""
    return tuple(None if t is None else t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors)


class BiasedFlashAttention(torch.autograd.Function):
    """Dropout-free attention with an additive ``mask`` or a bias of the offset (``rows`` with the reset's
    edges) that needs a gradient (see the module docstring); ``mask_gradient``, a
    :class:`~.shared_mask_gradient.SharedMaskGradient`, takes the mask's gradient where given."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, rows=None, edge_row=None, edge_col=None, mask_gradient=None):
        ctx.scale, ctx.dtype = scale, q.dtype
        ctx.mask_gradient = mask_gradient if ctx.needs_input_grad[3] else None
        if rows is None:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, False, attn_mask=mask.detach(), scale=scale
            )
            ctx.save_for_backward(q, k, v, mask, out, lse)
            return out
        with torch.autocast("cpu", enabled=False):  # float32 arithmetic under CPU autocast too
            return _offset_forward(ctx, q, k, v, mask, scale, rows, edge_row, edge_col)

    @staticmethod
    def backward(ctx, grad_out):
        _refuse_double_backward("BiasedFlashAttention")
        if len(ctx.saved_tensors) == 9:
            with torch.autocast("cpu", enabled=False):
                return _offset_backward(ctx, grad_out)
        q, k, v, mask, out, lse = ctx.saved_tensors
        mask_grad = ctx.needs_input_grad[3]  # not for a fixed bias: no (1 or B, H, T, T) gradient is written
        compiled = compiled_kernels.biased_attention_backward()
        if compiled is not None and _compiled_backward_applies(q, k, v, mask):
            rows = max(MIN_BLOCK_ROWS, BLOCK_LOGITS // q.size(2))
            # the kernel reads the rows where they are (a projection's (B, T, 3, H, D) layout, the flash
            # output's (B, T, H, D)): copies to (B, H, T, D) cost more than they save at T = 128 (1.03-1.28 x
            # the backward) and as much as they save at T = 512
            q, k, v, out, grad_out = (_with_contiguous_rows(t) for t in (q, k, v, out, grad_out))
            grads = compiled(q, k, v, out, grad_out, lse.contiguous(), mask, ctx.scale, rows,
                             mask_grad=mask_grad, **_shared_buffer(ctx.mask_gradient, mask, q))
            grad_mask = grads[3] if mask_grad and ctx.mask_gradient is None else None
            return *grads[:3], grad_mask, None, None, None, None, None
        logits_mask = mask.to(q.dtype)

        def probs_of(index):
            probs = torch.softmax(_block_logits(q, k, logits_mask, ctx.scale, index), dim=-1)
            return _normal_probabilities_(probs, True)  # an additive mask: as the compiled backward

        mask_shape = mask.shape if mask_grad else None
        grad_q, grad_k, grad_v, grad_mask = _backward(q, k, v, out, grad_out, ctx.scale, mask_shape, probs_of,
                                                      mask_gradient=ctx.mask_gradient)
        grad_mask = None if ctx.mask_gradient is not None else grad_mask
        return grad_q, grad_k, grad_v, grad_mask, None, None, None, None, None


def _offset_forward(ctx, q, k, v, mask, scale, rows, edge_row, edge_col):
    """BiasedFlashAttention's forward with a bias of the offset, in float32 at least: the output and each
    row's log-sum-exp, by blocks of query rows, each the CPU flash kernel with the block's bias as its mask
    (:func:`_block_bias`; at T = 2048, 4 heads, faster than SDPA given the dense (H, T, T) bias, 70 against
    83 ms, and 3.3 x faster than the blocks' softmax in Python). A block's bias is built once for every
    batch row unless a mask of its own (key padding, a mask per batch row) adds to it: at T = 512, 8 heads,
    B = 2, one thread, as fast as one flash call given the dense bias (14.2 against 14.4 ms; per batch row,
    16.2 ms)."""
    q, k, v, rows = _as_float32(q, k, v, rows)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.detach().to(q.dtype)
    batch, heads, seq_len, _ = q.shape
    offset = _offset_bias(rows, edge_row, edge_col, q, False)
    # the output in the (B, T, H, D) layout, as the flash kernel returns it: the layer's merge of the heads
    # is then a view, not a copy that the output projection would keep beside it
    out = v.new_empty(batch, seq_len, heads, v.size(-1)).transpose(1, 2)
    lse = q.new_empty(batch, heads, seq_len, 1)
    per_row = mask is not None and mask.size(0) > 1
    for index in _blocks(batch if per_row else 1, heads, seq_len, _block_rows(seq_len, True)):
        b, h, queries = index
        batch_rows = slice(b, b + 1) if per_row else slice(None)
        block_out, block_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[batch_rows, h, queries], k[batch_rows, h], v[batch_rows, h], 0.0, False,
            attn_mask=_block_bias(mask, index, offset)[None], scale=scale)[:2]
        out[batch_rows, h, queries] = block_out
        lse[batch_rows, h, queries] = block_lse[..., None]
    ctx.save_for_backward(q, k, v, mask, out, lse, rows, edge_row, edge_col)
    return out.to(ctx.dtype)


def _block_bias(mask, index, offset):
    """mask + bias of the offset of one block (heads, m, T), the rows' view itself where nothing else adds
    to it; a boolean key-padding mask fills the padded keys."""
    b, heads, queries = index
    bias = offset.accumulator(heads, queries)
    if mask is not None and mask.dtype != torch.bool:
        mask_rows = mask[0 if mask.size(0) == 1 else b, heads, queries]
        bias = mask_rows.clone() if bias is None else bias + mask_rows
    elif bias is None:
        bias = offset.zeros(heads, queries)
    elif offset.edge_row is not None:
        bias = bias.clone()
    offset.add_(bias, heads, queries)
    if mask is not None and mask.dtype == torch.bool:
        bias = bias.masked_fill(~mask[b], torch.finfo(bias.dtype).min)
    return bias


def _offset_backward(ctx, grad_out):
    """BiasedFlashAttention's backward with a bias of the offset: the compiled kernel where it applies, else
    the blocks' logits recomputed, P from the forward's log-sum-exp."""
    q, k, v, mask, out, lse, rows, edge_row, edge_col = ctx.saved_tensors
    shared = ctx.mask_gradient
    mask_grad = ctx.needs_input_grad[3]
    # a shared buffer that takes the rows' gradient gives it from the summed dS (GatherMaskGradient)
    rows_grad = any(ctx.needs_input_grad[5:8]) and not (shared is not None and shared.takes_offset)
    grad_out = grad_out.to(q.dtype)
    compiled = compiled_kernels.biased_attention_backward()
    if compiled is not None and _compiled_backward_applies(q, k, v, mask, rows):
        key_bias = None
        if mask is not None and mask.dtype == torch.bool:
            keep = mask.expand(q.size(0), 1, 1, q.size(2))[:, 0, 0]
            mask, key_bias = None, q.new_zeros(keep.shape).masked_fill_(~keep, torch.finfo(q.dtype).min)
        edges = (None, None) if edge_row is None else (edge_row.to(q.dtype).contiguous(),
                                                        edge_col.to(q.dtype).contiguous())
        block = max(MIN_BLOCK_ROWS, BLOCK_LOGITS // q.size(2))
        grads = compiled(q, k, v, out, _with_contiguous_rows(grad_out), lse, mask, ctx.scale, block,
                         rows.to(q.dtype).contiguous(), *edges, key_bias, rows_grad, mask_grad,
                         **_shared_buffer(shared, mask, q))
        grad_q, grad_k, grad_v = grads[:3]
        grad_mask = grads[3] if mask_grad else None
        offset_grads = (None, None, None) if not rows_grad else \
            (grads[4].sum(0), *((None, None) if edge_row is None else (grads[5].sum(0), grads[6].sum(0))))
    else:
        offset = _offset_bias(rows, edge_row, edge_col, q, rows_grad)

        def probs_of(index):
            logits = _block_logits(q, k, mask, ctx.scale, index, offset)
            return _normal_probabilities_(logits.sub_(lse[index]).exp_(), True)  # a bias of the offset

        mask_shape = mask.shape if mask_grad else None
        grad_q, grad_k, grad_v, grad_mask = _backward(q, k, v, out, grad_out, ctx.scale, mask_shape, probs_of,
                                                      offset=offset, mask_gradient=shared)
        offset_grads = offset.gradients()
    grad_mask = None if shared is not None else grad_mask  # in the shared buffer, handed on from there
    return (*(g.to(ctx.dtype) for g in (grad_q, grad_k, grad_v)), grad_mask, None, *offset_grads, None)


def _shared_buffer(mask_gradient, mask, like):
    """The compiled backward's arguments that make it write (the first layer of a backward pass) or add (the
    others) the mask's gradient into ``mask_gradient``'s buffer (none without one)."""
    if mask_gradient is None:
        return {}
    buffer, written = mask_gradient.buffer(mask.shape, like)
    return {"grad_mask": buffer, "grad_mask_add": written}


def _with_contiguous_rows(t):
    """``t`` (B, H, T, D) itself where each of its rows is contiguous and apart from the next, else a copy."""
    return t if t.stride(-1) == 1 and (t.size(-2) == 1 or t.stride(-2) >= t.size(-1)) else t.contiguous()


def _compiled_backward_applies(q, k, v, mask, rows=None):
    """Whether the compiled backward takes these tensors: float32 or float64, one dtype, q and k of one
    shape, and a contiguous mask of (1 or B, H, T, T), or with ``rows`` (a bias of the offset) no mask or a
    boolean key-padding one."""
    batch, heads, seq_len, _ = q.shape
    shapes = (q.dtype in (torch.float32, torch.float64) and all(t.dtype == q.dtype for t in (k, v))
              and k.shape == q.shape and v.shape[:3] == q.shape[:3])
    if rows is not None and (mask is None or mask.dtype == torch.bool):
        return shapes
    return (shapes and mask.dtype == q.dtype and mask.is_contiguous() and mask.dim() == 4
            and mask.size(0) in (1, batch) and mask.shape[1:] == (heads, seq_len, seq_len))


class ChunkedAttention(torch.autograd.Function):
    """Attention with dropout (and an optional mask, boolean or additive, learned or not, and an optional bias
    of the offset) on CPU, by blocks; the arithmetic is float32 whatever the inputs' dtype (under CPU autocast
    too), the output in q's."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, q, k, v, mask, scale, dropout, rows=None, edge_row=None, edge_col=None,
                mask_gradient=None):
        dtype = q.dtype
        ctx.mask_dtype = None if mask is None else mask.dtype
        q, k, v, rows = _as_float32(q, k, v, rows)
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.detach().to(q.dtype)
        batch, heads, seq_len, _ = q.shape
        offset = _offset_bias(rows, edge_row, edge_col, q, False)
        biased = _biased(mask, offset)
        probs = q.new_empty(batch, heads, seq_len, seq_len)
        keep = keep_mask(probs.shape, dropout, q.device) if dropout > 0 else None
        out = v.new_empty(batch, heads, seq_len, v.size(-1))
        for index in _blocks(batch, heads, seq_len, _block_rows(seq_len, offset is not None)):
            # the logits are computed in the probabilities' place and normalised there (row by row: the
            # softmax reads a row's logits before it writes the row)
            logits = _block_logits(q, k, mask, scale, index, offset, out=probs[index])
            block = _normal_probabilities_(torch.ops.aten._softmax.out(logits, -1, False, out=logits), biased)
            torch.bmm(block if keep is None else block * keep[index], v[index[0], index[1]], out=out[index])
        keep_prob = keep_probability(dropout, q.device.type)
        if keep is not None:
            out.mul_(1.0 / keep_prob)
        ctx.save_for_backward(q, k, v, probs, keep, out, rows, edge_row, edge_col)
        ctx.scale, ctx.keep_prob, ctx.dtype = scale, keep_prob, dtype
        ctx.mask_shape = mask.shape if ctx.needs_input_grad[3] else None
        # the shared buffer only where this call's mask gradient goes to it
        ctx.mask_gradient = mask_gradient if ctx.mask_shape is not None else None
        return out.to(dtype)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_out):
        _refuse_double_backward("ChunkedAttention")
        q, k, v, probs, keep, out, rows, edge_row, edge_col = ctx.saved_tensors
        # the probabilities are kept: the rows are laid out again only for their gradient, and not where a
        # shared buffer that takes it gives it from the summed dS (GatherMaskGradient)
        offset_grad = any(ctx.needs_input_grad[6:9]) and not (ctx.mask_gradient is not None
                                                              and ctx.mask_gradient.takes_offset)
        offset = _offset_bias(rows, edge_row, edge_col, q, True, reads=False) if offset_grad else None
        grad_q, grad_k, grad_v, grad_mask = _backward(
            q, k, v, out, grad_out.to(q.dtype), ctx.scale, ctx.mask_shape, probs.__getitem__, keep,
            ctx.keep_prob, offset, ctx.mask_gradient
        )
        if ctx.mask_gradient is not None:  # the mask's gradient is in the shared buffer, handed on from there
            grad_mask = None
        grad_mask = None if grad_mask is None else grad_mask.to(ctx.mask_dtype)
        offset_grads = (None, None, None) if offset is None else offset.gradients()
        return (grad_q.to(ctx.dtype), grad_k.to(ctx.dtype), grad_v.to(ctx.dtype), grad_mask, None, None,
                *offset_grads, None)
