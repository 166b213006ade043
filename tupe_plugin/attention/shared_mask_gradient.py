"""One gradient buffer for the dense mask that every layer's :class:`~.cpu_kernels.ChunkedAttention` reads.

TUPE's untied product (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training",
arXiv 2006.15595, Eq. 7: one (H, T, T) term for the whole model) reaches every layer's kernel as one
additive mask. Left to autograd, each layer's backward would return a fresh (1, H, T, T) gradient (memory
first touched, dS copied in block by block) and autograd would add them up, one more pass over (H, T, T) a
layer. Instead :func:`gather_mask_gradient` puts :class:`GatherMaskGradient` between the mask and the
layers: each kernel's backward computes (the first) or adds (the others) its blocks' dS in
:class:`SharedMaskGradient`'s one buffer and returns no gradient for the mask, and
:class:`GatherMaskGradient`'s backward, which autograd runs after every layer that read the mask, hands the
buffer on (plus the gradient of the mask's other readers).
"""

import torch


class SharedMaskGradient:
    """The mask's gradient summed over the layers of one backward pass: the buffer the kernels write into,
    taken by :class:`GatherMaskGradient`. A buffer left by a backward pass that did not reach the mask
    (``torch.autograd.grad`` with other inputs) is not added to by the next one."""

    def __init__(self):
        self._buffer = None
        self._pass = None

    def buffer(self, shape, like):
        """(buffer of ``shape`` in ``like``'s dtype, whether a kernel already wrote all of it this pass)."""
        backward_pass = torch._C._current_graph_task_id()
        if self._buffer is not None and self._pass == backward_pass:
            return self._buffer, True
        self._buffer, self._pass = like.new_empty(shape), backward_pass
        return self._buffer, False

    def take(self):
        """The buffer written in this backward pass (None if no kernel wrote one), and forget it."""
        buffer = self._buffer if self._pass == torch._C._current_graph_task_id() else None
        self._buffer = self._pass = None
        return buffer


class GatherMaskGradient(torch.autograd.Function):
    """The mask itself forward; backward, the kernels' summed gradient in ``shared`` (in the mask's dtype)
    plus the gradient of the mask's other readers."""

    @staticmethod
    def forward(ctx, mask, shared):
        ctx.set_materialize_grads(False)
        ctx.shared, ctx.dtype = shared, mask.dtype
        return mask.view_as(mask)

    @staticmethod
    def backward(ctx, grad):
        total = ctx.shared.take()
        if total is None:
            return grad, None
        total = total.to(ctx.dtype)
        return total if grad is None else total.add_(grad), None


def gather_mask_gradient(mask):
    """(the mask the layers read, the :class:`SharedMaskGradient` their kernels add to, or None where the mask
    needs no gradient)."""
    if mask is None or not (torch.is_grad_enabled() and mask.requires_grad):
        return mask, None
    shared = SharedMaskGradient()
    return GatherMaskGradient.apply(mask, shared), shared
