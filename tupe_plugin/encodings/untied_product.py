"""TUPE's untied product multiplied out once per forward, in memory kept from one training step to the next.

The folded untied term, per head (p U^Q_h)(p U^K_h)^T / sqrt(2 d_h) (Ke, He, Liu, "Rethinking Positional
Encoding in Language Pre-training", arXiv 2006.15595, Eq. 7), is one (H, T, T) tensor a forward, and its
gradient, the sum of every layer's dS, is another (the product's own memory where the CPU kernels can write
it there: :mod:`tupe_plugin.attention.shared_mask_gradient`). On CPU a fresh tensor that large is memory new
from the operating system (glibc serves blocks over 32 MiB by ``mmap`` and unmaps them when freed), and its
first writing, page by page, costs about three times the product (T = 4096, 4 heads: 125 against 39 ms).
:class:`ProductMemory` keeps the storage of a backward's gradient, which nothing reads after it, and the next
forward writes its product there where nothing else holds that storage any more; a forward without
gradients (evaluation) lets it go.
"""

import math

import torch

# Products (and gradients) from this size on are kept for the next step: glibc's largest threshold for
# serving a block by mmap (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems); a smaller freed block stays in
# the heap, and the next allocation of its size is served from there without new pages.
KEPT_FROM_BYTES = 32 * 2**20


class ProductMemory:
    """The storage of the untied product's last gradient, kept for the next forward's product (one per
    model; not part of its state: a copy of the model starts without it)."""

    def __init__(self):
        self._storage = None

    def __deepcopy__(self, memo):
        return ProductMemory()

    def __getstate__(self):
        return {"_storage": None}

    def held_bytes(self):
        """Bytes kept between steps."""
        return 0 if self._storage is None else self._storage.nbytes()

    def release(self):
        """Let the kept storage go."""
        self._storage = None

    def tensor(self, shape, like):
        """An uninitialised tensor of ``shape`` in ``like``'s dtype and device: on the kept storage where it
        is large enough and this object is the only one holding it, else fresh; the storage is no longer kept
        either way."""
        storage, self._storage = self._storage, None
        nbytes = math.prod(shape) * like.element_size()
        if (storage is not None and storage.nbytes() >= nbytes
                and torch._C._storage_Use_Count(storage._cdata) == 1):
            return like.new_empty(0).set_(storage, 0, shape)
        return like.new_empty(shape)

    def keep(self, tensor):
        """Keep ``tensor``'s storage for the next forward where it is CPU memory of KEPT_FROM_BYTES or
        more."""
        storage = tensor.untyped_storage()
        if tensor.device.type == "cpu" and storage.nbytes() >= KEPT_FROM_BYTES:
            self._storage = storage


class UntiedProduct(torch.autograd.Function):
    """q k^T per head: (H, T, d) and (H, T', d) -> (H, T, T'), written in ``memory``'s kept storage where it
    can be; the backward keeps its gradient's storage in ``memory`` for the next forward."""

    @staticmethod
    def forward(ctx, q, k, memory):
        ctx.save_for_backward(q, k)
        ctx.memory = memory
        out = memory.tensor((q.size(0), q.size(1), k.size(1)), q)
        return torch.bmm(q, k.transpose(1, 2), out=out)

    @staticmethod
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        grad_q = torch.bmm(grad, k) if ctx.needs_input_grad[0] else None
        grad_k = torch.bmm(grad.transpose(1, 2), q) if ctx.needs_input_grad[1] else None
        ctx.memory.keep(grad)
        return grad_q, grad_k, None


def untied_product(q, k, memory=None):
    """q k^T per head (:class:`UntiedProduct`): through ``memory`` (a :class:`ProductMemory`) where a training
    forward on CPU, outside autocast, makes a product of KEPT_FROM_BYTES or more; else torch's ``bmm``."""
    kept = (memory is not None and torch.is_grad_enabled() and q.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu") and q.dtype == k.dtype
            and q.size(0) * q.size(1) * k.size(1) * q.element_size() >= KEPT_FROM_BYTES)
    if kept:
        return UntiedProduct.apply(q, k, memory)
    return torch.bmm(q, k.transpose(1, 2))
