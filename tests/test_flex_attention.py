"""FlexAttention as a model path (``--attention-backend flex``) against the equation step by step: the bias
shared by the batch, a distance bias's Toeplitz rows and [CLS] values, key padding as row lengths, the
relative products of Shaw keys and DeBERTa read by offset; the plan that picks it, its refusals (attention
dropout, Shaw value vectors, gradients on CPU, where FlexAttention has no backward) and models on it against
``--attention-backend auto``. On CPU FlexAttention runs eagerly and without gradients: the gradients are
checked on CUDA (``make test-gpu``)."""

import pytest
import torch
from conftest import (PRESETS, assert_kernel_took_the_terms_rows, build_model, preset_config, random_tokens,
                      runs_on)

from tupe_plugin.attention import paths
from tupe_plugin.attention.attend import attend, explicit_attention
from tupe_plugin.attention.flex_bias_attention import flex_biased_attention
from tupe_plugin.attention.paths import AttentionPath
from tupe_plugin.attention.relative_terms import RelativeProducts, RelativeRows, offsets_of
from tupe_plugin.encodings import positional_term
from tupe_plugin.encodings.position_config import PositionFlagError
from tupe_plugin.terms.parts import OffsetRows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

def toeplitz_index(seq_len, low, high, sign=1):
    """(T, T) clip(sign (j - i), low, high) - low: a table row for every pair that depends on j - i alone."""
    positions = torch.arange(seq_len, device=DEVICE)
    return (sign * (positions[None, :] - positions[:, None])).clamp(low, high) - low


def case(terms, seq_len, lengths=None, batch=2, heads=2, head_dim=8, requires_grad=False, seed=0):
    """Random q, k, v, the flex path's arguments for ``terms`` (a subset of bias, shaw, deberta) and the
    twin's additive (B, H, T, T) mask: the bias, the products gathered by their (T, T) index, the padding
    (built from the leaves, so that with ``requires_grad`` the twin's gradients reach them)."""
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape):
        return torch.randn(*shape, generator=generator).to(DEVICE).requires_grad_(requires_grad)

    q, k, v = (tensor(batch, heads, seq_len, head_dim) for _ in range(3))
    mask = torch.zeros(batch, heads, seq_len, seq_len, device=DEVICE)
    bias = tensor(1, heads, seq_len, seq_len) if "bias" in terms else None
    relative = RelativeProducts()
    if bias is not None:
        mask = mask + bias
    if "shaw" in terms:  # scale q a^T over 2K + 1 rows, read by clip(j - i, -K, K)
        index = toeplitz_index(seq_len, -2, 2)
        products = tensor(batch, heads, seq_len, 5)
        relative = RelativeProducts(products, offsets_of(index))
        mask = mask + products.gather(-1, index.expand(batch, heads, -1, -1))
    if "deberta" in terms:  # c2p by delta(i, j), p2c by key j's row of the reversed, otherwise clipped offset
        query_index, key_index = toeplitz_index(seq_len, -3, 3), toeplitz_index(seq_len, -4, 5, sign=-1)
        query_products, key_products = tensor(batch, heads, seq_len, 7), tensor(batch, heads, seq_len, 10)
        relative = RelativeProducts(query_products, offsets_of(query_index),
                                    key_products, offsets_of(key_index))
        mask = mask + query_products.gather(-1, query_index.expand(batch, heads, -1, -1)) \
            + key_products.gather(-1, key_index.t().expand(batch, heads, -1, -1)).transpose(-1, -2)
    key_lengths = None if lengths is None else torch.tensor(lengths, device=DEVICE)
    if key_lengths is not None:
        padded = torch.arange(seq_len, device=DEVICE)[None, :] >= key_lengths[:, None]
        mask = mask.masked_fill(padded[:, None, None, :], torch.finfo(mask.dtype).min)
    return q, k, v, bias, key_lengths, relative, mask


def distance_terms(heads, seq_len, with_rows=True, with_cls=True, requires_grad=False, seed=3):
    """Toeplitz rows (H, 2T - 1) and [CLS] values (H, 2) of a distance bias (or None), and the (H, T, T)
    bias they stand for: ``rows[h, j - i + T - 1]`` (zero without rows), then query row 0 := cls[h, 0] and
    key column 0 of the other rows := cls[h, 1] (TUPE Eq. 9-11)."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(heads, 2 * seq_len - 1, generator=generator).to(DEVICE).requires_grad_(requires_grad) \
        if with_rows else None
    cls = torch.randn(heads, 2, generator=generator).to(DEVICE).requires_grad_(requires_grad) if with_cls \
        else None
    positions = torch.arange(seq_len, device=DEVICE)
    dense = torch.zeros(heads, seq_len, seq_len, device=DEVICE) if rows is None \
        else rows[:, positions[None, :] - positions[:, None] + seq_len - 1]
    if cls is not None:
        dense = torch.where(positions[:, None] == 0, cls[:, 0, None, None],
                            torch.where(positions[None, :] == 0, cls[:, 1, None, None], dense))
    return rows, cls, dense


@pytest.mark.parametrize("terms, seq_len, lengths, with_rows, with_cls", [
    ((), 8, None, True, False), ((), 7, [7, 3], True, True), (("bias",), 7, None, False, True),
    (("bias", "deberta"), 8, [8, 3], True, True)],
    ids=["rows", "rows_cls_padded", "bias_cls", "bias_deberta_rows_cls_padded"])
def test_the_flex_path_adds_the_distance_rows_and_the_cls_values_of_the_expanded_bias(terms, seq_len, lengths,
                                                                                      with_rows, with_cls):
    """The Toeplitz rows read by j - i, the [CLS] values in their place, added to the dense bias and the
    products, against the twin with the (H, T, T) bias they stand for."""
    q, k, v, bias, key_lengths, relative, mask = case(terms, seq_len, lengths)
    rows, cls, dense = distance_terms(2, seq_len, with_rows, with_cls)
    with torch.no_grad():
        out = flex_biased_attention(q, k, v, bias, key_lengths, 0.3, relative, bias_rows=rows, cls=cls)
        expected, _ = explicit_attention(q, k, v, mask + dense, 0.3, 0.0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_the_flex_path_refuses_distance_rows_of_the_wrong_length_naming_the_shape_they_need():
    q, k, v, *_ = case((), 6)
    with pytest.raises(ValueError, match=r"distance bias rows must be \(H, 2T - 1\) = \(2, 11\) for T = 6"):
        flex_biased_attention(q, k, v, bias_rows=torch.zeros(2, 12, device=DEVICE))


def test_on_cpu_the_flex_path_refuses_gradients_of_the_distance_rows():
    q, k, v, *_ = case((), 6)
    rows, cls, _ = distance_terms(2, 6, requires_grad=True)
    with pytest.raises(RuntimeError, match="--attention-backend flex trains on CUDA only"):
        flex_biased_attention(q.cpu(), k.cpu(), v.cpu(), bias_rows=rows.cpu(), cls=cls.cpu())


def test_on_cpu_without_gradients_the_flex_path_reads_distance_rows_that_are_parameters():
    """Under torch.no_grad() a parameter handed as it is (the [CLS] reset's thetas) still requires a gradient:
    evaluation runs, it is not refused as training."""
    q, k, v, *_ = case((), 6)
    rows, cls, dense = distance_terms(2, 6, requires_grad=True)
    with torch.no_grad():
        out = flex_biased_attention(q, k, v, None, None, 0.3, bias_rows=rows, cls=cls)
        expected, _ = explicit_attention(q, k, v, dense, 0.3, 0.0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("terms, seq_len, lengths", [
    (("bias",), 8, None), (("bias",), 7, [7, 1]), (("shaw",), 7, [7, 4]), (("deberta",), 7, None),
    (("bias", "deberta"), 8, [8, 3])],
    ids=["bias", "bias_padded", "shaw_keys", "deberta", "bias_deberta_padded"])
def test_the_flex_path_gives_the_explicit_equation(terms, seq_len, lengths):
    """Every row of the output, padded query rows included (they attend to their row's keys); T = 7 not a
    power of two."""
    q, k, v, bias, key_lengths, relative, mask = case(terms, seq_len, lengths)
    with torch.no_grad():
        out = flex_biased_attention(q, k, v, bias, key_lengths, 0.3, relative)
        expected, _ = explicit_attention(q, k, v, mask, 0.3, 0.0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_a_row_without_keys_gets_the_explicit_paths_uniform_probabilities():
    q, k, v, bias, key_lengths, _, mask = case(("bias",), 5, [5, 0])
    with torch.no_grad():
        out = flex_biased_attention(q, k, v, bias, key_lengths, 0.3)
        expected, _ = explicit_attention(q, k, v, mask, 0.3, 0.0)
    torch.testing.assert_close(out[1], v[1].mean(-2, keepdim=True).expand_as(out[1]))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_attend_runs_the_flex_path_with_the_bias_the_lengths_and_the_products_of_the_relative_rows():
    """attend hands FlexAttention the products of q with Shaw's table rows (RelativeRows.products), read
    by clip(j - i)."""
    q, k, v, bias, key_lengths, _, mask = case(("bias",), 6, [6, 2])
    index = toeplitz_index(6, -2, 2)
    table = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        out, probs = attend(AttentionPath.FLEX, q, k, v, bias, 0.3, 0.0, key_lengths=key_lengths,
                            relative=RelativeRows(table, offsets_of(index)))
        shaw = 0.3 * torch.einsum("bhid,ijd->bhij", q, table[0][index])
        expected, _ = explicit_attention(q, k, v, mask + shaw, 0.3, 0.0)
    assert probs is None
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_the_flex_backend_refuses_attention_dropout_naming_both_flags(dictionary):
    with pytest.raises(PositionFlagError, match=r"--attention-backend flex runs no attention dropout .* "
                                                r"--attention-dropout is 0\.1: pass --attention-dropout 0"):
        build_model("tupe_r_tiny", dictionary, attention_backend="flex", attention_dropout=0.1)


def test_the_flex_backend_refuses_shaw_value_vectors(dictionary):
    with pytest.raises(PositionFlagError, match="--attention-backend flex does not add Shaw value vectors"):
        build_model("bert_rpe_tiny", dictionary, attention_backend="flex")


def test_attend_refuses_attention_dropout_on_the_flex_path():
    q, k, v, bias, *_ = case(("bias",), 4)
    with pytest.raises(ValueError, match="--attention-backend flex runs no attention dropout"):
        attend(AttentionPath.FLEX, q, k, v, bias, 0.3, 0.1)


SHAW_KEYS = {"shaw_keys_only": True, "shaw_max_distance": 3}


@pytest.mark.parametrize("preset, overrides", [
    ("tupe_r", {}), ("bert_rpe", SHAW_KEYS), ("deberta", {"deberta_max_distance": 3})])
def test_a_model_on_the_flex_backend_gives_the_features_of_the_auto_backend(preset, overrides, dictionary,
                                                                             monkeypatch):
    """Every layer on FlexAttention (the bias apart from the padding, Shaw keys and DeBERTa's terms read by
    offset), against the same model on the default paths (those terms gathered into the mask)."""
    model = build_model(f"{preset}_tiny", dictionary, attention_backend="flex", **overrides).to(DEVICE).eval()
    tokens = random_tokens(dictionary, [9, 6, 4]).to(DEVICE)
    calls = []

    def recording(q, k, v, bias, key_lengths, *rest, **named):
        calls.append(key_lengths.tolist())
        return flex_biased_attention(q, k, v, bias, key_lengths, *rest, **named)

    monkeypatch.setattr("tupe_plugin.attention.attend.flex_biased_attention", recording)
    with torch.no_grad():
        flex, _ = model(tokens, features_only=True)
        assert calls == [[9, 6, 4]] * model.args.encoder_layers
        model.encoder.sentence_encoder.attention_backend = "auto"
        auto, _ = model(tokens, features_only=True)
    torch.testing.assert_close(flex, auto, atol=1e-5, rtol=1e-5)


# Biases of the offset in their O(T) form: every preset whose encodings add OffsetRows and whose every part
# FlexAttention reads as the plan hands it over (PATH_READS: not a LayerTerm), then T5's buckets with the
# [CLS] reset, which no preset sets
DISTANCE_MODELS = [(preset, {}) for preset in PRESETS if OffsetRows in preset_config(preset).part_types()
                   and runs_on(AttentionPath.FLEX, preset)] + [("bert_r", {"cls_reset": "paper"})]
DISTANCE_IDS = [preset + "-cls_reset" * bool(overrides) for preset, overrides in DISTANCE_MODELS]


def flex_features(model, tokens, monkeypatch):
    """The features of ``model`` on FlexAttention without gradients, what attend handed it layer by layer
    (the dense bias, the distance rows, the [CLS] values) and the distance biases expanded meanwhile."""
    calls, expanded, toeplitz = [], [], positional_term.toeplitz

    def recording(q, k, v, bias, key_lengths, scale, relative, bias_rows=None, cls=None):
        calls.append((bias, bias_rows, cls))
        return flex_biased_attention(q, k, v, bias, key_lengths, scale, relative, bias_rows, cls)

    with monkeypatch.context() as patches:
        patches.setattr("tupe_plugin.attention.attend.flex_biased_attention", recording)
        patches.setattr(positional_term, "toeplitz", lambda *a: expanded.append(a) or toeplitz(*a))
        with torch.no_grad():
            features = model(tokens, features_only=True)[0]
    return features, calls, expanded


@pytest.mark.parametrize("preset, overrides", DISTANCE_MODELS, ids=DISTANCE_IDS)
def test_a_model_with_a_distance_bias_on_the_flex_backend_gives_the_explicit_paths_features(
        preset, overrides, dictionary, monkeypatch):
    """The rows and [CLS] values read by j - i in the score_mod, every layer, against the explicit path with
    the distance bias expanded into the mask."""
    model = build_model(f"{preset}_tiny", dictionary, attention_backend="flex", **overrides).to(DEVICE).eval()
    tokens = random_tokens(dictionary, [9, 6, 4]).to(DEVICE)
    flex, calls, _ = flex_features(model, tokens, monkeypatch)
    assert len(calls) == model.args.encoder_layers
    monkeypatch.setattr(paths, "choose_path", lambda *a: AttentionPath.EXPLICIT)
    with torch.no_grad():
        explicit, _ = model(tokens, features_only=True)
    torch.testing.assert_close(flex, explicit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("preset, overrides", DISTANCE_MODELS, ids=DISTANCE_IDS)
def test_a_distance_bias_reaches_flexattention_as_its_rows_and_no_dense_tensor_is_built_for_it(
        preset, overrides, dictionary, monkeypatch):
    """FlexAttention gets the term's Toeplitz rows (H, 2T - 1) and [CLS] values (H, 2) as they are, and as
    its dense bias TUPE's untied product alone or none; the distance bias is never expanded."""
    model = build_model(f"{preset}_tiny", dictionary, attention_backend="flex", **overrides).to(DEVICE).eval()
    tokens = random_tokens(dictionary, [9, 6, 4]).to(DEVICE)
    _, calls, expanded = flex_features(model, tokens, monkeypatch)
    assert expanded == []
    assert_kernel_took_the_terms_rows(model, tokens.size(1), calls)


def gradients(out, tensors, grad_out):
    return torch.autograd.grad(out, [t for t in tensors if t is not None], grad_out)


@pytest.mark.gpu
@pytest.mark.parametrize("terms, lengths", [
    (("bias",), [64, 37]), (("shaw",), None), (("bias", "deberta"), [64, 20])],
    ids=["bias_padded", "shaw_keys", "bias_deberta_padded"])
def test_on_cuda_the_compiled_flex_path_gives_the_equation_and_its_gradients(terms, lengths):
    """Forward and the gradients of q, k, v, the batch-summed bias and the relative products, float32."""
    q, k, v, bias, key_lengths, relative, mask = case(terms, 64, lengths, head_dim=16, requires_grad=True)
    out = flex_biased_attention(q, k, v, bias, key_lengths, 0.25, relative)
    expected, _ = explicit_attention(q, k, v, mask, 0.25, 0.0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    tensors = (q, k, v, bias, relative.query, relative.key)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, tensors, grad_out), gradients(expected, tensors, grad_out)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("terms, lengths", [((), None), (("bias",), [64, 37])],
                         ids=["rows_cls", "bias_padded"])
def test_on_cuda_the_compiled_flex_path_gives_the_distance_rows_and_their_gradients(terms, lengths):
    """Forward and the gradients of q, k, v, the dense bias, the Toeplitz rows and the [CLS] values (each
    summed over the batch), float32."""
    q, k, v, bias, key_lengths, relative, mask = case(terms, 64, lengths, head_dim=16, requires_grad=True)
    rows, cls, dense = distance_terms(2, 64, requires_grad=True)
    out = flex_biased_attention(q, k, v, bias, key_lengths, 0.25, relative, bias_rows=rows, cls=cls)
    expected, _ = explicit_attention(q, k, v, mask + dense, 0.25, 0.0)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    tensors = (q, k, v, bias, rows, cls)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, tensors, grad_out), gradients(expected, tensors, grad_out)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_half_precision_the_flex_path_with_distance_rows_stays_within_the_cuda_tolerances(dtype):
    """A base-size head with the bias, the Toeplitz rows and [CLS] values (float32, as the shared term
    hands them) and padding, against the float32 twin: forward and every gradient."""
    q, k, v, bias, key_lengths, _, mask = case(("bias",), 192, [192, 77], heads=4, head_dim=64,
                                               requires_grad=True)
    rows, cls, dense = distance_terms(4, 192, requires_grad=True)
    half = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = flex_biased_attention(*half, bias, key_lengths, 0.125, bias_rows=rows, cls=cls)
    expected, _ = explicit_attention(q, k, v, mask + dense, 0.125, 0.0)
    assert (out.float() - expected).abs().max().item() <= 0.05
    grad_out = torch.randn_like(expected)
    got = torch.autograd.grad(out, [*half, bias, rows, cls], grad_out.to(dtype))
    for mine, reference in zip(got, gradients(expected, (q, k, v, bias, rows, cls), grad_out)):
        assert (mine.float() - reference).abs().max().item() <= 0.06 * max(1.0, reference.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_half_precision_the_flex_path_stays_within_the_cuda_tolerances_of_the_float32_equation(dtype):
    """A base-size head with the bias, DeBERTa-like products and padding, against the float32 twin."""
    q, k, v, bias, key_lengths, relative, mask = case(("bias", "deberta"), 192, [192, 77], heads=4,
                                                      head_dim=64, requires_grad=True)
    leaves = (q, k, v, bias, relative.query, relative.key)
    half = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, relative.query, relative.key)]
    half_relative = RelativeProducts(half[3], relative.query_offsets, half[4], relative.key_offsets)
    out = flex_biased_attention(*half[:3], bias, key_lengths, 0.125, half_relative)
    expected, _ = explicit_attention(q, k, v, mask, 0.125, 0.0)
    assert (out.float() - expected).abs().max().item() <= 0.05
    grad_out = torch.randn_like(expected)
    got = torch.autograd.grad(out, [*half[:3], bias, *half[3:]], grad_out.to(dtype))
    for mine, reference in zip(got, gradients(expected, leaves, grad_out)):
        assert (mine.float() - reference).abs().max().item() <= 0.06 * max(1.0, reference.abs().max().item())
