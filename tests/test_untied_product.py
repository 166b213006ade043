"""TUPE's untied product written in the storage of the last step's gradient
(:mod:`tupe_plugin.encodings.untied_product`): the same values and gradients as torch's bmm, its memory taken
only where nothing else holds it, let go in evaluation and by a copy of the model."""

import copy

import pytest
import torch
from conftest import assert_gradients_close, build_model, features_and_grads, random_tokens
from tupe_plugin.encodings import untied_product
from tupe_plugin.encodings.untied_product import ProductMemory, UntiedProduct

HEADS, LENGTH, DIM = 2, 7, 5


@pytest.fixture
def kept_at_any_size(monkeypatch):
    """Every product goes through the kept memory, however small."""
    monkeypatch.setattr(untied_product, "KEPT_FROM_BYTES", 0)


def _factors(seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(HEADS, LENGTH, DIM, dtype=torch.float64, generator=generator).requires_grad_()
            for _ in range(2)]


def _product_and_gradient(memory, seed):
    """(the product's values, the gradient it was given, the factors' gradients) of one step."""
    q, k = _factors(seed)
    product = UntiedProduct.apply(q, k, memory)
    values = product.detach().clone()
    grad = torch.randn(HEADS, LENGTH, LENGTH, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed + 100))
    product.backward(grad)
    return values, grad, q.grad, k.grad


def _plain(seed):
    q, k = _factors(seed)
    product = torch.bmm(q, k.transpose(1, 2))
    grad = torch.randn(HEADS, LENGTH, LENGTH, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed + 100))
    product.backward(grad)
    return product.detach(), q.grad, k.grad


def test_the_product_and_its_gradients_equal_torch_bmm_step_after_step(kept_at_any_size):
    memory = ProductMemory()
    for seed in range(3):
        values, _, grad_q, grad_k = _product_and_gradient(memory, seed)
        expected, expected_q, expected_k = _plain(seed)
        torch.testing.assert_close(values, expected, rtol=0, atol=0)
        torch.testing.assert_close(grad_q, expected_q, rtol=0, atol=0)
        torch.testing.assert_close(grad_k, expected_k, rtol=0, atol=0)


def test_the_next_forward_writes_its_product_where_the_last_gradient_was(kept_at_any_size):
    memory = ProductMemory()
    q, k = _factors(0)
    product = UntiedProduct.apply(q, k, memory)
    addresses = []
    product.register_hook(lambda grad: addresses.append(grad.data_ptr()))
    product.backward(torch.ones_like(product))
    assert memory.held_bytes() == HEADS * LENGTH * LENGTH * 8
    q, k = _factors(1)
    assert UntiedProduct.apply(q, k, memory).data_ptr() == addresses[0]
    assert memory.held_bytes() == 0


def test_a_gradient_still_held_elsewhere_keeps_its_values_and_the_product_gets_fresh_memory(kept_at_any_size):
    memory = ProductMemory()
    q, k = _factors(0)
    product = UntiedProduct.apply(q, k, memory)
    held = []
    product.register_hook(lambda grad: held.append(grad))
    product.backward(torch.full_like(product, 3.0))
    q, k = _factors(1)
    product = UntiedProduct.apply(q, k, memory)
    assert product.data_ptr() != held[0].data_ptr()
    torch.testing.assert_close(held[0], torch.full_like(held[0], 3.0), rtol=0, atol=0)
    torch.testing.assert_close(product, torch.bmm(q, k.transpose(1, 2)), rtol=0, atol=0)


def test_two_forwards_before_a_backward_each_get_their_own_memory(kept_at_any_size):
    memory = ProductMemory()
    _product_and_gradient(memory, 0)
    first, second = (UntiedProduct.apply(*_factors(seed), memory) for seed in (1, 2))
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, _plain(1)[0], rtol=0, atol=0)
    torch.testing.assert_close(second, _plain(2)[0], rtol=0, atol=0)


def test_small_products_and_products_without_gradients_take_torch_bmm():
    memory = ProductMemory()
    q, k = _factors(0)
    assert type(untied_product.untied_product(q, k, memory).grad_fn).__name__ == "BmmBackward0"
    untied_product.KEPT_FROM_BYTES, kept = 0, untied_product.KEPT_FROM_BYTES
    try:
        assert type(untied_product.untied_product(q, k, memory).grad_fn).__name__ == "UntiedProductBackward"
        with torch.no_grad():
            assert untied_product.untied_product(q, k, memory).grad_fn is None
    finally:
        untied_product.KEPT_FROM_BYTES = kept


def _train_steps(model, dictionary, steps=3, lengths=(40, 40)):
    tokens = random_tokens(dictionary, list(lengths))
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim,
                          generator=torch.Generator().manual_seed(0))
    return [features_and_grads(model, tokens, weights) for _ in range(steps)]


@pytest.mark.parametrize("preset, attention_dropout", [("tupe_a", 0.0), ("tupe_r", 0.0), ("tupe_a", 0.1)],
                         ids=["tupe_a-biased_flash", "tupe_r-biased_flash", "tupe_a-chunked"])
@pytest.mark.parametrize("lengths", [(40, 40), (40, 33)], ids=["unpadded", "padded"])
def test_training_steps_on_kept_memory_give_the_gradients_of_fresh_memory(preset, attention_dropout, lengths,
                                                                            dictionary, monkeypatch):
    """Steps whose product lands in the last gradient's storage (the kernels writing the mask's gradient
    there too) give the steps' features and gradients with fresh memory every time; past T = d_h, on the
    biased flash and chunked kernels."""
    model = build_model(f"{preset}_tiny", dictionary, max_positions=48, attention_dropout=attention_dropout)
    torch.manual_seed(0)
    fresh = _train_steps(model, dictionary, lengths=lengths)
    memory = model.encoder.sentence_encoder.positional_term.product_memory
    assert memory.held_bytes() == 0
    monkeypatch.setattr(untied_product, "KEPT_FROM_BYTES", 0)
    torch.manual_seed(0)
    kept = _train_steps(model, dictionary, lengths=lengths)
    assert memory.held_bytes() > 0
    for (features, grads), (expected_features, expected_grads) in zip(kept, fresh):
        torch.testing.assert_close(features, expected_features, rtol=0, atol=0)
        assert_gradients_close(grads, expected_grads, atol=0, rtol=0)


def test_evaluation_and_a_copy_of_the_model_let_the_kept_memory_go(dictionary, monkeypatch):
    monkeypatch.setattr(untied_product, "KEPT_FROM_BYTES", 0)
    model = build_model("tupe_a_tiny", dictionary, max_positions=48)
    _train_steps(model, dictionary, steps=1)
    memory = model.encoder.sentence_encoder.positional_term.product_memory
    assert memory.held_bytes() > 0
    assert copy.deepcopy(model).encoder.sentence_encoder.positional_term.product_memory.held_bytes() == 0
    with torch.no_grad():
        model(random_tokens(dictionary, [20]), features_only=True)
    assert memory.held_bytes() == 0
