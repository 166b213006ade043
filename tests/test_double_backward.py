"""A gradient of a gradient (``create_graph=True``) through the CPU attention kernels is refused in one line
naming the way to get it (their backward has no gradient: torch warned that the compiled op has no autograd
kernel and the gradients were NaN a step later); the explicit path (``need_attn=True``) gives it."""

import pytest
import torch
from conftest import build_model, random_tokens

from tupe_plugin.attention.cpu_kernels import BiasedFlashAttention, ChunkedAttention, DoubleBackwardError

KERNELS = {
    "BiasedFlashAttention": lambda q, k, v, mask: BiasedFlashAttention.apply(q, k, v, mask, 0.3),
    "ChunkedAttention": lambda q, k, v, mask: ChunkedAttention.apply(q, k, v, mask, 0.3, 0.1),
}


def _inputs():
    q, k, v = (torch.randn(2, 2, 6, 8, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(1, 2, 6, 6, requires_grad=True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_gradient_of_a_gradient_through_a_cpu_attention_kernel_is_refused_in_one_line(kernel):
    inputs = _inputs()
    out = KERNELS[kernel](*inputs)
    refusal = (r"^a gradient of a gradient \(create_graph=True\) through the CPU attention kernel "
               rf"{kernel} is not supported: .*explicit path \(need_attn=True")
    with pytest.raises(DoubleBackwardError, match=refusal):
        torch.autograd.grad(out.square().sum(), inputs, create_graph=True)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_first_order_gradient_through_a_cpu_attention_kernel_still_runs(kernel):
    inputs = _inputs()
    grads = torch.autograd.grad(KERNELS[kernel](*inputs).square().sum(), inputs)
    assert all(torch.isfinite(grad).all() for grad in grads)


def _gradient_penalty(model, tokens, need_attn):
    """The squared norm of the loss's gradient, a graph of its own (create_graph=True)."""
    logits = model(tokens, need_attn=need_attn)[0]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    weights = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, weights, create_graph=True, allow_unused=True)
    return sum(grad.square().sum() for grad in grads if grad is not None)


# attention dropout: ChunkedAttention; none, past T = d_h (32): BiasedFlashAttention for TUPE's learned term
@pytest.mark.parametrize("arch, dropout", [("tupe_r_tiny", 0.1), ("tupe_a_tiny", 0.0),
                                           ("bert_alibi_tiny", 0.1)])
def test_a_model_refuses_a_gradient_of_a_gradient_on_its_kernels_and_gives_it_on_the_explicit_path(arch,
                                                                                                    dropout):
    model = build_model(arch, max_positions=64, attention_dropout=dropout).train()
    tokens = random_tokens(model.encoder.dictionary, [40, 36])
    with pytest.raises(DoubleBackwardError):
        _gradient_penalty(model, tokens, need_attn=False)
    model.zero_grad()
    _gradient_penalty(model, tokens, need_attn=True).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(grad).all() for grad in grads)
