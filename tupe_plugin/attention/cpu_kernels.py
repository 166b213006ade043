"""The attention kernels and the one decision of which runs (as x-transformers' ``Attend``, for CPU and GPU).

:func:`choose_path` decides once per forward, from the device, the attention dropout in effect, whether
the probabilities are wanted, the position config and the sequence length, which of four paths every
layer takes; the forward's :class:`~.positional_term.PositionalTerm` carries the path and that dropout
to every layer, and :func:`attend` runs what it is given:

* ``SDPA``: one ``scaled_dot_product_attention`` call (flash or memory-efficient kernel) — on GPU
  always, on CPU when there is no dropout and no mask that needs a gradient;
* ``CHUNKED``: :class:`ChunkedAttention` — on CPU with attention dropout, where SDPA has no fused
  kernel and its math fallback is slower still: matmul-softmax-dropout-matmul one cache-sized chunk
  of heads of one batch row at a time, the mask (a learned bias included) added inside the logits'
  product, the probabilities and the keep-mask kept for an exact backward that reduces the bias
  gradient in the same chunk;
* ``BIASED_FLASH``: :class:`BiasedFlashAttention` — on CPU, no dropout, a learned dense bias (the
  T5 bias of TUPE Eq. 5 / 8, Ke, He, Liu, "Rethinking Positional Encoding in Language
  Pre-training", arXiv 2006.15595; Shaw key terms; TUPE's untied term folded into one) and sequences
  longer than ``d_h``: SDPA would drop to its slow math path for a grad-requiring mask, so the
  flash kernel runs the forward with the mask as a constant and an exact backward follows, keeping
  no (B, H, T, T) tensor: the compiled kernel of :mod:`.compiled_kernels` (blocks of query rows, the
  mask's gradient in the pass that computes dS) where it can be built, else the chunked backward below;
* ``EXPLICIT``: matmul-softmax-matmul over whole tensors — where the probabilities are needed
  (``need_weights``, Shaw value vectors), and on CPU for a learned dense bias without dropout when
  ``T <= d_h``: there it is faster than BIASED_FLASH and the probabilities it keeps,
  B H T^2 numbers a layer, are at most the layer's hidden states (B T H d_h): the memory bound of the
  choice (at twice, T = 128 with d_h = 64, the peak memory of a training step was 1.059 x BERT-A's at
  B = 16, over the 1.05 x bound, and BIASED_FLASH was as fast). The comparisons are measured in
  docs/benchmarks.md (``benchmarks/benchmark_attention.py``).

:func:`fold_untied_term` is the matching decision for TUPE's untied term (see
:mod:`positional_term`): multiplied out into the dense bias on the CPU's own paths (explicit, chunked,
biased flash) and where a dense T5 bias is added anyway, kept factored (widened heads) on SDPA.

Both autograd functions compute ``softmax(scale * q k^T + mask) v`` (with dropout: the probabilities
times a keep-mask over the keep probability) and share one backward over chunks of heads of one batch
row (:func:`_chunk_gradients`): from the probabilities ``P`` of the chunk and the softmax gradient
``dS = P * (dP - rowsum(dO * O))``, where ``dP = dO v^T`` (times the keep-mask over the keep
probability with dropout), come dq = scale dS k, dk = scale (q^T dS)^T, dv = (dO^T P~)^T with ``P~``
the dropped probabilities, and the mask gradient dS (summed over the batch when the mask is shared).
:class:`BiasedFlashAttention` runs the CPU flash kernel forward with the mask as a constant and
recomputes ``P`` in the backward (one ``baddbmm`` and one softmax per chunk), keeping no (B, H, T, T)
activation; :class:`ChunkedAttention` keeps ``P`` (and the keep-mask, one byte an element) from its
forward. At most ``CHUNK_LOGITS`` logits live at a time; heads are the outer loop, so that a shared
bias chunk and its gradient stay in cache while every batch row reads and adds to them.
"""

import contextlib
import enum

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import compiled_kernels
from .attention_dropout import keep_mask, keep_probability
from .clipped_distances import distance_sums

# Logits of one chunk (heads of one batch row): 1 MiB of float32, which stays in the CPU's caches
# while it is normalised, dropped, multiplied and reduced.
CHUNK_LOGITS = 2**18

# The compiled backward's block of query rows: BLOCK_LOGITS logits (1 MiB of float32, as much again for
# their gradient), at least MIN_BLOCK_ROWS rows. Larger than an L2 cache, yet faster than L2-sized blocks
# (256 KiB: 1.06 x slower at T = 512): dk and dv come from fewer, deeper GEMMs (docs/benchmarks.md).
BLOCK_LOGITS = 2**18
MIN_BLOCK_ROWS = 16

# Without dropout, a learned dense bias takes the explicit path up to T = d_h (see above).
EXPLICIT_MAX_LENGTH_PER_HEAD_DIM = 1


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


class AttentionPath(enum.Enum):
    SDPA = "sdpa"
    CHUNKED = "chunked"
    BIASED_FLASH = "biased-flash"
    EXPLICIT = "explicit"


def choose_path(device, dropout, need_weights, config, seq_len):
    """The path every layer of this forward takes (see the module docstring).

    ``dropout`` is the attention dropout in effect (0 in evaluation), ``config`` the model's
    :class:`~.position_config.PositionConfig`, ``seq_len`` the length T of the batch.
    """
    on_cpu = torch.device(device).type == "cpu"
    if need_weights or config.shaw_values:
        return AttentionPath.EXPLICIT
    if on_cpu and dropout > 0:
        return AttentionPath.CHUNKED
    if on_cpu and (config.learned_dense_bias or config.untied_table) and torch.is_grad_enabled():
        if seq_len <= EXPLICIT_MAX_LENGTH_PER_HEAD_DIM * config.head_dim:
            return AttentionPath.EXPLICIT
        return AttentionPath.BIASED_FLASH
    return AttentionPath.SDPA


# --attention-backend: the SDPA kernel on CUDA ("auto": torch's choice but for a learned bias, below)
SDPA_BACKENDS = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def sdpa_backends(device, config, requested="auto"):
    """The SDPA kernels a forward may use (None: torch chooses). ``requested`` (``--attention-backend``)
    names one; by default, on CUDA, a learned dense bias takes the memory-efficient kernel: it returns
    the bias gradient, where cuDNN's backward can return NaN for masked rows at T % 128 == 64
    (pytorch#196678) and flash takes no bias at all. The math kernel stands behind it for the inputs
    it refuses: on an H100 with torch 2.11, a one-token row's (1, H, 1, 1) bias, whose last dimension
    may keep a stride of H (a dimension of size 1 keeps any stride) where GPU kernels want 1."""
    if requested != "auto":
        return (SDPA_BACKENDS[requested],)
    if torch.device(device).type == "cuda" and config.learned_dense_bias:
        return (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    return None


def sdpa_mask(mask, dtype):
    """``mask`` as SDPA takes it with queries of ``dtype``: an additive float mask in that dtype (under
    autocast the mask is built in the hidden states' float32 while q is bf16/fp16, and recent cuDNN
    kernels misread a mask of another dtype, pytorch#191612), its most negative values clamped to the
    dtype's so that padding stays finite."""
    if mask is None or mask.dtype == torch.bool or mask.dtype == dtype:
        return mask
    return mask.clamp(min=torch.finfo(dtype).min).to(dtype)


def fold_untied_term(path, config):
    """Whether TUPE's untied term is multiplied out into the dense bias for ``path``: always on the CPU
    paths of their own (explicit, chunked, biased flash), which add a bias inside the logits' product or
    the flash kernel at little cost where SDPA would run on heads of 2 d_h + 2 (TUPE-A's training step
    at T = 512 on CPU: 1.19 x BERT-A's factored, 1.04 x folded), and wherever the T5 bias is added in
    every layer anyway (the untied product joins it for free). On SDPA without a T5 bias (a GPU, or no
    gradients) it stays factored: on a GPU the widened heads keep cuDNN's kernel, where a learned bias
    takes the memory-efficient one."""
    cpu_paths = (AttentionPath.EXPLICIT, AttentionPath.CHUNKED, AttentionPath.BIASED_FLASH)
    return path in cpu_paths or config.t5_bias


def attend(path, q, k, v, mask, scale, dropout, value_table=None, value_index=None, backends=None):
    """Run ``path``: (output (B, H, T, d), probabilities (B, H, T, T) on the explicit path, else None).

    ``mask`` is None, a boolean keep-mask or an additive float mask (always the float mask of a
    learned dense bias on BIASED_FLASH, see :func:`choose_path`); ``value_table`` (2K + 1, d) and its
    (T, T) ``value_index`` add Shaw value vectors ``sum_j alpha_ij a_{clip(j-i)}`` (explicit path only);
    ``backends`` are the SDPA kernels allowed (:func:`sdpa_backends`; None: torch chooses).
    """
    if path is AttentionPath.EXPLICIT:
        return explicit_attention(q, k, v, mask, scale, dropout, value_table, value_index)
    if value_table is not None:
        raise ValueError("Shaw value vectors need the probabilities: choose_path gives EXPLICIT")
    if path is AttentionPath.BIASED_FLASH:
        return BiasedFlashAttention.apply(q, k, v, mask, scale), None
    if path is AttentionPath.CHUNKED:
        return ChunkedAttention.apply(q, k, v, mask, scale, dropout), None
    with sdpa_kernel(list(backends)) if backends else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask(mask, q.dtype), dropout_p=dropout,
                                             scale=scale)
    return out, None


def explicit_attention(q, k, v, mask, scale, dropout, value_table=None, value_index=None):
    """softmax(scale q k^T + mask) v step by step, with the probabilities (and Shaw value vectors);
    attention dropout with :func:`~.attention_dropout.keep_mask`."""
    # float32 logits before the mask is added: a float32 mask's padding value (its most negative
    # number) would round to -inf in bf16 and turn an all-padded row into NaN.
    logits = torch.matmul(q * scale, k.transpose(-1, -2))
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if mask is not None:
        add_mask_(logits, mask)
    probs = torch.softmax(logits, dim=-1).to(q.dtype)
    dropped = probs if dropout == 0 else probs * keep_mask(probs.shape, dropout, probs.device)
    out = torch.matmul(dropped, v)
    if value_table is not None:
        # each clipped distance sums up to T - K probabilities: in float32, since in bf16 (fp16) every
        # addition to a sum near 1 drops what lies below 2^-8 (2^-11), most of a probability of ~1/T
        per_distance = distance_sums(dropped, value_index, (value_table.size(0) - 1) // 2).to(probs.dtype)
        shaw = torch.matmul(per_distance, value_table.to(probs.dtype))
        out = out + F.pad(shaw, (0, out.size(-1) - shaw.size(-1)))
    if dropout > 0:  # the kept probabilities' scale, applied to the (B, H, T, d) output: linear in them
        out = out * (1.0 / keep_probability(dropout, probs.device.type))
    return out, probs


def add_mask_(logits, mask):
    """Add an attention mask (boolean keep-mask or additive float) to fresh logits, in place."""
    if mask.dtype == torch.bool:
        return logits.masked_fill_(~mask, torch.finfo(logits.dtype).min)
    return logits.add_(mask)


def add_bias(mask, bias):
    """Combine an attention mask (None, boolean keep-mask, or additive float) with a fresh float bias
    (B, H, T, T), in place where the sum keeps the bias's dtype (one pass fewer); a float32 mask joins a
    bf16/fp16 bias out of place, so that its padding value does not round to -inf."""
    if mask is None:
        return bias
    if mask.dtype == torch.bool or torch.promote_types(bias.dtype, mask.dtype) == bias.dtype:
        return add_mask_(bias, mask)
    return bias + mask
