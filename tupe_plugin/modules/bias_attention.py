"""Fused attention with a learned additive bias on CPU: the flash kernel forward, an exact backward.

``softmax(scale * q k^T + mask) v`` where ``mask`` (1 or B, H, T, T) holds the shared T5 bias of
seed 001 Eq. 5 / 8 plus key padding and requires grad. ``scaled_dot_product_attention`` drops to
its slow math path for a grad-requiring mask on CPU (DESIGN §8); here the forward runs the flash
kernel with the mask as a constant and keeps only the output and the row log-sum-exp, and the
backward recomputes, a few batch rows at a time, the probabilities
``P = exp(scale * q k^T + mask - lse)`` and the softmax gradient
``dS = P * (dO v^T - rowsum(dO * O))``, from which come dq = scale dS k, dk = scale dS^T q,
dv = P^T dO and the mask gradient dS (summed over the batch when the mask is shared). At most
``CHUNK_LOGITS`` logits live at a time, and the forward keeps no (B, H, T, T) activations.
"""

import torch

# Logits recomputed at once in the backward (batch rows of H x T x T): 16 MiB of float32.
CHUNK_LOGITS = 4 * 2**20


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
        batch, heads, seq_len, _ = q.shape
        rows = max(1, CHUNK_LOGITS // (heads * seq_len * seq_len))
        for start in range(0, batch, rows):
            b = slice(start, start + rows)
            logits = torch.matmul(q[b], k[b].transpose(-1, -2)).mul_(scale)
            probs = logits.add_(mask if shared else mask[b]).sub_(lse[b, ..., None]).exp_()
            grad_logits = torch.matmul(grad_out[b], v[b].transpose(-1, -2))
            grad_logits = grad_logits.sub_(delta[b]).mul_(probs)
            if shared:
                grad_mask += grad_logits.sum(0, keepdim=True)
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
