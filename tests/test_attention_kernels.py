"""BiasedFlashAttention against softmax(scale q k^T + mask) v written out, forward and gradients."""

import pytest
import torch
from tupe_plugin.modules import attention_kernels
from tupe_plugin.modules.attention_kernels import BiasedFlashAttention

BATCH, HEADS, LENGTH, HEAD_DIM = 3, 2, 6, 8
SCALE = 0.3


def _inputs(mask_batch):
    q, k, v = (torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64) for _ in range(3))
    mask = torch.randn(mask_batch, HEADS, LENGTH, LENGTH, dtype=torch.float64)
    return q, k, v, mask


def _padded(mask):
    """The mask plus key padding (row b keeps its first LENGTH - b keys), as attention_mask builds it."""
    padding = torch.arange(LENGTH)[None, :] >= LENGTH - torch.arange(BATCH)[:, None]
    return mask.masked_fill(padding[:, None, None, :], torch.finfo(torch.float32).min)


def _plain(q, k, v, mask):
    logits = torch.matmul(q, k.transpose(-1, -2)) * SCALE + mask
    return torch.matmul(torch.softmax(logits, -1), v)


def _value_and_grads(fn, inputs, grad_out):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = fn(*inputs)
    out.backward(grad_out)
    return out.detach(), [t.grad for t in inputs]


@pytest.mark.parametrize("mask_batch", [1, BATCH], ids=["shared_bias", "per_row_mask"])
@pytest.mark.parametrize("chunk_heads", [1, HEADS, BATCH * HEADS])
def test_forward_and_gradients_equal_the_plain_formula_with_padding(mask_batch, chunk_heads,
                                                                    monkeypatch):
    monkeypatch.setattr(attention_kernels, "CHUNK_LOGITS", chunk_heads * LENGTH * LENGTH)
    q, k, v, bias = _inputs(mask_batch)
    grad_out = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64)

    def fused(q, k, v, bias):
        return BiasedFlashAttention.apply(q, k, v, _padded(bias).float(), SCALE)

    def plain(q, k, v, bias):
        return _plain(q, k, v, _padded(bias))

    expected, expected_grads = _value_and_grads(plain, (q, k, v, bias), grad_out)
    got, got_grads = _value_and_grads(
        lambda *t: fused(*(x.float() for x in t)).double(), (q, k, v, bias), grad_out
    )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for name, g, e in zip("qkv", got_grads[:3], expected_grads[:3]):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5, msg=name)
    torch.testing.assert_close(got_grads[3], expected_grads[3], atol=1e-5, rtol=1e-5)


def test_shared_bias_gradient_is_the_batch_sum_of_the_per_row_gradients():
    q, k, v, bias = _inputs(1)
    grad_out = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM)
    q, k, v, bias = (t.float() for t in (q, k, v, bias))
    shared = bias.clone().requires_grad_()
    BiasedFlashAttention.apply(q, k, v, shared, SCALE).backward(grad_out)
    per_row = bias.expand(BATCH, -1, -1, -1).clone().requires_grad_()
    BiasedFlashAttention.apply(q, k, v, per_row, SCALE).backward(grad_out)
    torch.testing.assert_close(shared.grad[0], per_row.grad.sum(0), atol=1e-6, rtol=1e-5)


def test_padded_keys_get_no_attention_and_no_gradient():
    q, k, v, bias = (t.float() for t in _inputs(1))
    v = v.clone().requires_grad_()
    out = BiasedFlashAttention.apply(q, k, v, _padded(bias), SCALE)
    out.sum().backward()
    last_row = BATCH - 1
    assert torch.all(v.grad[last_row, :, LENGTH - last_row:] == 0)
