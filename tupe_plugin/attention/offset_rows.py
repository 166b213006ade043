"""A bias of the offset j - i alone in its O(T) form: the Toeplitz rows per head, and the [CLS] reset.

T5's buckets, ALiBi, KERPLE, Sandwich and FIRE (the ``--rel-pos`` biases; TUPE Eq. 5 / 8, Ke, He, Liu,
"Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595) are fixed by 2T - 1 values a
head: ``rows`` (H, 2T - 1), the bias of query i and key j being ``rows[h, j - i + T - 1]``. TUPE's [CLS]
reset (Eq. 9-11) is two values a head, ``cls`` (H, 2): theta_1 replaces row 0, theta_2 column 0 of the rows
i != 0.

Their dense (H, T, T) form, the twin and what the paths that take a dense bias read, is the encodings'
(:func:`tupe_plugin.encodings.offset_bias.toeplitz`). The CPU kernels never build it: :class:`OffsetRows`
adds the bias of a block of query rows to its logits and sums the block's gradient back by offset (j - i)
into (H, 2T - 1) (:func:`dense_gradient_folded` folds a dense (B, H, T, T) gradient the same way), with the
compiled ops of ``offset_rows.cpp``, which read row i's bias as the stretch ``rows[h, T - 1 - i ..]``, or
where they cannot be built through :class:`PeriodicRows`, which lays the rows out once per call so that the
bias of any block is a strided view (no copy). The reset reaches them as
:func:`edges`, what it adds to row 0 and column 0 over the Toeplitz values, so that its gradient, and the
exclusion of the cells it replaces from the rows' gradient, follow by autograd on O(T) tensors.
"""

import torch

from . import compiled_kernels

# Cells of a head's block of query rows when a dense gradient is folded (:func:`dense_gradient_folded`): the
# periodic layout holds 2 T a block row.
BLOCK_CELLS = 2**19


def seq_len_of(rows):
    """T of rows (H, 2T - 1)."""
    return (rows.size(-1) + 1) // 2


def edges(rows, cls):
    """(row, column), each (H, T): what the reset ``cls`` adds to the Toeplitz values of row 0 (every key)
    and of column 0 (the rows i != 0; the column's entry 0 is 0) to replace them."""
    seq_len = seq_len_of(rows)
    cls = cls.to(rows.dtype)
    row = cls[:, :1] - rows[:, seq_len - 1:]
    # column 0 of row i holds rows[T - 1 - i]: offsets T - 2 .. 0 for i = 1 .. T - 1
    column = torch.cat([torch.zeros_like(cls[:, :1]), cls[:, 1:] - rows[:, : seq_len - 1].flip(-1)], -1)
    return row, column


class PeriodicRows:
    """``rows`` (H, 2T - 1) repeated with period P = 2T - 1, so that the (m, T) bias of query rows
    i0 .. i0 + m - 1 is the view of row stride P - 1 at offset (T - 1 - i0) mod P: entry (r, j) lies at
    (T - 1 - i0) + r (P - 1) + j, which is j - (i0 + r) + T - 1 modulo P. The rows of the view do not overlap
    (P - 1 >= T), so a gradient buffer of the same layout takes a block's gradient by one addition through the
    same view; :meth:`folded` sums it back by offset. ``values=False``: the layout of the gradient alone (a
    backward that does not read the bias)."""

    def __init__(self, rows, block_rows, values=True):
        heads, period = rows.shape
        self.seq_len, self.period, self.block_rows = seq_len_of(rows), period, block_rows
        self.length = period + (block_rows - 1) * (period - 1) + self.seq_len
        repeats = -(-self.length // period)
        self.values = rows.detach().contiguous().repeat(1, repeats) if values else None
        self.rows, self.layout = rows.detach(), (heads, repeats * period)
        self.grad = None

    def view(self, buffer, heads, queries):
        """The (heads, m, T) view of ``buffer`` (H, repeats P) for the query rows of the slice ``queries``."""
        first = queries.start
        rows = queries.stop - first
        if rows > self.block_rows:
            raise ValueError(f"a block of {rows} query rows in a layout for {self.block_rows}")
        offset = (self.seq_len - 1 - first) % self.period
        head_stride = buffer.stride(0)
        return buffer.as_strided((heads.stop - heads.start, rows, self.seq_len),
                                 (head_stride, self.period - 1, 1),
                                 buffer.storage_offset() + heads.start * head_stride + offset)

    def bias(self, heads, queries):
        """The bias of ``heads`` (a slice) and the query rows ``queries`` (a slice), a view."""
        return self.view(self.values, heads, queries)

    def add_gradient(self, grad, heads, queries):
        """Add ``grad`` (heads, m, T), the logits' gradient of these rows, to the rows' gradient."""
        if self.grad is None:
            self.grad = self.rows.new_zeros(self.layout)
        self.view(self.grad, heads, queries).add_(grad)

    def folded(self):
        """The rows' gradient (H, 2T - 1): the buffer summed by offset (zeros when nothing was added)."""
        if self.grad is None:
            return self.rows.new_zeros(self.rows.shape)
        return self.grad.view(self.grad.size(0), -1, self.period).sum(1)


class OffsetRows:
    """The rows (H, 2T - 1) as blocks of at most ``block_rows`` query rows read them, and their gradient:
    the compiled ops where the plugin's library builds (:func:`~.compiled_kernels.offset_rows_ops`), else
    :class:`PeriodicRows`. A block reads its bias through :meth:`accumulator` (the periodic rows' view, for a
    product to accumulate into) and :meth:`add_` (the compiled add, after the product); ``values=False``:
    the gradient alone."""

    def __init__(self, rows, block_rows, values=True):
        self.ops = (compiled_kernels.offset_rows_ops() if rows.dtype in (torch.float32, torch.float64)
                    else None)
        self.rows = rows.detach().contiguous()
        self.periodic = None if self.ops is not None else PeriodicRows(self.rows, block_rows, values)
        self.grad = None

    def accumulator(self, heads, queries):
        """The bias of ``heads`` and ``queries`` (slices) as a view that a product may accumulate into, or
        None where :meth:`add_` adds it."""
        return None if self.periodic is None else self.periodic.bias(heads, queries)

    def add_(self, logits, heads, queries):
        """Add the bias of ``heads`` and ``queries`` to ``logits`` (heads, m, T) unless :meth:`accumulator`
        gave it."""
        if self.ops is not None:
            self.ops[0](logits, self.rows, heads.start, queries.start)

    def add_gradient(self, grad, heads, queries):
        """Add ``grad`` (heads, m, T), the logits' gradient of these rows, to the rows' gradient."""
        if self.periodic is not None:
            self.periodic.add_gradient(grad, heads, queries)
            return
        if self.grad is None:
            self.grad = torch.zeros_like(self.rows)
        self.ops[1](self.grad, grad if grad.stride(-1) == 1 else grad.contiguous(),
                    heads.start, queries.start)

    def folded(self):
        """The rows' gradient (H, 2T - 1), summed by offset (zeros when nothing was added)."""
        if self.periodic is not None:
            return self.periodic.folded()
        return torch.zeros_like(self.rows) if self.grad is None else self.grad


def dense_gradient_folded(grad, with_reset):
    """The gradients of ``rows`` (H, 2T - 1) and of the reset ``cls`` (H, 2), or None without one, from the
    gradient ``grad`` (B, H, T, T) of the dense bias they make (every batch row's gradient summed): the cells'
    gradients summed by offset j - i, those of the reset's cells (row 0, column 0 of the rows i != 0) to
    ``cls`` instead. By blocks of query rows through :class:`OffsetRows`, as the kernels fold theirs."""
    dense = grad[0] if grad.size(0) == 1 else grad.sum(0)
    heads, seq_len = dense.shape[0], dense.shape[-1]
    block_rows = min(seq_len, max(1, BLOCK_CELLS // seq_len))
    offset_rows = OffsetRows(dense.new_empty(heads, 2 * seq_len - 1), block_rows, values=False)
    for first in range(0, seq_len, block_rows):
        queries = slice(first, min(first + block_rows, seq_len))
        offset_rows.add_gradient(dense[:, queries], slice(0, heads), queries)
    rows = offset_rows.folded()
    if not with_reset:
        return rows, None
    first_row, first_column = dense[:, 0], dense[:, 1:, 0]
    rows[:, seq_len - 1:] -= first_row
    # column 0 of row i holds rows[T - 1 - i]: offsets T - 2 .. 0 for i = 1 .. T - 1
    rows[:, : seq_len - 1] -= first_column.flip(-1)
    return rows, torch.stack([first_row.sum(-1), first_column.sum(-1)], -1)
