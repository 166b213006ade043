"""Fused attention with a learned additive bias on CPU: the flash kernel forward, an exact backward.

``softmax(scale * q k^T + mask) v`` where ``mask`` (1 or B, H, T, T) holds the shared T5 bias of
seed 001 Eq. 5 / 8 plus key padding and requires grad. ``scaled_dot_product_attention`` drops to
its slow math path for a grad-requiring mask on CPU (DESIGN §8); here the forward runs the flash
kernel with the mask as a constant and keeps only the output and the row log-sum-exp, and the
backward recomputes, one batch element at a time, the probabilities
``P = exp(scale * q k^T + mask - lse)`` and the softmax gradient
``dS = P * (dO v^T - rowsum(dO * O))``, from which come dq = scale dS k, dk = scale dS^T q,
dv = P^T dO and the mask gradient dS (summed over the batch when the mask is shared). Only one
(H, T, T) block lives at a time, so the backward also needs no (B, H, T, T) activations.
"""

import torch


class BiasedFlashAttention(torch.autograd.Function):
    """Dropout-free attention whose additive ``mask`` needs a gradient (CPU flash kernel forward)."""

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
        scale = ctx.scale
        grad_out = grad_out.contiguous()
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        shared = mask.size(0) == 1
        grad_mask = torch.zeros_like(mask) if shared else torch.empty_like(mask)
        delta = (grad_out * out).sum(-1, keepdim=True)
        for b in range(q.size(0)):
            logits = torch.baddbmm(mask[0 if shared else b], q[b], k[b].transpose(-1, -2),
                                   alpha=scale)
            probs = torch.exp_(logits.sub_(lse[b, ..., None]))
            grad_logits = torch.matmul(grad_out[b], v[b].transpose(-1, -2))
            grad_logits = grad_logits.sub_(delta[b]).mul_(probs)
            if shared:
                grad_mask[0] += grad_logits
            else:
                grad_mask[b] = grad_logits
            torch.matmul(grad_logits, k[b], out=grad_q[b]).mul_(scale)
            torch.matmul(grad_logits.transpose(-1, -2), q[b], out=grad_k[b]).mul_(scale)
            torch.matmul(probs.transpose(-1, -2), grad_out[b], out=grad_v[b])
        return grad_q, grad_k, grad_v, grad_mask, None


def fused_kernel_applies(q, dropout):
    """Whether a fused kernel exists: on CPU ``scaled_dot_product_attention`` has none with dropout
    (it falls back to a math path that is slower than explicit matmul-softmax-matmul)."""
    return dropout == 0 or q.device.type != "cpu"


def biased_flash_applies(q, mask, dropout):
    """A float mask that needs a gradient on CPU, no dropout: SDPA's flash kernel would refuse it."""
    return (
        q.device.type == "cpu"
        and dropout == 0
        and mask is not None
        and mask.dtype != torch.bool
        and mask.requires_grad
        and torch.is_grad_enabled()
    )
