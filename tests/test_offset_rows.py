"""A bias of the offset j - i in its O(T) form, the Toeplitz rows (H, 2T - 1) with the [CLS] reset (H, 2),
read by the CPU kernels tile by tile: against its dense twin ``rows[h, j - i + T - 1]`` with row 0 :=
theta_1 and column 0 := theta_2 (TUPE Eq. 9-11), forward and every gradient, for the kernels and for every
encoding."""

import pytest
import torch
from conftest import assert_gradients_close, build_model, choices_of_kind, features_and_grads, random_tokens
from tupe_plugin.attention import compiled_kernels, cpu_kernels, paths
from tupe_plugin.attention.cpu_kernels import BiasedFlashAttention, ChunkedAttention
from tupe_plugin.attention.dropout import keep_mask, keep_probability
from tupe_plugin.attention import offset_rows
from tupe_plugin.attention.offset_rows import PeriodicRows, dense_gradient_folded, edges
from tupe_plugin.attention.paths import AttentionPath
from tupe_plugin.encodings import positional_term
from tupe_plugin.encodings.offset_bias import toeplitz

BATCH, HEADS, LENGTH, HEAD_DIM = 3, 2, 11, 8
SCALE, DROPOUT = 0.3, 0.2
BLOCK = 4  # query rows of a block: LENGTH is not a multiple of it


def _dense_twin(rows, cls):
    """The bias written out entry by entry."""
    seq_len = (rows.size(1) + 1) // 2
    dense = torch.stack([torch.stack([rows[:, j - i + seq_len - 1] for j in range(seq_len)], -1)
                         for i in range(seq_len)], -2)
    if cls is not None:
        first = torch.arange(seq_len) == 0
        dense = torch.where(first[:, None], cls[:, 0, None, None],
                            torch.where(first[None, :], cls[:, 1, None, None], dense))
    return dense


def test_the_dense_form_of_the_rows_is_the_toeplitz_matrix_with_the_reset():
    rows, cls = torch.randn(HEADS, 2 * LENGTH - 1), torch.randn(HEADS, 2)
    torch.testing.assert_close(toeplitz(rows, cls), _dense_twin(rows, cls), rtol=0, atol=0)
    torch.testing.assert_close(toeplitz(rows), _dense_twin(rows, None), rtol=0, atol=0)


def test_the_reset_as_edges_replaces_row_0_and_column_0_of_the_rows():
    rows, cls = torch.randn(HEADS, 2 * LENGTH - 1), torch.randn(HEADS, 2)
    row, column = edges(rows, cls)
    with_edges = _dense_twin(rows, None)
    with_edges[:, 0, :] += row
    with_edges[:, :, 0] += column
    torch.testing.assert_close(with_edges, _dense_twin(rows, cls))


@pytest.mark.parametrize("block", [1, BLOCK, LENGTH])
def test_a_block_reads_its_bias_as_a_view_of_the_periodic_rows_and_its_gradient_folds_back_by_offset(block):
    rows = torch.randn(HEADS, 2 * LENGTH - 1, dtype=torch.float64)
    periodic = PeriodicRows(rows, block)
    grad = torch.randn(HEADS, LENGTH, LENGTH, dtype=torch.float64)
    for first in range(0, LENGTH, block):
        queries, heads = slice(first, min(first + block, LENGTH)), slice(0, HEADS)
        torch.testing.assert_close(periodic.bias(heads, queries), _dense_twin(rows, None)[:, queries],
                                   rtol=0, atol=0)
        periodic.add_gradient(grad[:, queries], heads, queries)
    twin_rows = rows.clone().requires_grad_()
    (_dense_twin(twin_rows, None) * grad).sum().backward()
    torch.testing.assert_close(periodic.folded(), twin_rows.grad)


@pytest.fixture(params=["compiled", "periodic"])
def offset_ops(request, monkeypatch):
    """How the kernels read the rows and sum their gradient: the compiled ops (which must build here), or
    the periodic layout's views."""
    if request.param == "compiled":
        assert compiled_kernels.offset_rows_ops() is not None, "the compiled ops did not build"
    else:
        monkeypatch.setattr(compiled_kernels, "offset_rows_ops", lambda: None)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [1, BLOCK, LENGTH])
def test_the_compiled_ops_add_a_blocks_bias_from_the_rows_and_sum_its_gradient_by_offset(block, dtype):
    add_rows, add_gradient = compiled_kernels.offset_rows_ops()
    rows = torch.randn(HEADS + 1, 2 * LENGTH - 1, dtype=dtype)
    dense = _dense_twin(rows, None)
    grad = torch.randn(HEADS, LENGTH, LENGTH, dtype=dtype)
    grad_rows = torch.zeros_like(rows)
    for first in range(0, LENGTH, block):
        queries = slice(first, min(first + block, LENGTH))
        logits = torch.randn(HEADS, queries.stop - first, LENGTH, dtype=dtype)
        expected = logits + dense[1:, queries]
        add_rows(logits, rows, 1, first)  # heads 1 .. HEADS of the rows
        torch.testing.assert_close(logits, expected, rtol=0, atol=0)
        add_gradient(grad_rows, grad[:, queries].contiguous(), 1, first)
    twin_rows = rows.clone().requires_grad_()
    (_dense_twin(twin_rows, None)[1:] * grad).sum().backward()
    torch.testing.assert_close(grad_rows, twin_rows.grad)


def test_the_compiled_ops_refuse_a_block_outside_the_rows():
    add_rows, _ = compiled_kernels.offset_rows_ops()
    rows = torch.randn(HEADS, 2 * LENGTH - 1)
    with pytest.raises(RuntimeError, match="query rows within T"):
        add_rows(torch.zeros(HEADS, BLOCK, LENGTH), rows, 0, LENGTH - 1)
    with pytest.raises(RuntimeError, match="heads within"):
        add_rows(torch.zeros(HEADS, BLOCK, LENGTH), rows, 1, 0)
    with pytest.raises(RuntimeError, match="2T - 1"):
        add_rows(torch.zeros(HEADS, BLOCK, LENGTH + 1), rows, 0, 0)


@pytest.mark.parametrize("batch", [1, BATCH], ids=["shared", "per_row"])
@pytest.mark.parametrize("with_cls", [True, False], ids=["cls_reset", "no_reset"])
@pytest.mark.parametrize("block", [BLOCK, LENGTH], ids=["row_blocks", "whole_rows"])
def test_a_dense_gradient_folds_into_the_gradients_of_the_rows_and_the_reset(block, with_cls, batch,
                                                                              offset_ops, monkeypatch):
    monkeypatch.setattr(offset_rows, "BLOCK_CELLS", block * LENGTH)
    rows = torch.randn(HEADS, 2 * LENGTH - 1, dtype=torch.float64, requires_grad=True)
    cls = torch.randn(HEADS, 2, dtype=torch.float64, requires_grad=True) if with_cls else None
    grad = torch.randn(batch, HEADS, LENGTH, LENGTH, dtype=torch.float64)
    (_dense_twin(rows, cls)[None] * grad).sum().backward()
    grad_rows, grad_cls = dense_gradient_folded(grad, with_cls)
    torch.testing.assert_close(grad_rows, rows.grad)
    if with_cls:
        torch.testing.assert_close(grad_cls, cls.grad)
    else:
        assert grad_cls is None


def _key_padding():
    """(B, 1, 1, T), True = attend: row b keeps its first LENGTH - 2 b keys."""
    return (torch.arange(LENGTH)[None, :] < LENGTH - 2 * torch.arange(BATCH)[:, None])[:, None, None, :]


def _mask(dense, padding):
    """The kernels' mask: the dense part with the padding at the most negative float, or the padding alone."""
    if dense is None:
        return padding
    return dense.masked_fill(~padding, torch.finfo(torch.float32).min) if padding is not None else dense


def _plain(q, k, v, rows, cls, dense, padding, keep):
    logits = torch.matmul(q, k.transpose(-1, -2)) * SCALE + _dense_twin(rows, cls)
    if dense is not None:
        logits = logits + dense
    if padding is not None:
        logits = logits.masked_fill(~padding, torch.finfo(torch.float32).min)
    probs = torch.softmax(logits, -1)
    if keep is not None:
        probs = probs * keep / keep_probability(DROPOUT)
    return torch.matmul(probs, v)


@pytest.fixture(params=["compiled", "python"])
def backward(request, monkeypatch):
    """BiasedFlashAttention's backward: the compiled kernel (which must build here), or the Python one."""
    if request.param == "compiled":
        assert compiled_kernels.biased_attention_backward() is not None, "the compiled kernel did not build"
        monkeypatch.setattr(cpu_kernels, "MIN_BLOCK_ROWS", 1)
        monkeypatch.setattr(cpu_kernels, "BLOCK_LOGITS", BLOCK * LENGTH)
    else:
        monkeypatch.setattr(compiled_kernels, "biased_attention_backward", lambda: None)
    return request.param


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "ROW_BLOCK_LOGITS", BLOCK * LENGTH)
    monkeypatch.setattr(cpu_kernels, "MIN_ROW_BLOCK_ROWS", 1)
    monkeypatch.setattr(cpu_kernels, "WHOLE_ROWS_UP_TO", BLOCK)


def _run_against_twin(kernel, dropout, with_cls, dense_kind, padded):
    """Output and gradients of ``kernel`` and of the plain formula (float64)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64) for _ in range(3))
    rows = torch.randn(HEADS, 2 * LENGTH - 1, dtype=torch.float64)
    cls = torch.randn(HEADS, 2, dtype=torch.float64) if with_cls else None
    dense = {"none": None, "shared": torch.randn(1, HEADS, LENGTH, LENGTH, dtype=torch.float64)}[dense_kind]
    padding = _key_padding() if padded else None
    grad_out = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64)
    keep = None
    if dropout:
        torch.manual_seed(7)
        keep = keep_mask((BATCH, HEADS, LENGTH, LENGTH), DROPOUT, "cpu")

    def fused(q, k, v, rows, cls, dense):
        offset = (rows, *((None, None) if cls is None else edges(rows, cls)))
        mask = _mask(dense, padding)
        if kernel == "chunked":
            torch.manual_seed(7)  # the kernel draws one keep-mask of the whole (B, H, T, T)
            return ChunkedAttention.apply(q, k, v, mask, SCALE, DROPOUT if dropout else 0.0, *offset)
        return BiasedFlashAttention.apply(q, k, v, mask, SCALE, *offset)

    inputs = {"q": q, "k": k, "v": v, "rows": rows, "cls": cls, "dense": dense}
    results = []
    for fn in (fused, lambda *t: _plain(*t, padding, keep)):
        leaves = {name: t.detach().requires_grad_() for name, t in inputs.items() if t is not None}
        out = fn(*(leaves.get(name) for name in inputs))
        out.backward(grad_out)
        results.append((out.detach(), {name: t.grad for name, t in leaves.items()}))
    return results


def _assert_close(got, expected):
    (out, grads), (expected_out, expected_grads) = got, expected
    torch.testing.assert_close(out, expected_out, atol=1e-10, rtol=1e-10)
    assert set(grads) == set(expected_grads)
    for name in expected_grads:
        torch.testing.assert_close(grads[name], expected_grads[name], atol=1e-10, rtol=1e-10, msg=name)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("dense_kind", ["none", "shared"])
@pytest.mark.parametrize("with_cls", [True, False], ids=["cls_reset", "no_reset"])
def test_biased_flash_attention_with_rows_is_the_plain_formula_with_the_dense_twin(
        with_cls, dense_kind, padded, backward, small_blocks):
    _assert_close(*_run_against_twin("biased_flash", False, with_cls, dense_kind, padded))


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("dense_kind", ["none", "shared"])
@pytest.mark.parametrize("with_cls", [True, False], ids=["cls_reset", "no_reset"])
@pytest.mark.parametrize("dropout", [True, False], ids=["dropout", "no_dropout"])
def test_chunked_attention_with_rows_is_the_plain_formula_with_the_dense_twin(
        dropout, with_cls, dense_kind, padded, offset_ops, small_blocks):
    _assert_close(*_run_against_twin("chunked", dropout, with_cls, dense_kind, padded))


def test_whole_rows_of_short_sequences_read_the_rows_as_blocks_do():
    """Up to WHOLE_ROWS_UP_TO positions a block holds every query row (and heads together)."""
    _assert_close(*_run_against_twin("chunked", True, True, "shared", True))


def test_fixed_rows_get_no_gradient():
    q, k, v = (torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM) for _ in range(3))
    q.requires_grad_()
    rows = torch.randn(HEADS, 2 * LENGTH - 1)
    BiasedFlashAttention.apply(q, k, v, None, SCALE, rows, None, None).sum().backward()
    assert q.grad is not None and rows.grad is None


# Every registered encoding with a bias of the offset, with and without the [CLS] reset, then the options
# of the papers' rows: (preset, flags)
ENCODINGS = [("bert_nope", dict({family: choice}, **reset))
             for family, choice in choices_of_kind("bias", "distance_bias")
             for reset in ({}, {"cls_reset": "paper"})] + [
    ("tupe_r", {}),
    ("tupe_r", {"cls_reset": "release", "untied_proj_bias": True}),
    ("bert_alibi_asym", {}),
    ("bert_fire", {"fire_signed": True, "cls_reset": "paper"}),
]

def _ids(case):
    preset, flags = case
    return "-".join([preset, *(f"{name}={value}" for name, value in sorted(flags.items()))])


@pytest.mark.parametrize("attention_dropout", [0.0, 0.2], ids=["biased_flash", "chunked"])
@pytest.mark.parametrize("case", ENCODINGS, ids=[_ids(case) for case in ENCODINGS])
def test_training_with_the_bias_rows_equals_the_explicit_path_with_the_dense_bias(
        case, attention_dropout, dictionary, monkeypatch):
    """Padded rows of a length that is not a multiple of the block: features and every parameter's gradient
    (the rows', the buckets', KERPLE's r1 / r2, FIRE's MLP, the slopes, the untied factors, the thetas); the
    kernel path never builds the dense bias."""
    monkeypatch.setattr(cpu_kernels, "CHUNK_LOGITS", 16 * 75)  # the rows past 40 positions
    monkeypatch.setattr(cpu_kernels, "ROW_BLOCK_LOGITS", 16 * 75)
    monkeypatch.setattr(cpu_kernels, "MIN_ROW_BLOCK_ROWS", 1)
    monkeypatch.setattr(cpu_kernels, "WHOLE_ROWS_UP_TO", 16)
    preset, flags = case
    model = build_model(f"{preset}_tiny", dictionary, max_positions=80, attention_dropout=attention_dropout,
                        **flags).double()  # float64: the gradients of a head's constant (FIRE's output bias)
    tokens = random_tokens(dictionary, [75, 70, 41])  # are sums of dS that cancel to 0, float32's noise
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim, dtype=torch.float64)
    plan = model.encoder.sentence_encoder.attention_plan(tokens.device, False, tokens.size(1))
    assert plan.offset_bias_as_rows
    expanded = []
    original = positional_term.toeplitz
    monkeypatch.setattr(positional_term, "toeplitz", lambda *a: expanded.append(1) or original(*a))
    fused, fused_grads = features_and_grads(model, tokens, weights, seed=3)
    assert expanded == []
    monkeypatch.setattr(paths, "choose_path", lambda *a: AttentionPath.EXPLICIT)
    explicit, explicit_grads = features_and_grads(model, tokens, weights, seed=3)
    assert expanded == [1]
    torch.testing.assert_close(fused, explicit, atol=1e-10, rtol=1e-10)
    assert_gradients_close(fused_grads, explicit_grads, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("case", ENCODINGS, ids=[_ids(case) for case in ENCODINGS])
def test_evaluation_with_the_bias_rows_equals_the_explicit_path_with_the_dense_bias(case, dictionary,
                                                                                    monkeypatch):
    """Without dropout or gradients, past a chunk, the biased-flash kernel reads the rows, learned or fixed:
    no dense bias is built."""
    monkeypatch.setattr(cpu_kernels, "CHUNK_LOGITS", 16 * 75)  # the rows past 40 positions
    monkeypatch.setattr(cpu_kernels, "ROW_BLOCK_LOGITS", 16 * 75)
    monkeypatch.setattr(cpu_kernels, "MIN_ROW_BLOCK_ROWS", 1)
    monkeypatch.setattr(cpu_kernels, "WHOLE_ROWS_UP_TO", 16)
    preset, flags = case
    model = build_model(f"{preset}_tiny", dictionary, max_positions=80, **flags).double().eval()
    tokens = random_tokens(dictionary, [75, 70, 41])
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    expanded = []
    original = positional_term.toeplitz
    monkeypatch.setattr(positional_term, "toeplitz", lambda *a: expanded.append(1) or original(*a))
    with torch.no_grad():
        plan = model.encoder.sentence_encoder.attention_plan(tokens.device, False, tokens.size(1))
        assert plan.path is AttentionPath.BIASED_FLASH and plan.offset_bias_as_rows
        fused = model(tokens, features_only=True)[0]
        assert expanded == []
        monkeypatch.setattr(paths, "choose_path", lambda *a: AttentionPath.EXPLICIT)
        explicit = model(tokens, features_only=True)[0]
    torch.testing.assert_close(fused * keep, explicit * keep, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kernel", ["biased_flash", "chunked"])
def test_under_cpu_autocast_the_kernels_compute_in_float32_and_the_rows_gradient_is_float32(kernel):
    """Biased flash answers in the inputs' dtype; the chunked kernel, whose inputs autocast casts to float32
    (custom_fwd), in float32."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM).bfloat16().requires_grad_() for _ in range(3))
    rows, cls = torch.randn(HEADS, 2 * LENGTH - 1, requires_grad=True), torch.randn(HEADS, 2)

    def run(*inputs):
        offset = (inputs[3], *edges(inputs[3], cls))
        if kernel == "chunked":
            return ChunkedAttention.apply(*inputs[:3], None, SCALE, 0.0, *offset)
        return BiasedFlashAttention.apply(*inputs[:3], None, SCALE, *offset)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(q, k, v, rows)
    out.float().sum().backward()
    reference = run(*(t.detach().float() for t in (q, k, v)), rows.detach())
    assert out.dtype == (torch.bfloat16 if kernel == "biased_flash" else torch.float32)
    assert all(t.grad.dtype == torch.bfloat16 for t in (q, k, v))
    assert rows.grad.dtype == torch.float32 and torch.isfinite(rows.grad).all()
    torch.testing.assert_close(out.float(), reference, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("preset", ["bert_r", "bert_alibi"], ids=["learned", "fixed"])
@pytest.mark.parametrize("seq_len, as_rows", [(512, False), (513, True)])
def test_the_rows_reach_the_chunked_kernel_and_evaluation_where_a_heads_logits_exceed_a_chunk(
        seq_len, as_rows, preset, dictionary):
    """With dropout, and without gradients, the dense bias built once per forward serves up to T = 512; past
    it the rows are read."""
    config = build_model(f"{preset}_tiny", dictionary, max_positions=seq_len).encoder.sentence_encoder.config
    assert paths.plan_attention("cpu", 0.1, False, config, seq_len).offset_bias_as_rows == as_rows
    with torch.no_grad():
        assert paths.plan_attention("cpu", 0.0, False, config, seq_len).offset_bias_as_rows == as_rows
    assert not paths.plan_attention("cpu", 0.1, True, config, seq_len).offset_bias_as_rows  # explicit


@pytest.mark.parametrize("preset", ["bert_r", "bert_alibi"], ids=["learned", "fixed"])
@pytest.mark.parametrize("seq_len", [129, 512, 513])
def test_the_rows_reach_the_biased_flash_kernel_in_training_at_every_length_past_the_head_dim(seq_len, preset,
                                                                                            dictionary):
    """Its backward reads the rows where it would read a dense bias from memory."""
    config = build_model(f"{preset}_tiny", dictionary, max_positions=seq_len).encoder.sentence_encoder.config
    plan = paths.plan_attention("cpu", 0.0, False, config, seq_len)
    assert plan.path is paths.AttentionPath.BIASED_FLASH and plan.offset_bias_as_rows


@pytest.mark.parametrize("seq_len, as_rows", [(129, False), (512, False), (513, True)])
def test_tupe_rs_t5_bias_joins_its_untied_product_on_the_biased_flash_kernel_up_to_512(seq_len, as_rows,
                                                                                      dictionary):
    """The untied product is a dense bias the kernel reads anyway; past T = 512 the rows are read beside
    it."""
    config = build_model("tupe_r_tiny", dictionary, max_positions=seq_len).encoder.sentence_encoder.config
    plan = paths.plan_attention("cpu", 0.0, False, config, seq_len)
    assert plan.path is paths.AttentionPath.BIASED_FLASH and plan.offset_bias_as_rows == as_rows


def test_the_biased_flash_output_from_rows_merges_its_heads_without_a_copy():
    """Laid out (B, T, H, D) as the flash kernel's: the layer's (B, T, H D) merge is a view, not a copy that
    the output projection would keep for its backward beside the kernel's own."""
    q, k, v = (torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM) for _ in range(3))
    out = BiasedFlashAttention.apply(q, k, v, None, SCALE, torch.randn(HEADS, 2 * LENGTH - 1))
    merged = out.transpose(1, 2).reshape(BATCH, LENGTH, HEADS * HEAD_DIM)
    assert merged.data_ptr() == out.data_ptr() and merged._base is not None
