"""One gradient buffer for the dense mask that every layer's CPU kernel reads
(:class:`~.cpu_kernels.ChunkedAttention`, :class:`~.cpu_kernels.BiasedFlashAttention` and its compiled
backward).

TUPE's untied product (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training",
arXiv 2006.15595, Eq. 7: one (H, T, T) term for the whole model) reaches every layer's kernel as one
additive mask. Left to autograd, each layer's backward would return a fresh (1, H, T, T) gradient (memory
first touched, dS copied in block by block) and autograd would add them up, one more pass over (H, T, T) a
layer. Instead :func:`gather_mask_gradient` puts :class:`GatherMaskGradient` between the mask and the
layers: each kernel's backward computes (the first) or adds (the others) its blocks' dS in
:class:`SharedMaskGradient`'s one buffer and returns no gradient for the mask, and
:class:`GatherMaskGradient`'s backward, which autograd runs after every layer that read the mask, hands the
buffer on (plus the gradient of the mask's other readers). The buffer is the mask's own memory where
nothing else holds it by the backward (the chunked layers' forward read the mask, their backward the
probabilities they kept; the biased flash layers keep the mask for their backward, and so get a buffer of
its own, one a backward pass): a fresh (H, T, T) tensor's first writing costs more than the product it
holds. A learned bias of
the offset that the kernels add beside the mask (TUPE-R's T5 rows past T = 512, :mod:`.offset_rows`) takes
its gradient from the same buffer, folded by offset once (:func:`~.offset_rows.dense_gradient_folded`),
rather than from every layer's blocks.
"""

import torch

from .offset_rows import dense_gradient_folded


class SharedMaskGradient:
    """The mask's gradient summed over the layers of one backward pass: the buffer the kernels write into,
    taken by :class:`GatherMaskGradient`. A buffer left by a backward pass that did not reach the mask
    (``torch.autograd.grad`` with other inputs) is not added to by the next one. ``takes_offset``: the
    gradient of the bias of the offset that the kernels add beside the mask comes from the buffer too
    (the kernels compute none)."""

    def __init__(self, mask, takes_offset=False):
        self._buffer = None
        self._pass = None
        self._spent_mask = mask.detach()
        self.takes_offset = takes_offset

    def buffer(self, shape, like):
        """(buffer of ``shape`` in ``like``'s dtype, whether a kernel already wrote all of it this pass)."""
        backward_pass = torch._C._current_graph_task_id()
        if self._buffer is not None and self._pass == backward_pass:
            return self._buffer, True
        self._buffer, self._pass = self._reused_mask(shape, like), backward_pass
        if self._buffer is None:
            self._buffer = like.new_empty(shape)
        return self._buffer, False

    def _reused_mask(self, shape, like):
        """The mask's own memory for the first buffer, where nothing but this object holds it any more (the
        layers' forward were its only readers): a fresh (H, T, T) tensor's first writing, page by page, costs
        more than its arithmetic (T = 4096: 0.1 s). None where another tensor, view or saved tensor still
        holds that memory, or it does not fit."""
        mask, self._spent_mask = self._spent_mask, None
        if mask is None or mask.shape != shape or mask.dtype != like.dtype or not mask.is_contiguous():
            return None
        # two references: ``mask`` and the storage object that asks
        return mask if torch._C._storage_Use_Count(mask.untyped_storage()._cdata) == 2 else None

    def take(self):
        """The buffer written in this backward pass (None if no kernel wrote one), and forget it."""
        buffer = self._buffer if self._pass == torch._C._current_graph_task_id() else None
        self._buffer = self._pass = None
        return buffer


class GatherMaskGradient(torch.autograd.Function):
    """The mask itself forward; backward, the kernels' summed gradient in ``shared`` (in the mask's dtype)
    plus the gradient of the mask's other readers, and where ``shared`` takes the offset's, the gradients of
    the bias of the offset's ``rows`` (H, 2T - 1) and [CLS] reset ``cls`` (H, 2) or None that the kernels add
    beside the mask (inputs here for their gradients only)."""

    @staticmethod
    def forward(ctx, mask, shared, rows=None, cls=None):
        ctx.set_materialize_grads(False)
        ctx.shared, ctx.dtype, ctx.with_reset = shared, mask.dtype, cls is not None
        ctx.offset_dtypes = None if rows is None else (rows.dtype, None if cls is None else cls.dtype)
        return mask.view_as(mask)

    @staticmethod
    def backward(ctx, grad):
        total = ctx.shared.take()
        if total is None:
            return grad, None, None, None
        offset_grads = (None, None)
        if ctx.offset_dtypes is not None:
            offset_grads = dense_gradient_folded(total, ctx.with_reset)
            offset_grads = tuple(None if g is None else g.to(dtype)
                                 for g, dtype in zip(offset_grads, ctx.offset_dtypes))
        total = total.to(ctx.dtype)
        return total if grad is None else total.add_(grad), None, *offset_grads


def gather_mask_gradient(mask, rows=None, cls=None):
    """(the mask the layers read, the :class:`SharedMaskGradient` their kernels add to, or None where the mask
    needs no gradient). With the ``rows`` (H, 2T - 1) of a bias of the offset and its [CLS] reset ``cls``
    (H, 2) or None that the kernels add beside the mask, learned, their gradients come from the buffer too."""
    if mask is None or not (torch.is_grad_enabled() and mask.requires_grad):
        return mask, None
    takes_offset = rows is not None and (rows.requires_grad or (cls is not None and cls.requires_grad))
    shared = SharedMaskGradient(mask, takes_offset)
    if not takes_offset:
        return GatherMaskGradient.apply(mask, shared), shared
    return GatherMaskGradient.apply(mask, shared, rows, cls), shared
