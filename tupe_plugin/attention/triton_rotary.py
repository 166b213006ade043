"""RoPE's rotation of q and k in one Triton pass over the layer's projection, forward and backward (a GPU
kernel; its logic runs on CPU through Triton's interpreter).

Su, Lu, Pan, Murtadha, Wen, Liu, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv
2104.09864, Eq. 34: each pair (x_2k, x_2k+1) of a query or key head at position t is turned by the angle
theta_k t, whose cos and sin come as (T, d_h / 2) tables (computed, and scaled for longer inputs, by the
encoding: the kernel only reads them). The forward rotates q and k of the (B T, 3 H d_h) projection where
they lie, as the projection then holds what the attention reads: no second copy, nothing kept for the
backward but the tables. A rotation's transpose is the rotation by -theta_k t: the backward is one more
call of the same kernel, which writes the projection's gradient with v's part copied. The tables take no
gradient here (fixed frequencies); learnable ones keep torch's rotation, whose backward reaches them. The
step-by-step twins are the paper's 2x2 blocks and the plain rotation of
:mod:`tupe_plugin.encodings.rotary_position` (tests); the plan of :mod:`.paths` runs this kernel on CUDA
(:func:`~.paths.fuse_rotary`).
"""

import os

import torch

from .triton_bias_attention import INTERPRET


def _rotate(x, out, cos, sin, heads, parts, inverse):
    """``out`` = the first ``parts`` parts of the (B T, 3 H d_h) rows ``x`` turned by the tables' angles (by
    their negatives with ``inverse``), a third part copied; ``out`` may be ``x``."""
    from .triton_rotary_kernels import rotate_kernel

    seq_len = cos.size(0)
    batch, head_dim = x.size(0) // seq_len, x.size(1) // (3 * heads)
    cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    block_k = 1 << max(0, (head_dim // 2 - 1).bit_length())
    block_t = min(32, 1 << (seq_len - 1).bit_length())
    rotate_kernel[(-(-seq_len // block_t), batch, parts)](
        x, out, cos, sin, seq_len * x.stride(0), x.stride(0), seq_len * out.stride(0), out.stride(0),
        cos.stride(0), sin.stride(0), seq_len, heads, head_dim, INVERSE=inverse, BLOCK_T=block_t,
        BLOCK_K=block_k)
    return out


class RotatedQueryKey(torch.autograd.Function):
    """See the module docstring; ``projection`` (B T, 3 H d_h), row b T + t the token at position t of batch
    row b, its last dimension contiguous: rotated in place and returned; ``cos``, ``sin`` (T, d_h / 2)
    without gradient."""

    @staticmethod
    def forward(ctx, projection, cos, sin, heads):
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            raise ValueError("the fused RoPE kernel returns no gradient to its cos/sin tables: learnable "
                             "frequencies take the plain rotation")
        _rotate(projection, projection, cos, sin, heads, 2, False)
        ctx.mark_dirty(projection)
        ctx.save_for_backward(cos, sin)
        ctx.heads = heads
        return projection

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()
        return _rotate(grad, torch.empty_like(grad), cos, sin, ctx.heads, 3, True), None, None, None


def rotate_projection(projection, cos, sin, heads):
    """q and k of a layer's (B T, 3 H d_h) projection (a row per token, batch row after batch row; q, k, v
    each H heads of d_h) rotated by RoPE's (T, d_h / 2) cos/sin tables where they lie, on the Triton
    kernel; returns the projection. Pass the projection itself, not a view of it: autograd's in-place
    update of a view clones the whole gradient, twice."""
    if projection.device.type != "cuda" and os.environ.get(INTERPRET) != "1":
        raise RuntimeError(f"the fused RoPE kernel needs a CUDA device ({INTERPRET}=1 runs it on CPU, "
                           "slowly, as the tests do)")
    if projection.dim() != 2 or projection.stride(-1) != 1 or projection.size(0) % cos.size(0):
        raise ValueError("the fused RoPE kernel rotates a (B T, 3 H d_h) projection whose last dimension is "
                         f"contiguous, got {tuple(projection.shape)} for {cos.size(0)} positions")
    return RotatedQueryKey.apply(projection, cos, sin, heads)
