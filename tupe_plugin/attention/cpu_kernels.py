"""The CPU attention kernels for what SDPA cannot run fast there (chosen by :mod:`.paths`).

:class:`ChunkedAttention` runs attention with dropout (SDPA has no fused CPU kernel for it and its math
fallback is slower still): matmul-softmax-dropout-matmul one cache-sized chunk of heads of one batch row
at a time, the mask (a learned bias included) added inside the logits' product, the probabilities and the
keep-mask kept for an exact backward that reduces the bias gradient in the same chunk.
:class:`BiasedFlashAttention` runs dropout-free attention whose additive mask needs a gradient (SDPA would
take its slow math path): the CPU flash kernel forward with the mask as a constant, then an exact backward
that keeps no (B, H, T, T) tensor: the compiled kernel of :mod:`.compiled_kernels` (blocks of query rows,
the mask's gradient in the pass that computes dS) where it can be built, else the chunked backward below.

Both compute ``softmax(scale * q k^T + mask) v`` (with dropout: the probabilities times a keep-mask over
the keep probability) and share one backward over chunks of heads of one batch row
(:func:`_chunk_gradients`): from the probabilities ``P`` of the chunk and the softmax gradient
``dS = P * (dP - rowsum(dO * O))``, where ``dP = dO v^T`` (times the keep-mask over the keep probability
with dropout), come dq = scale dS k, dk = scale (q^T dS)^T, dv = (dO^T P~)^T with ``P~`` the dropped
probabilities, and the mask gradient dS (summed over the batch when the mask is shared).
:class:`BiasedFlashAttention` recomputes ``P`` in the backward (one ``baddbmm`` and one softmax per chunk);
:class:`ChunkedAttention` keeps ``P`` (and the keep-mask, one byte an element) from its forward. At most
``CHUNK_LOGITS`` logits live at a time; heads are the outer loop, so that a shared bias chunk and its
gradient stay in cache while every batch row reads and adds to them. The explicit path of
:mod:`.attend` is their step-by-step twin in the tests.
"""


import torch

from . import compiled_kernels
from .dropout import keep_mask, keep_probability

# Logits of one chunk (heads of one batch row): 1 MiB of float32, which stays in the CPU's caches
# while it is normalised, dropped, multiplied and reduced.
CHUNK_LOGITS = 2**18

# The compiled backward's block of query rows: BLOCK_LOGITS logits (1 MiB of float32, as much again for
# their gradient), at least MIN_BLOCK_ROWS rows. Larger than an L2 cache, yet faster than L2-sized blocks
# (256 KiB: 1.06 x slower at T = 512): dk and dv come from fewer, deeper GEMMs (docs/benchmarks.md).
BLOCK_LOGITS = 2**18
MIN_BLOCK_ROWS = 16


def _chunks(batch, heads, seq_len):
    """(batch row, slice of heads) of every chunk, heads outer (see the module docstring)."""
    group = min(heads, max(1, CHUNK_LOGITS // (seq_len * seq_len)))
    for start in range(0, heads, group):
        for b in range(batch):
            yield b, slice(start, start + group)


def _chunk_gradients(q, k, v, grad_out, minus_delta, probs, keep, grads, index):
    """The gradients of one chunk (``index`` = (b, heads)) written into ``grads`` = (dq, dk^T, dv^T);
    ``grad_out`` already divided by the keep probability when ``keep`` is given. Returns dS (the
    unscaled logits' gradient, also the mask's)."""
    q, k, v, grad_out = q[index], k[index], v[index], grad_out[index]
    if keep is None:
        grad_logits = torch.baddbmm(minus_delta[index], grad_out, v.transpose(-1, -2)).mul_(probs)
        dropped = probs
    else:
        # P * (keep * dP + minus_delta) as (P * keep) * dP + P * minus_delta: P * keep is dv's factor anyway
        dropped = probs * keep
        grad_logits = torch.bmm(grad_out, v.transpose(-1, -2)).mul_(dropped)
        grad_logits.addcmul_(probs, minus_delta[index])
    grad_q, grad_k_t, grad_v_t = grads
    # dk and dv are computed transposed (q^T dS, dO^T P): a plain-layout product, faster than
    # (dS^T q) on this CPU's GEMM; their transposed views are the gradients
    torch.bmm(grad_logits, k, out=grad_q[index])
    torch.bmm(q.transpose(-1, -2), grad_logits, out=grad_k_t[index])
    torch.bmm(grad_out.transpose(-1, -2), dropped, out=grad_v_t[index])
    return grad_logits


def _backward(q, k, v, out, grad_out, scale, mask_shape, probs_of, keep=None, keep_prob=1.0):
    """dq, dk, dv and the mask's gradient (None when ``mask_shape`` is None) by chunks; ``probs_of(index)``
    gives the probabilities of a chunk, ``keep`` (B, H, T, T) the dropout keep-mask."""
    grad_out = grad_out.contiguous()
    batch, heads, seq_len, head_dim = q.shape
    minus_delta = (grad_out * out).sum(-1, keepdim=True).neg_()
    if keep is not None:
        grad_out = grad_out * (1.0 / keep_prob)
    grads = (torch.empty_like(q), q.new_empty(batch, heads, head_dim, seq_len),
             v.new_empty(batch, heads, v.size(-1), seq_len))
    shared = mask_shape is not None and mask_shape[0] == 1
    grad_mask = None if mask_shape is None else q.new_empty(mask_shape)
    for b, h in _chunks(batch, heads, seq_len):
        index = (b, h)
        grad_logits = _chunk_gradients(q, k, v, grad_out, minus_delta, probs_of(index),
                                       None if keep is None else keep[index], grads, index)
        if shared and b > 0:
            grad_mask[0, h] += grad_logits
        elif grad_mask is not None:  # a shared mask's first batch row (the first chunk of its heads)
            grad_mask[0 if shared else b, h] = grad_logits
    grad_q, grad_k_t, grad_v_t = grads
    return grad_q.mul_(scale), grad_k_t.mul_(scale).transpose(-1, -2), grad_v_t.transpose(-1, -2), grad_mask


def _chunk_logits(q, k, mask, scale, index):
    """scale * q k^T + mask of one chunk: a float mask is the product's accumulator (no pass of its
    own); a boolean key-padding mask (B, 1, 1, T), True = attend, fills the padded keys."""
    b, h = index
    k_t = k[index].transpose(-1, -2)
    if mask is None or mask.dtype == torch.bool:
        logits = torch.baddbmm(q.new_empty(()), q[index], k_t, beta=0, alpha=scale)
        return logits if mask is None else logits.masked_fill_(~mask[b], torch.finfo(logits.dtype).min)
    return torch.baddbmm(mask[0 if mask.size(0) == 1 else b, h], q[index], k_t, alpha=scale)


class BiasedFlashAttention(torch.autograd.Function):
    """Dropout-free attention whose additive ``mask`` needs a gradient (CPU flash kernel forward; the
    compiled backward of :mod:`.compiled_kernels` where it applies, else the chunked one below)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask.detach(), scale=scale
        )
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, mask, out, lse = ctx.saved_tensors
        compiled = compiled_kernels.biased_attention_backward()
        if compiled is not None and _compiled_backward_applies(q, k, v, mask):
            rows = max(MIN_BLOCK_ROWS, BLOCK_LOGITS // q.size(2))
            # the kernel reads the rows where they are (a projection's (B, T, 3, H, D) layout, the flash
            # output's (B, T, H, D)): copies to (B, H, T, D) cost more than they save at T = 128 (1.03-1.28 x
            # the backward) and as much as they save at T = 512
            q, k, v, out, grad_out = (_with_contiguous_rows(t) for t in (q, k, v, out, grad_out))
            grads = compiled(q, k, v, out, grad_out, lse.contiguous(), mask, ctx.scale, rows)
            return *grads, None
        logits_mask = mask.to(q.dtype)

        def probs_of(index):
            return torch.softmax(_chunk_logits(q, k, logits_mask, ctx.scale, index), dim=-1)

        return *_backward(q, k, v, out, grad_out, ctx.scale, mask.shape, probs_of), None


def _with_contiguous_rows(t):
    """``t`` (B, H, T, D) itself where each of its rows is contiguous and apart from the next, else a copy."""
    return t if t.stride(-1) == 1 and (t.size(-2) == 1 or t.stride(-2) >= t.size(-1)) else t.contiguous()


def _compiled_backward_applies(q, k, v, mask):
    """Whether the compiled backward takes these tensors: float32 or float64, one dtype, q and k of one
    shape, and a contiguous mask of (1 or B, H, T, T)."""
    batch, heads, seq_len, _ = q.shape
    return (q.dtype in (torch.float32, torch.float64) and all(t.dtype == q.dtype for t in (k, v, mask))
            and k.shape == q.shape and v.shape[:3] == q.shape[:3] and mask.is_contiguous() and mask.dim() == 4
            and mask.size(0) in (1, batch) and mask.shape[1:] == (heads, seq_len, seq_len))


class ChunkedAttention(torch.autograd.Function):
    """Attention with dropout (and an optional mask, boolean or additive, learned or not) on CPU, by
    chunks; the arithmetic is float32 whatever the inputs' dtype (under CPU autocast too), the output in
    q's."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, q, k, v, mask, scale, dropout):
        dtype = q.dtype
        ctx.mask_dtype = None if mask is None else mask.dtype
        q, k, v = (t.to(torch.promote_types(dtype, torch.float32)) for t in (q, k, v))
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.detach().to(q.dtype)
        batch, heads, seq_len, _ = q.shape
        probs = q.new_empty(batch, heads, seq_len, seq_len)
        keep = keep_mask(probs.shape, dropout, q.device) if dropout > 0 else None
        out = v.new_empty(batch, heads, seq_len, v.size(-1))
        for index in _chunks(batch, heads, seq_len):
            chunk = torch.ops.aten._softmax.out(_chunk_logits(q, k, mask, scale, index), -1, False,
                                                out=probs[index])
            torch.bmm(chunk if keep is None else chunk * keep[index], v[index], out=out[index])
        keep_prob = keep_probability(dropout, q.device.type)
        if keep is not None:
            out.mul_(1.0 / keep_prob)
        ctx.save_for_backward(q, k, v, probs, keep, out)
        ctx.scale, ctx.keep_prob, ctx.dtype = scale, keep_prob, dtype
        ctx.mask_shape = mask.shape if ctx.needs_input_grad[3] else None
        return out.to(dtype)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_out):
        q, k, v, probs, keep, out = ctx.saved_tensors
        grad_q, grad_k, grad_v, grad_mask = _backward(
            q, k, v, out, grad_out.to(q.dtype), ctx.scale, ctx.mask_shape, probs.__getitem__, keep, ctx.keep_prob
        )
        grad_mask = None if grad_mask is None else grad_mask.to(ctx.mask_dtype)
        return grad_q.to(ctx.dtype), grad_k.to(ctx.dtype), grad_v.to(ctx.dtype), grad_mask, None, None
