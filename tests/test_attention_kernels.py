"""BiasedFlashAttention and ChunkedAttention against softmax(scale q k^T + mask) v written out (with
dropout: the probabilities times the keep-mask over the keep probability), forward and gradients."""

import pytest
import torch
from tupe_plugin.attention import compiled_kernels, cpu_kernels
from tupe_plugin.attention.dropout import keep_mask, keep_probability
from tupe_plugin.attention.cpu_kernels import BiasedFlashAttention, ChunkedAttention

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


@pytest.fixture(params=["compiled", "python"])
def biased_backward(request, monkeypatch):
    """BiasedFlashAttention's backward: the compiled kernel (which must build here), or the Python one
    that runs where it cannot be built."""
    if request.param == "compiled":
        assert compiled_kernels.biased_attention_backward() is not None, "the compiled kernel did not build"
    else:
        monkeypatch.setattr(compiled_kernels, "biased_attention_backward", lambda: None)
    return request.param


def _block(monkeypatch, backward, block):
    """``block`` query rows per block of the compiled backward, heads per chunk of the Python one."""
    if backward == "compiled":
        monkeypatch.setattr(cpu_kernels, "MIN_BLOCK_ROWS", 1)
        monkeypatch.setattr(cpu_kernels, "BLOCK_LOGITS", block * LENGTH)
    else:
        monkeypatch.setattr(cpu_kernels, "CHUNK_LOGITS", block * LENGTH * LENGTH)


@pytest.mark.parametrize("mask_batch", [1, BATCH], ids=["shared_bias", "per_row_mask"])
@pytest.mark.parametrize("block", [1, 4, LENGTH])
def test_forward_and_gradients_equal_the_plain_formula_with_padding(mask_batch, block, biased_backward,
                                                                    monkeypatch):
    _block(monkeypatch, biased_backward, block)
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


@pytest.mark.parametrize("mask_batch", [1, BATCH], ids=["shared_bias", "per_row_mask"])
def test_a_fixed_bias_gets_no_gradient_and_no_gradient_buffer(mask_batch, biased_backward, monkeypatch):
    """A fixed bias (ALiBi's in training) is a constant: q, k and v get the plain formula's gradients, the
    bias none, and the compiled kernel writes no (1 or B, H, T, T) gradient that nobody reads."""
    compiled = compiled_kernels.biased_attention_backward()
    written = []

    def recording(*args, **kwargs):
        grads = compiled(*args, **kwargs)
        written.append(grads[3])
        return grads

    if compiled is not None:
        monkeypatch.setattr(compiled_kernels, "biased_attention_backward", lambda: recording)
    q, k, v, bias = _inputs(mask_batch)
    mask = _padded(bias)
    grad_out = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64)
    expected, expected_grads = _value_and_grads(lambda q, k, v: _plain(q, k, v, mask), (q, k, v), grad_out)
    fixed = mask.float()
    got, got_grads = _value_and_grads(
        lambda q, k, v: BiasedFlashAttention.apply(q.float(), k.float(), v.float(), fixed, SCALE).double(),
        (q, k, v), grad_out)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for name, g, e in zip("qkv", got_grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5, msg=name)
    assert fixed.grad is None
    assert [t.numel() for t in written] == ([0] if biased_backward == "compiled" else [])


@pytest.mark.parametrize("wrong", ["shape", "dtype", "no_mask_grad"])
def test_the_compiled_backward_refuses_a_gradient_buffer_that_does_not_fit_the_mask(wrong):
    compiled = compiled_kernels.biased_attention_backward()
    assert compiled is not None, "the compiled kernel did not build"
    q, k, v, bias = (t.float() for t in _inputs(1))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias,
                                                                          scale=SCALE)[:2]
    buffer = {"shape": torch.zeros(BATCH, HEADS, LENGTH, LENGTH), "dtype": torch.zeros_like(bias).double(),
              "no_mask_grad": torch.zeros_like(bias)}[wrong]
    with pytest.raises(RuntimeError, match="grad_mask of the mask's shape and dtype"):
        compiled(q, k, v, out, torch.ones_like(out), lse.contiguous(), bias, SCALE, 2,
                 mask_grad=wrong != "no_mask_grad", grad_mask=buffer)


def _assert_equal_to_rounding(q, k, v, bias, grad_out):
    """BiasedFlashAttention in float64: output and all four gradients equal the plain formula's to 1e-10."""
    expected, expected_grads = _value_and_grads(_plain, (q, k, v, bias), grad_out)
    got, got_grads = _value_and_grads(lambda *t: BiasedFlashAttention.apply(*t, SCALE), (q, k, v, bias),
                                      grad_out)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
    for name, g, e in zip("qkvm", got_grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-10, msg=name)


@pytest.mark.parametrize("mask_batch", [1, BATCH], ids=["shared_bias", "per_row_mask"])
def test_gradients_in_float64_equal_the_plain_formula_to_rounding(mask_batch, biased_backward):
    q, k, v, bias = _inputs(mask_batch)
    _assert_equal_to_rounding(q, k, v, bias, torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64))


def test_inputs_read_in_place_from_projection_layouts_give_the_plain_gradients(biased_backward):
    """q, k, v as the heads of one (B, T, 3, H, D) projection and the output's gradient in (B, T, H, D):
    rows apart in memory, read where they lie."""
    projection = torch.randn(BATCH, LENGTH, 3, HEADS, HEAD_DIM, dtype=torch.float64)
    q, k, v = (t.transpose(1, 2) for t in projection.unbind(2))
    assert q.shape == (BATCH, HEADS, LENGTH, HEAD_DIM) and not q.is_contiguous()
    bias = torch.randn(1, HEADS, LENGTH, LENGTH, dtype=torch.float64)
    grad_out = torch.randn(BATCH, LENGTH, HEADS, HEAD_DIM, dtype=torch.float64).transpose(1, 2)
    _assert_equal_to_rounding(q, k, v, bias, grad_out)


def test_a_long_row_of_large_logits_has_float32_gradients(biased_backward):
    """A sequence of 200 with logits over tens of units (the exponential over its whole useful range)."""
    q, k, v = (torch.randn(2, 3, 200, 16, dtype=torch.float64) * 2 for _ in range(3))
    bias = torch.randn(1, 3, 200, 200, dtype=torch.float64) * 8
    grad_out = torch.randn(2, 3, 200, 16, dtype=torch.float64)
    expected, expected_grads = _value_and_grads(_plain, (q, k, v, bias), grad_out)
    got, got_grads = _value_and_grads(
        lambda *t: BiasedFlashAttention.apply(*(x.float() for x in t), SCALE).double(), (q, k, v, bias),
        grad_out
    )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for name, g, e in zip("qkvm", got_grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("head_dim", [16, 37])
def test_head_sizes_of_whole_and_partial_vector_lanes_give_the_plain_gradients(head_dim, biased_backward):
    """rowsum(dO * O) in the compiled kernel runs in 16 partial sums: a head of 37 has two full lanes and
    a remainder of 5."""
    q, k, v = (torch.randn(2, 2, 9, head_dim, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 2, 9, 9, dtype=torch.float64)
    _assert_equal_to_rounding(q, k, v, bias, torch.randn(2, 2, 9, head_dim, dtype=torch.float64))


def _first_call(monkeypatch, caplog, level):
    """compiled_kernels.biased_attention_backward() as a process's first call makes it, under the patches
    already in place; the patches undone and the cached answer forgotten afterwards."""
    compiled_kernels.biased_attention_backward.cache_clear()
    try:
        with caplog.at_level(level, logger=compiled_kernels.__name__):
            return compiled_kernels.biased_attention_backward()
    finally:
        monkeypatch.undo()
        compiled_kernels.biased_attention_backward.cache_clear()


def test_the_switch_turns_the_compiled_kernel_off_and_says_so(monkeypatch, caplog):
    monkeypatch.setenv(compiled_kernels.SWITCH, "0")
    assert _first_call(monkeypatch, caplog, "INFO") is None
    assert f"{compiled_kernels.SWITCH}=0" in caplog.text


def test_a_machine_that_cannot_build_the_kernel_gets_the_python_backward_and_the_reason(monkeypatch, caplog):
    from torch.utils import cpp_extension

    def no_ninja(**kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "load", no_ninja)
    assert _first_call(monkeypatch, caplog, "WARNING") is None
    assert "could not be built (Ninja is required to load C++ extensions)" in caplog.text
    assert "pip install ninja" in caplog.text


def test_a_compiler_without_openmp_gets_a_one_thread_build_and_a_warning(monkeypatch, caplog):
    assert compiled_kernels.biased_attention_backward() is not None, "the compiled kernel did not build"
    from torch.utils import cpp_extension
    builds = []

    def load(**kwargs):
        if "-fopenmp" in kwargs["extra_cflags"]:
            raise RuntimeError("c++: error: unsupported option '-fopenmp'")
        builds.append(kwargs["name"])

    monkeypatch.setattr(cpp_extension, "load", load)
    assert _first_call(monkeypatch, caplog, "WARNING") is not None
    assert builds == ["tupe_plugin_kernels_one_thread"]
    assert "without OpenMP (c++: error: unsupported option '-fopenmp') and run on one thread" in caplog.text


def test_the_compiled_kernel_splits_its_work_over_torchs_threads():
    """at::parallel_for is a header template: a library built without OpenMP runs its loops on one thread."""
    assert compiled_kernels.biased_attention_backward() is not None, "the compiled kernel did not build"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.ops.tupe_plugin.parallel_threads() == 2
    finally:
        torch.set_num_threads(threads)


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


DROPOUT = 0.3


def _plain_dropped(q, k, v, mask, keep):
    """softmax(scale q k^T + mask), times the keep-mask over the keep probability, times v; ``mask``
    additive or boolean (True = attend) or None."""
    logits = torch.matmul(q, k.transpose(-1, -2)) * SCALE
    if mask is not None and mask.dtype == torch.bool:
        logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    elif mask is not None:
        logits = logits + mask
    probs = torch.softmax(logits, -1)
    return torch.matmul(probs * keep / keep_probability(DROPOUT), v)


def _key_padding():
    """(B, 1, 1, T), True = attend: row b keeps its first LENGTH - b keys."""
    return (torch.arange(LENGTH)[None, :] < LENGTH - torch.arange(BATCH)[:, None])[:, None, None, :]


MASKS = {
    "no_mask": lambda: None,
    "key_padding": _key_padding,
    "shared_learned_bias": lambda: _padded(torch.randn(1, HEADS, LENGTH, LENGTH, dtype=torch.float64))[:1],
    "per_row_learned_mask": lambda: _padded(torch.randn(1, HEADS, LENGTH, LENGTH, dtype=torch.float64)),
}


def _assert_chunked_dropout_is_the_dropped_formula(mask_kind, input_seed, keep_seed):
    """ChunkedAttention with dropout against the plain formula under the same keep-mask, forward and the
    gradients of q, k, v and a learned mask, in float64."""
    torch.manual_seed(input_seed)
    q, k, v, _ = _inputs(1)
    mask = MASKS[mask_kind]()
    grad_out = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64)
    learned = mask is not None and mask.dtype != torch.bool
    inputs = (q, k, v, mask) if learned else (q, k, v)

    torch.manual_seed(keep_seed)
    keep = keep_mask((BATCH, HEADS, LENGTH, LENGTH), DROPOUT, "cpu")
    expected, expected_grads = _value_and_grads(
        lambda q, k, v, m=mask: _plain_dropped(q, k, v, m, keep), inputs, grad_out)
    torch.manual_seed(keep_seed)  # the kernel draws one keep-mask of the whole (B, H, T, T)
    got, got_grads = _value_and_grads(
        lambda q, k, v, m=mask: ChunkedAttention.apply(q, k, v, m, SCALE, DROPOUT), inputs, grad_out)

    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
    for name, g, e in zip("qkvm", got_grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-10, msg=name)


@pytest.mark.parametrize("mask_kind", sorted(MASKS))
@pytest.mark.parametrize("chunk_heads", [1, HEADS, BATCH * HEADS])
def test_chunked_attention_with_dropout_equals_the_dropped_formula(mask_kind, chunk_heads, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "CHUNK_LOGITS", chunk_heads * LENGTH * LENGTH)
    _assert_chunked_dropout_is_the_dropped_formula(mask_kind, 0, 7)


def test_chunked_attention_without_dropout_is_the_plain_formula():
    q, k, v, bias = _inputs(1)
    grad_out = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64)
    expected, expected_grads = _value_and_grads(lambda *t: _plain(*t[:3], _padded(t[3])), (q, k, v, bias),
                                                grad_out)
    got, got_grads = _value_and_grads(lambda *t: ChunkedAttention.apply(*t[:3], _padded(t[3]), SCALE, 0.0),
                                      (q, k, v, bias), grad_out)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-10)


def test_chunked_attention_draws_what_dropout_keeps_and_scales_the_kept_probabilities():
    """With v the identity, each output row is that row's dropped probabilities: zero where the
    keep-mask drops, the probability over the keep probability elsewhere."""
    torch.manual_seed(1)
    q, k = (torch.randn(1, 1, 64, 8) for _ in range(2))
    v = torch.eye(64).expand(1, 1, 64, 64)
    out = ChunkedAttention.apply(q, k, v, None, SCALE, 0.5)
    probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * SCALE, -1)
    dropped = out == 0
    assert 0.4 < dropped.float().mean().item() < 0.6
    torch.testing.assert_close(out[~dropped], probs[~dropped] / keep_probability(0.5))


def test_chunked_attention_computes_in_float32_and_answers_in_the_inputs_dtype():
    torch.manual_seed(2)
    q, k, v, bias = (t.float() for t in _inputs(1))
    bias = bias.requires_grad_()
    low = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(3)
    out = ChunkedAttention.apply(*low, bias, SCALE, DROPOUT)
    out.float().sum().backward()
    torch.manual_seed(3)
    reference = ChunkedAttention.apply(*(t.bfloat16().float() for t in (q, k, v)), bias.detach(),
                                       SCALE, DROPOUT)
    assert out.dtype == torch.bfloat16 and all(t.grad.dtype == torch.bfloat16 for t in low)
    assert bias.grad.dtype == torch.float32
    torch.testing.assert_close(out.float(), reference, atol=1e-2, rtol=1e-2)


def test_a_fixed_mask_gets_no_gradient():
    q, k, v, bias = (t.float() for t in _inputs(1))
    q.requires_grad_()
    ChunkedAttention.apply(q, k, v, _padded(bias), SCALE, DROPOUT).sum().backward()
    assert q.grad is not None and bias.grad is None


def test_chunked_attention_under_cpu_autocast_computes_in_float32():
    q, k, v, bias = (t.float().requires_grad_() for t in _inputs(1))
    torch.manual_seed(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ChunkedAttention.apply(q, k, v, bias, SCALE, DROPOUT)
    out.sum().backward()
    torch.manual_seed(4)
    reference = ChunkedAttention.apply(q.detach(), k.detach(), v.detach(), bias.detach(), SCALE, DROPOUT)
    assert out.dtype == torch.float32 and bias.grad.dtype == torch.float32
    torch.testing.assert_close(out, reference)


def test_a_last_chunk_with_fewer_heads_is_computed_like_the_others(monkeypatch):
    """Three heads in chunks of two: the last chunk holds one head."""
    monkeypatch.setattr(cpu_kernels, "CHUNK_LOGITS", 2 * LENGTH * LENGTH)
    torch.manual_seed(5)
    q, k, v = (torch.randn(BATCH, 3, LENGTH, HEAD_DIM, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 3, LENGTH, LENGTH, dtype=torch.float64)
    grad_out = torch.randn(BATCH, 3, LENGTH, HEAD_DIM, dtype=torch.float64)
    torch.manual_seed(6)
    keep = keep_mask((BATCH, 3, LENGTH, LENGTH), DROPOUT, "cpu")
    expected, expected_grads = _value_and_grads(lambda *t: _plain_dropped(*t, keep), (q, k, v, bias),
                                                grad_out)
    torch.manual_seed(6)
    got, got_grads = _value_and_grads(lambda *t: ChunkedAttention.apply(*t, SCALE, DROPOUT), (q, k, v, bias),
                                      grad_out)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("mask_kind", sorted(MASKS))
def test_a_head_whose_logits_exceed_a_chunk_is_computed_by_blocks_of_query_rows(mask_kind, monkeypatch):
    """Four query rows a block of a length of six: the last block holds two."""
    monkeypatch.setattr(cpu_kernels, "CHUNK_LOGITS", LENGTH * LENGTH - 1)
    monkeypatch.setattr(cpu_kernels, "ROW_BLOCK_LOGITS", 4 * LENGTH)
    monkeypatch.setattr(cpu_kernels, "MIN_ROW_BLOCK_ROWS", 1)
    _assert_chunked_dropout_is_the_dropped_formula(mask_kind, 8, 9)


def _far_keys_negligible(kind):
    """q, k, v and the bias arguments of one query row block where keys three or more positions to the right
    of a query get a logit of -60 (a probability near 1e-26, below 2^-64) and key 5 a value of 1e30; every
    other value is 1."""
    q = k = torch.zeros(1, 1, LENGTH, HEAD_DIM)
    v = torch.ones(1, 1, LENGTH, HEAD_DIM)
    v[:, :, LENGTH - 1] = 1e30
    rows = torch.where(torch.arange(-LENGTH + 1, LENGTH) >= 3, -60.0, 0.0)[None]  # by offset j - i
    if kind == "rows":
        return q, k, v, None, rows
    dense = torch.stack([rows[0, LENGTH - 1 - i: 2 * LENGTH - 1 - i] for i in range(LENGTH)])
    return q, k, v, dense[None, None], None


@pytest.mark.parametrize("kind", ["dense", "rows"])
def test_probabilities_below_2_to_the_minus_64_add_nothing_under_an_additive_bias(kind):
    """Set to 0 by the chunked kernel, which keeps them for the backward: their products with a step's
    gradients would be subnormal numbers, slow on CPUs."""
    q, k, v, mask, rows = _far_keys_negligible(kind)
    out = ChunkedAttention.apply(q, k, v, mask, 1.0, 0.0, rows, None, None)
    far = LENGTH - 3  # queries 0 .. LENGTH - 4 see key 5 at an offset of 3 or more
    torch.testing.assert_close(out[:, :, :far], torch.ones(1, 1, far, HEAD_DIM), rtol=0, atol=1e-6)
    assert (out[:, :, far:] > 1e20).all()


@pytest.mark.parametrize("backward", ["compiled", "python"])
def test_the_biased_flash_backward_gives_no_gradient_to_probabilities_below_2_to_the_minus_64(backward,
                                                                                          monkeypatch):
    """The forward keeps them (the flash kernel's output is exact); the backward, compiled or Python, sets
    them to 0 as the chunked kernel does: key 5's value of 1e30 would give them gradients near 1e4."""
    if backward == "compiled":
        assert compiled_kernels.biased_attention_backward() is not None, "the compiled kernel did not build"
    else:
        monkeypatch.setattr(compiled_kernels, "biased_attention_backward", lambda: None)
    q, k, v, mask, _ = _far_keys_negligible("dense")
    mask = mask.clone().requires_grad_()
    BiasedFlashAttention.apply(q, k, v, mask, 1.0).sum().backward()
    offsets = torch.arange(LENGTH)[None, :] - torch.arange(LENGTH)[:, None]
    assert (mask.grad[0, 0][offsets >= 3] == 0).all()
    assert (mask.grad[0, 0][offsets < 3].abs() > 0).any()
