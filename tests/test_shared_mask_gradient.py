"""A mask read by several layers' ChunkedAttention or BiasedFlashAttention (its compiled backward and its
Python one), its gradient summed in one shared buffer (:mod:`tupe_plugin.attention.shared_mask_gradient`),
with a bias of the offset beside it whose gradient comes from that buffer, against the layers written out
with the plain formula (the bias's dense twin) and autograd's own sum of their gradients, in float64."""

import pytest
import torch
from tupe_plugin.attention import compiled_kernels, cpu_kernels
from tupe_plugin.attention.cpu_kernels import BiasedFlashAttention, ChunkedAttention
from tupe_plugin.attention.dropout import keep_mask, keep_probability
from tupe_plugin.attention.offset_rows import edges
from tupe_plugin.attention.shared_mask_gradient import gather_mask_gradient
from tupe_plugin.encodings.offset_bias import toeplitz

BATCH, HEADS, LENGTH, HEAD_DIM, LAYERS = 3, 2, 6, 8, 3
SCALE, DROPOUT = 0.3, 0.3


@pytest.fixture(params=["chunked", "biased_flash_compiled", "biased_flash_python"])
def kernel(request, monkeypatch):
    """The kernel the layers run: ChunkedAttention (with dropout), or BiasedFlashAttention (without) on its
    compiled backward (which must build here) or on its Python one."""
    if request.param == "biased_flash_compiled":
        assert compiled_kernels.biased_attention_backward() is not None, "the compiled kernel did not build"
    elif request.param == "biased_flash_python":
        monkeypatch.setattr(compiled_kernels, "biased_attention_backward", lambda: None)
    return request.param


def _dropout(kernel):
    return DROPOUT if kernel == "chunked" else 0.0


def _attend(kernel, x, k, v, mask, shared, offset=(None, None, None)):
    """One layer of ``kernel`` reading ``mask`` (and a bias of the offset's rows and edges)."""
    if kernel == "chunked":
        return ChunkedAttention.apply(x, k, v, mask, SCALE, DROPOUT, *offset, shared)
    return BiasedFlashAttention.apply(x, k, v, mask, SCALE, *offset, shared)


def _plain_layer(x, k, v, mask, keep, dropout):
    """softmax(scale x k^T + mask), times the keep-mask over the keep probability, times v."""
    probs = torch.softmax(torch.matmul(x, k.transpose(-1, -2)) * SCALE + mask, -1)
    return torch.matmul(probs * keep / keep_probability(dropout), v)


def _inputs(mask_batch, seed=0):
    """x, the layers' keys and values, a learned mask of (mask_batch, H, T, T) and an output gradient."""
    generator = torch.Generator().manual_seed(seed)
    x, keys, values = (torch.randn(n, BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64,
                                   generator=generator) for n in (1, LAYERS, LAYERS))
    bias = torch.randn(mask_batch, HEADS, LENGTH, LENGTH, dtype=torch.float64, generator=generator)
    grad_out = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64, generator=generator)
    return (x[0], keys, values, bias), grad_out


def _leaves(inputs):
    return [t.detach().clone().requires_grad_() for t in inputs]


def _plain_stack(x, keys, values, bias, keep_seed, dropout=DROPOUT):
    """The layers in sequence, each reading the mask; the keep-masks drawn as the kernels draw them."""
    torch.manual_seed(keep_seed)
    shape = (BATCH, HEADS, LENGTH, LENGTH)
    keeps = [keep_mask(shape, dropout, "cpu") if dropout > 0 else torch.ones(shape) for _ in range(LAYERS)]
    for k, v, keep in zip(keys, values, keeps):
        x = _plain_layer(x, k, v, bias * 1.0, keep, dropout)
    return x


def _kernel_stack(x, keys, values, bias, keep_seed, kernel="chunked"):
    """The same layers on ``kernel``, the mask's gradient gathered in one shared buffer."""
    mask, shared = gather_mask_gradient(bias * 1.0)
    torch.manual_seed(keep_seed)
    for k, v in zip(keys, values):
        x = _attend(kernel, x, k, v, mask, shared)
    return x


@pytest.mark.parametrize("mask_batch", [1, BATCH], ids=["shared_bias", "per_row_mask"])
@pytest.mark.parametrize("block_rows", [4, LENGTH], ids=["row_blocks", "whole_heads"])
def test_a_mask_read_by_several_layers_gets_the_sum_of_their_gradients(mask_batch, block_rows, kernel,
                                                                      monkeypatch):
    if block_rows < LENGTH:
        monkeypatch.setattr(cpu_kernels, "CHUNK_LOGITS", LENGTH * LENGTH - 1)
        monkeypatch.setattr(cpu_kernels, "ROW_BLOCK_LOGITS", block_rows * LENGTH)
        monkeypatch.setattr(cpu_kernels, "MIN_ROW_BLOCK_ROWS", 1)
        monkeypatch.setattr(cpu_kernels, "BLOCK_LOGITS", block_rows * LENGTH)
        monkeypatch.setattr(cpu_kernels, "MIN_BLOCK_ROWS", 1)
    inputs, grad_out = _inputs(mask_batch)
    expected_inputs, got_inputs = _leaves(inputs), _leaves(inputs)
    expected = _plain_stack(*expected_inputs, keep_seed=1, dropout=_dropout(kernel))
    got = _kernel_stack(*got_inputs, keep_seed=1, kernel=kernel)
    expected.backward(grad_out)
    got.backward(grad_out)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
    for name, g, e in zip(("x", "keys", "values", "mask"), got_inputs, expected_inputs):
        torch.testing.assert_close(g.grad, e.grad, atol=1e-10, rtol=1e-10, msg=name)


def test_another_reader_of_the_mask_adds_its_gradient_to_the_layers(kernel):
    inputs, grad_out = _inputs(1, seed=2)
    weights = torch.randn(1, HEADS, LENGTH, LENGTH, dtype=torch.float64)
    expected_inputs, got_inputs = _leaves(inputs), _leaves(inputs)
    expected = _plain_stack(*expected_inputs, keep_seed=3, dropout=_dropout(kernel))
    ((expected * grad_out).sum() + (expected_inputs[3] * weights).sum()).backward()
    bias = got_inputs[3]
    mask, shared = gather_mask_gradient(bias * 1.0)
    torch.manual_seed(3)
    x = got_inputs[0]
    for k, v in zip(got_inputs[1], got_inputs[2]):
        x = _attend(kernel, x, k, v, mask, shared)
    ((x * grad_out).sum() + (mask * weights).sum()).backward()
    torch.testing.assert_close(bias.grad, expected_inputs[3].grad, atol=1e-10, rtol=1e-10)


def test_a_backward_pass_that_does_not_reach_the_mask_leaves_nothing_to_the_next(kernel):
    """torch.autograd.grad of x alone runs the layers' backward, not the mask's: a later backward of the same
    graph gets the mask's gradient of that pass only."""
    inputs, grad_out = _inputs(1, seed=4)
    expected_inputs, got_inputs = _leaves(inputs), _leaves(inputs)
    _plain_stack(*expected_inputs, keep_seed=5, dropout=_dropout(kernel)).backward(grad_out)
    got = _kernel_stack(*got_inputs, keep_seed=5, kernel=kernel)
    torch.autograd.grad(got, [got_inputs[0]], grad_out, retain_graph=True)
    got.backward(grad_out)
    torch.testing.assert_close(got_inputs[3].grad, expected_inputs[3].grad, atol=1e-10, rtol=1e-10)


def test_a_second_backward_of_the_same_graph_gets_the_same_gradient_again(kernel):
    inputs, grad_out = _inputs(1, seed=6)
    leaves = _leaves(inputs)
    got = _kernel_stack(*leaves, keep_seed=7, kernel=kernel)
    first = torch.autograd.grad(got, [leaves[3]], grad_out, retain_graph=True)[0]
    second = torch.autograd.grad(got, [leaves[3]], grad_out)[0]
    torch.testing.assert_close(second, first, atol=0, rtol=0)


def test_a_mask_without_gradients_is_handed_on_as_it_is():
    bias = torch.randn(1, HEADS, LENGTH, LENGTH, requires_grad=True)
    with torch.no_grad():
        assert gather_mask_gradient(bias) == (bias, None)
    fixed = bias.detach()
    assert gather_mask_gradient(fixed) == (fixed, None)
    assert gather_mask_gradient(None) == (None, None)


def _gradient_handed_on(mask):
    """The gradient the mask's gather node hands on, recorded by a hook on that node."""
    handed = []
    mask.grad_fn.register_hook(lambda grad_inputs, grad_outputs: handed.append(grad_inputs[0]))
    return handed


def test_the_mask_memory_holds_the_gradient_once_only_the_layers_read_it():
    inputs, grad_out = _inputs(1, seed=8)
    expected_inputs, got_inputs = _leaves(inputs), _leaves(inputs)
    _plain_stack(*expected_inputs, keep_seed=9).backward(grad_out)
    source = got_inputs[3] * 1.0
    address = source.data_ptr()
    mask, shared = gather_mask_gradient(source)
    handed = _gradient_handed_on(mask)
    del source
    torch.manual_seed(9)
    x = got_inputs[0]
    for k, v in zip(got_inputs[1], got_inputs[2]):
        x = ChunkedAttention.apply(x, k, v, mask, SCALE, DROPOUT, None, None, None, shared)
    del mask
    x.backward(grad_out)
    assert handed[0].data_ptr() == address
    torch.testing.assert_close(got_inputs[3].grad, expected_inputs[3].grad, atol=1e-10, rtol=1e-10)


def test_a_mask_still_held_elsewhere_keeps_its_values_and_the_gradient_gets_its_own_memory():
    inputs, grad_out = _inputs(1, seed=10)
    expected_inputs, got_inputs = _leaves(inputs), _leaves(inputs)
    _plain_stack(*expected_inputs, keep_seed=11).backward(grad_out)
    source = got_inputs[3] * 1.0
    values = source.detach().clone()
    mask, shared = gather_mask_gradient(source)
    handed = _gradient_handed_on(mask)
    torch.manual_seed(11)
    x = got_inputs[0]
    for k, v in zip(got_inputs[1], got_inputs[2]):
        x = ChunkedAttention.apply(x, k, v, mask, SCALE, DROPOUT, None, None, None, shared)
    x.backward(grad_out)
    assert handed[0].data_ptr() != source.data_ptr()
    torch.testing.assert_close(source, values, atol=0, rtol=0)
    torch.testing.assert_close(got_inputs[3].grad, expected_inputs[3].grad, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("mask_batch", [1, BATCH], ids=["shared_bias", "per_row_mask"])
@pytest.mark.parametrize("with_cls", [True, False], ids=["cls_reset", "no_reset"])
def test_a_bias_of_the_offset_beside_the_mask_gets_its_gradient_from_the_shared_buffer(mask_batch, with_cls,
                                                                                      kernel):
    """The kernels read the rows and the reset's edges and compute no gradient for them; the gather node
    folds the layers' summed dS into them: as the layers with the dense twin mask + toeplitz(rows, cls)."""
    inputs, grad_out = _inputs(mask_batch, seed=12)
    generator = torch.Generator().manual_seed(13)
    rows = torch.randn(HEADS, 2 * LENGTH - 1, dtype=torch.float64, generator=generator)
    cls = torch.randn(HEADS, 2, dtype=torch.float64, generator=generator) if with_cls else None
    expected_inputs, got_inputs = _leaves(inputs), _leaves(inputs)
    expected_offset, got_offset = _leaves([rows, cls][: 1 + with_cls]), _leaves([rows, cls][: 1 + with_cls])
    x, keys, values, bias = expected_inputs
    twin = bias + toeplitz(*expected_offset)[None]
    expected = _plain_stack(x, keys, values, twin, keep_seed=14, dropout=_dropout(kernel))
    expected.backward(grad_out)

    x, keys, values, bias = got_inputs
    got_rows, got_cls = got_offset[0], got_offset[1] if with_cls else None
    mask, shared = gather_mask_gradient(bias * 1.0, got_rows, got_cls)
    torch.manual_seed(14)
    for k, v in zip(keys, values):
        offset = (got_rows, *((None, None) if got_cls is None else edges(got_rows, got_cls)))
        x = _attend(kernel, x, k, v, mask, shared, offset)
    x.backward(grad_out)
    torch.testing.assert_close(x, expected, atol=1e-10, rtol=1e-10)
    for name, g, e in zip(("x", "keys", "values", "mask", "rows", "cls"), got_inputs + got_offset,
                          expected_inputs + expected_offset):
        torch.testing.assert_close(g.grad, e.grad, atol=1e-10, rtol=1e-10, msg=name)


def test_the_biased_flash_layers_write_their_mask_gradient_into_one_buffer(monkeypatch):
    """The compiled backward of the last layer writes the gradient into the shared buffer, the others add to
    it: one (H, T, T) tensor a backward pass, none returned per layer for autograd to sum."""
    compiled = compiled_kernels.biased_attention_backward()
    assert compiled is not None, "the compiled kernel did not build"
    calls = []

    def recording(*args, **kwargs):
        grads = compiled(*args, **kwargs)
        calls.append((kwargs["grad_mask"].data_ptr(), kwargs["grad_mask_add"], grads[3].numel()))
        return grads

    monkeypatch.setattr(compiled_kernels, "biased_attention_backward", lambda: recording)
    inputs, grad_out = _inputs(1, seed=15)
    _kernel_stack(*_leaves(inputs), keep_seed=16, kernel="biased_flash_compiled").backward(grad_out)
    assert [add for _, add, _ in calls] == [False] + [True] * (LAYERS - 1)
    assert len({address for address, _, _ in calls}) == 1
    assert all(returned == 0 for _, _, returned in calls)
