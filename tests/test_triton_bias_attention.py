"""The Triton kernel for a learned bias shared by the batch, against the equation step by step: forward and
gradients (q, k, v, the batch-summed bias, a distance bias's Toeplitz rows and [CLS] values, the relative
products of Shaw keys and DeBERTa read by offset, Shaw's value table), key padding as row lengths,
attention dropout; models on it against the paper equations and the explicit path. Without a GPU the
kernels run through Triton's interpreter (TRITON_INTERPRET=1, which tests/conftest.py sets)."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import (PRESETS, assert_gradients_close, assert_kernel_took_the_terms_rows, build_model,
                      features_and_grads, preset_config, random_tokens, runs_on)
from paper_equations import deberta_delta, encoder_features

from tupe_plugin.attention import paths, triton_bias_attention
from tupe_plugin.attention.attend import add_mask_
from tupe_plugin.attention.paths import AttentionPath
from tupe_plugin.attention.relative_terms import RelativeRows, offsets_of
from tupe_plugin.attention.triton_bias_attention import band_half_width, biased_attention, keep_mask
from tupe_plugin.encodings import positional_term
from tupe_plugin.encodings.deberta_position import DisentangledRelativeTable
from tupe_plugin.encodings.position_config import PositionConfig
from tupe_plugin.encodings.shaw_position import clipped_index
from tupe_plugin.terms.forward import Forward
from tupe_plugin.terms.parts import OffsetRows, ProjectedTable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def twin(q, k, v, bias, lengths, scale, keep=None, dropout=0.0, value_table=None, value_index=None):
    """softmax(scale q k^T + bias + padding) (times keep / (1 - p)) v, step by step; with Shaw's
    ``value_table`` each output gains sum_j P~_ij a_{value_index[i, j]} (Wang et al., Eq. 4)."""
    logits = scale * q @ k.transpose(-1, -2)
    if bias is not None:
        logits = logits + bias
    if lengths is not None:
        padded = torch.arange(q.size(2), device=q.device)[None, :] >= lengths[:, None]
        logits = logits.masked_fill(padded[:, None, None, :], torch.finfo(logits.dtype).min)
    probs = torch.softmax(logits, -1)
    if keep is not None:
        probs = probs * keep / (1 - dropout)
    out = probs @ v
    return out if value_table is None else out + shaw_value_term(probs, value_table, value_index, v.size(-1))


def shaw_value_term(probs, value_table, value_index, width):
    """sum_j probs_ij a_{index[i, j]} through the (T, T, d_a) vectors of every pair, zero-padded to
    ``width``."""
    per_pair = value_table[value_index]
    return F.pad(torch.einsum("bhij,ijd->bhid", probs, per_pair), (0, width - value_table.size(-1)))


def inputs(batch, heads, seq_len, head_dim, with_bias=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=generator).to(DEVICE).requires_grad_()
               for _ in range(3))
    bias = torch.randn(1, heads, seq_len, seq_len, generator=generator).to(DEVICE).requires_grad_() \
        if with_bias else None
    return q, k, v, bias


def gradients(out, tensors, grad_out):
    wanted = [t for t in tensors if t is not None]
    return torch.autograd.grad(out, wanted, grad_out)


@pytest.mark.parametrize("seq_len, head_dim", [(20, 16), (1, 16), (33, 24)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("padded", [True, False])
def test_the_kernel_gives_the_equation_and_its_gradients(seq_len, head_dim, with_bias, padded):
    q, k, v, bias = inputs(3, 2, seq_len, head_dim, with_bias)
    lengths = torch.tensor([seq_len, max(1, seq_len // 2), max(1, seq_len - 3)], device=DEVICE) if padded \
        else None
    out = biased_attention(q, k, v, bias, lengths, scale=0.3)
    expected = twin(q, k, v, bias, lengths, 0.3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, (q, k, v, bias), grad_out),
                         gradients(expected, (q, k, v, bias), grad_out)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("padded", [True, False])
def test_with_dropout_the_kernel_gives_the_equation_under_its_keep_mask(padded):
    q, k, v, bias = inputs(2, 2, 24, 16)
    lengths = torch.tensor([24, 9], device=DEVICE) if padded else None
    out = biased_attention(q, k, v, bias, lengths, scale=0.25, dropout=0.3, seed=11)
    keep = keep_mask(q.shape, 0.3, 11, DEVICE)
    expected = twin(q, k, v, bias, lengths, 0.25, keep, 0.3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, (q, k, v, bias), grad_out),
                         gradients(expected, (q, k, v, bias), grad_out)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def toeplitz_index(seq_len, low, high, sign=1):
    """(T, T) clip(sign (j - i), low, high) - low: a table row for every pair that depends on j - i alone."""
    positions = torch.arange(seq_len, device=DEVICE)
    return (sign * (positions[None, :] - positions[:, None])).clamp(low, high) - low


def pair_rows(seq_len, row_of_pair):
    """(T, T) the table row ``row_of_pair(i, j)`` of every (query i, key j), pair by pair."""
    return torch.tensor([[row_of_pair(i, j) for j in range(seq_len)] for i in range(seq_len)], device=DEVICE)


def relative_logits(q, k, query_side, key_side=(None, None), scale=0.3):
    """scale q_i . rows[h, index[i, j]] of the query side's (rows, index), plus scale k_j . rows[h, index[i,
    j]] of the key side's, through the (H, T, T, d) rows of every pair (Wang et al., Eq. 4; He et al.,
    Eq. 4)."""
    heads = q.size(1)
    logits = 0
    for x, (rows, index), equation in ((q, query_side, "bhid,hijd->bhij"), (k, key_side, "bhjd,hijd->bhij")):
        if rows is not None:
            per_pair = rows.expand(heads, -1, -1)[:, index]
            logits = logits + scale * torch.einsum(equation, x[..., :per_pair.size(-1)], per_pair)
    return logits


def shaw_case(seq_len, max_distance, generator, by_distance=False):
    """Shaw's table (1, 2K + 1, 8), narrower than the heads of 16, by clip(j - i) as the layer hands it to
    the kernel, and its rows of every pair; ``by_distance``: a table by |j - i| clipped at K (an index not
    monotone in j - i)."""
    table = torch.randn(1, 2 * max_distance + 1, 8, generator=generator).to(DEVICE).requires_grad_()
    if by_distance:
        index = pair_rows(seq_len, lambda i, j: min(abs(j - i), max_distance))
        return (table,), RelativeRows(table, offsets_of(index)), ((table, index),)
    index = pair_rows(seq_len, lambda i, j: max(-max_distance, min(max_distance, j - i)) + max_distance)
    relative = RelativeRows(table, offsets_of(clipped_index(seq_len, max_distance, DEVICE)))
    return (table,), relative, ((table, index),)


def deberta_case(seq_len, heads, max_distance, buckets, p2c, generator):
    """DeBERTa's K^r and Q^r (H, 2k, 16), the rows this length reaches handed to the kernel with the offsets
    of the plugin's table as the layer hands them, and delta(i, j) (and Eq. 4's p2c row delta(j, i)) of
    every pair, by the paper's definition."""
    config = SimpleNamespace(deberta_max_distance=max_distance, deberta_buckets=buckets, deberta_p2c=p2c)
    table = DisentangledRelativeTable(16, max_distance, buckets, released_p2c=p2c == "released")
    key_rows, query_rows = (torch.randn(heads, 2 * table.span, 16, generator=generator).to(DEVICE)
                            .requires_grad_() for _ in range(2))
    term = positional_term.PositionalTerm(scale=1.0)
    table.contribute(term, Forward.of_length(seq_len))
    first, count = table.rows_and_index(seq_len)[:2]
    used = slice(first, first + count)
    relative = RelativeRows(key_rows[:, used], term.get(ProjectedTable).offsets, query_rows[:, used],
                            term.get(ProjectedTable).p2c_offsets.flip(0))
    c2p = pair_rows(seq_len, lambda i, j: deberta_delta(i, j, config))
    p2c_rows = c2p if p2c == "released" else pair_rows(seq_len, lambda i, j: deberta_delta(j, i, config))
    return (key_rows, query_rows), relative, ((key_rows, c2p), (query_rows, p2c_rows))


RELATIVE_CASES = {
    "shaw-K3": lambda seq_len, generator: shaw_case(seq_len, 3, generator),
    "shaw-K40": lambda seq_len, generator: shaw_case(seq_len, 40, generator),  # K beyond T
    "by-distance": lambda seq_len, generator: shaw_case(seq_len, 3, generator, by_distance=True),
    "deberta-buckets": lambda seq_len, generator: deberta_case(seq_len, 2, 5, 4, "released", generator),
    "deberta-paper-K8": lambda seq_len, generator: deberta_case(seq_len, 2, 8, 0, "paper", generator)}


@pytest.mark.parametrize("case, seq_len, padded, dropout", [
    ("shaw-K3", 20, True, 0.0), ("by-distance", 20, False, 0.0), ("shaw-K40", 24, True, 0.3),
    ("deberta-buckets", 24, True, 0.3),
    # several blocks of queries and keys, T not a multiple of the block, tiles that read one row
    ("deberta-paper-K8", 70, True, 0.0)])
def test_relative_rows_give_the_equation_and_its_gradients(case, seq_len, padded, dropout):
    """Shaw keys and DeBERTa's c2p and p2c from the table rows, multiplied per tile inside the kernel,
    against the same terms gathered pair by pair: the output and the gradients of q, k, v, the bias and the
    tables."""
    q, k, v, bias = inputs(2, 2, seq_len, 16)
    tables, relative, sides = RELATIVE_CASES[case](seq_len, torch.Generator().manual_seed(1))
    lengths = torch.tensor([seq_len, seq_len - 7], device=DEVICE) if padded else None
    out = biased_attention(q, k, v, bias, lengths, 0.3, dropout, seed=5, relative=relative)
    keep = keep_mask(q.shape, dropout, 5, DEVICE) if dropout else None
    expected = twin(q, k, v, bias + relative_logits(q, k, *sides), lengths, 0.3, keep, dropout)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    tensors = (q, k, v, bias, *tables)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, tensors, grad_out), gradients(expected, tensors, grad_out)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def distance_case(heads, seq_len, with_rows=True, with_cls=True, seed=2):
    """Toeplitz rows (H, 2T - 1) and [CLS] values (H, 2) of a distance bias (or None), leaves."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(heads, 2 * seq_len - 1, generator=generator).to(DEVICE).requires_grad_() \
        if with_rows else None
    cls = torch.randn(heads, 2, generator=generator).to(DEVICE).requires_grad_() if with_cls else None
    return rows, cls


def expanded_distance_bias(rows, cls, heads, seq_len):
    """The (H, T, T) bias the rows and the reset stand for: ``rows[h, j - i + T - 1]`` (zero without rows),
    then query row 0 := cls[h, 0] and key column 0 of the other rows := cls[h, 1] (TUPE Eq. 9-11)."""
    positions = torch.arange(seq_len, device=DEVICE)
    dense = torch.zeros(heads, seq_len, seq_len, device=DEVICE) if rows is None \
        else rows[:, positions[None, :] - positions[:, None] + seq_len - 1]
    if cls is None:
        return dense
    first_row, first_column = (positions[:, None] == 0), (positions[None, :] == 0)
    return torch.where(first_row, cls[:, 0, None, None],
                       torch.where(first_column, cls[:, 1, None, None], dense))


@pytest.mark.parametrize("seq_len, with_rows, with_cls, with_bias, padded, dropout", [
    (20, True, False, False, False, 0.0),
    (20, True, True, True, True, 0.0),  # added to the dense bias, the reset in place of the rows' values
    (24, True, True, False, True, 0.3),
    (20, False, True, True, False, 0.0),  # the reset without rows: in place of zeros
    (1, True, True, False, False, 0.0),
    # several blocks of queries and keys, T not a multiple of the block
    (150, True, True, True, True, 0.0), (70, True, True, True, True, 0.2)])
def test_distance_rows_give_the_expanded_bias_and_its_gradients(seq_len, with_rows, with_cls, with_bias,
                                                                padded, dropout):
    """The Toeplitz rows and the [CLS] values read inside the kernel, against the twin with the (H, T, T)
    bias they stand for: the output and the gradients of q, k, v, the dense bias, the rows and the [CLS]
    values (each summed over the batch)."""
    q, k, v, bias = inputs(3, 2, seq_len, 16, with_bias)
    rows, cls = distance_case(2, seq_len, with_rows, with_cls)
    lengths = torch.tensor([seq_len, max(1, seq_len - 7), max(1, seq_len // 3)], device=DEVICE) if padded \
        else None
    out = biased_attention(q, k, v, bias, lengths, 0.3, dropout, seed=9, bias_rows=rows, cls=cls)
    keep = keep_mask(q.shape, dropout, 9, DEVICE) if dropout else None
    expected_bias = expanded_distance_bias(rows, cls, 2, seq_len) + (0 if bias is None else bias)
    expected = twin(q, k, v, expected_bias, lengths, 0.3, keep, dropout)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    tensors = (q, k, v, bias, rows, cls)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, tensors, grad_out), gradients(expected, tensors, grad_out)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_fixed_distance_rows_give_the_equation_and_the_gradients_of_q_k_v():
    """Rows without a gradient (ALiBi's fixed slopes): the backward on the kernel's 64-row tiles."""
    q, k, v, _ = inputs(2, 2, 70, 16, with_bias=False)
    rows, _ = distance_case(2, 70, with_cls=False)
    rows = rows.detach()
    lengths = torch.tensor([70, 33], device=DEVICE)
    out = biased_attention(q, k, v, None, lengths, 0.3, bias_rows=rows)
    expected = twin(q, k, v, expanded_distance_bias(rows, None, 2, 70), lengths, 0.3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, (q, k, v), grad_out), gradients(expected, (q, k, v), grad_out)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_distance_rows_with_relative_rows_give_the_equation_and_its_gradients():
    """The distance bias beside Shaw keys' table rows (the kernel's 32-row tiles), over several blocks."""
    q, k, v, bias = inputs(2, 2, 70, 16)
    tables, relative, sides = shaw_case(70, 3, torch.Generator().manual_seed(1))
    rows, cls = distance_case(2, 70)
    lengths = torch.tensor([70, 41], device=DEVICE)
    out = biased_attention(q, k, v, bias, lengths, 0.3, relative=relative, bias_rows=rows, cls=cls)
    expected = twin(q, k, v, bias + expanded_distance_bias(rows, cls, 2, 70) + relative_logits(q, k, *sides),
                    lengths, 0.3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    tensors = (q, k, v, bias, rows, cls, *tables)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, tensors, grad_out), gradients(expected, tensors, grad_out)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("rows_shape, cls_shape, message", [
    ((2, 20), None, r"distance bias rows must be \(H, 2T - 1\) = \(2, 19\) for T = 10 .* got \(2, 20\)"),
    ((2, 19), (2, 3), r"\[CLS\] reset values must be \(H, 2\) = \(2, 2\) .* got \(2, 3\)")])
def test_distance_rows_of_the_wrong_shape_are_refused_naming_the_shape_they_need(rows_shape, cls_shape,
                                                                                  message):
    q, k, v, _ = inputs(1, 2, 10, 16, with_bias=False)
    rows = torch.zeros(rows_shape, device=DEVICE)
    cls = None if cls_shape is None else torch.zeros(cls_shape, device=DEVICE)
    with pytest.raises(ValueError, match=message):
        biased_attention(q, k, v, bias_rows=rows, cls=cls)


@pytest.mark.parametrize("seq_len, max_distance, shaw_keys, dropout", [
    (20, 3, True, 0.0),
    (33, 40, False, 0.0),  # K beyond T: every pair within the band
    (24, 2, True, 0.3),
    (150, 5, False, 0.0)])  # several blocks of queries and keys, T not a multiple of the block
def test_shaw_value_vectors_give_the_equation_and_its_gradients(seq_len, max_distance, shaw_keys, dropout):
    """Shaw's value term (with and without the key term of the same table, with a learned bias, rows padded
    shorter than K, a table narrower than the head) against the equation with the vectors of every pair
    gathered; under dropout with the kernel's keep-mask."""
    q, k, v, bias = inputs(3, 2, seq_len, 16, with_bias=max_distance < seq_len)
    generator = torch.Generator().manual_seed(3)
    index = toeplitz_index(seq_len, -max_distance, max_distance)
    table = torch.randn(2 * max_distance + 1, 8, generator=generator).to(DEVICE).requires_grad_()
    lengths = torch.tensor([seq_len, seq_len - 7, 2], device=DEVICE) if max_distance < seq_len else None
    relative = RelativeRows(table[None], offsets_of(index)) if shaw_keys else None
    out = biased_attention(q, k, v, bias, lengths, 0.3, dropout, seed=7, relative=relative, value_table=table,
                           value_offsets=offsets_of(index))
    logits_term = bias
    if shaw_keys:
        logits_term = relative_logits(q, k, (table[None], index)) + (0 if bias is None else bias)
    keep = keep_mask(q.shape, dropout, 7, DEVICE) if dropout else None
    expected = twin(q, k, v, logits_term, lengths, 0.3, keep, dropout, table, index)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    tensors = (q, k, v, bias, table)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, tensors, grad_out), gradients(expected, tensors, grad_out)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_value_vectors_by_any_index_of_the_offset_alone_give_the_equation_and_its_gradients():
    """A table row by |j - i| clipped at 3: both sides share rows and the two far ends one row, which the
    kernel adds onto atomically."""
    q, k, v, bias = inputs(2, 2, 40, 16)
    positions = torch.arange(40, device=DEVICE)
    index = (positions[None, :] - positions[:, None]).abs().clamp(max=3)
    table = torch.randn(4, 16, generator=torch.Generator().manual_seed(4)).to(DEVICE).requires_grad_()
    lengths = torch.tensor([40, 29], device=DEVICE)
    out = biased_attention(q, k, v, bias, lengths, 0.3, value_table=table, value_offsets=offsets_of(index))
    expected = twin(q, k, v, bias, lengths, 0.3, value_table=table, value_index=index)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    tensors = (q, k, v, bias, table)
    grad_out = torch.randn_like(out)
    for got, want in zip(gradients(out, tensors, grad_out), gradients(expected, tensors, grad_out)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("seq_len, max_distance, band", [(10, 3, 3), (4, 6, 3), (1, 3, 1)])
def test_the_band_of_a_clipped_index_is_its_distance_within_the_length(seq_len, max_distance, band):
    """K, or within shorter inputs the farthest offset T - 1 (which reads the end row); at least 1."""
    index = toeplitz_index(seq_len, -max_distance, max_distance)
    assert band_half_width(offsets_of(index)).tolist() == [band]


def test_offsets_of_a_toeplitz_index_give_it_back():
    index = toeplitz_index(6, -2, 3)
    offsets = offsets_of(index)
    positions = torch.arange(6, device=DEVICE)
    assert torch.equal(offsets[positions[None, :] - positions[:, None] + 5], index)


def test_the_keep_rate_is_one_minus_the_dropout():
    keep = keep_mask((2, 2, 64, 64), 0.25, 3, DEVICE)
    assert abs(keep.float().mean().item() - 0.75) < 0.01


def test_a_seed_gives_its_own_keep_mask_and_the_same_one_again():
    first, again, other = (keep_mask((1, 2, 16, 16), 0.5, seed, DEVICE) for seed in (1, 1, 2))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert not torch.equal(first[0, 0], first[0, 1])  # one stream per (batch row, head)


def test_padded_keys_take_no_attention_and_get_no_gradient():
    q, k, v, bias = inputs(2, 2, 20, 16)
    lengths = torch.tensor([20, 11], device=DEVICE)
    out = biased_attention(q, k, v, bias, lengths)
    with torch.no_grad():
        v_changed = v.clone()
        v_changed[1, :, 11:] += 100
    torch.testing.assert_close(biased_attention(q, k, v_changed, bias, lengths)[1], out[1])
    grad_k, grad_v = torch.autograd.grad(out.sum(), (k, v))
    assert not grad_k[1, :, 11:].any() and not grad_v[1, :, 11:].any()


def test_on_cpu_without_the_interpreter_the_kernel_names_the_flag(monkeypatch):
    monkeypatch.delenv(triton_bias_attention.INTERPRET, raising=False)
    q, k, v, _ = inputs(1, 1, 4, 16)
    with pytest.raises(RuntimeError, match="--attention-backend triton needs a CUDA device"):
        biased_attention(q.cpu(), k.cpu(), v.cpu())



SHAW_VALUES = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, rel_pos="shaw-learned")


@pytest.mark.parametrize("need_weights, expected", [(False, AttentionPath.TRITON),
                                                     (True, AttentionPath.EXPLICIT)])
def test_the_triton_backend_runs_shaw_value_vectors_unless_maps_are_wanted(need_weights, expected):
    assert paths.choose_path("cuda", 0.1, need_weights, SHAW_VALUES, 64, "triton") is expected
    assert paths.backend_problem("triton", SHAW_VALUES, 0.1) is None


def test_shaw_keys_and_values_on_the_triton_backend_give_the_loss_and_gradients_of_auto(dictionary,
                                                                                          monkeypatch):
    """bert_rpe (Shaw keys and values, K = 3 < T) on the kernel, every layer, against the same weights on
    --attention-backend auto (the explicit path on CPU): the masked LM loss and every gradient."""
    fused = build_model("bert_rpe_tiny", dictionary, attention_backend="triton",
                        shaw_max_distance=3).to(DEVICE)
    auto = build_model("bert_rpe_tiny", dictionary, shaw_max_distance=3).to(DEVICE)
    auto.load_state_dict(fused.state_dict())
    tokens = random_tokens(dictionary, [9, 6, 2]).to(DEVICE)
    targets = random_tokens(dictionary, [9, 6, 2], seed=1).to(DEVICE)
    tables = []
    original = triton_bias_attention.TritonBiasedAttention.apply
    monkeypatch.setattr(triton_bias_attention.TritonBiasedAttention, "apply",
                        lambda *a: tables.append(a[12]) or original(*a))

    def loss_and_grads(model):
        model.zero_grad()
        logits = model(tokens)[0]
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=dictionary.pad())
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    fused_loss, fused_grads = loss_and_grads(fused)
    assert len(tables) == fused.args.encoder_layers and all(t is not None for t in tables)
    auto_loss, auto_grads = loss_and_grads(auto)
    assert len(tables) == fused.args.encoder_layers
    torch.testing.assert_close(fused_loss, auto_loss, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, auto_grads)


SHAW_KEYS = {"shaw_keys_only": True, "shaw_max_distance": 3}


@pytest.mark.parametrize("preset, overrides", [
    ("bert_rpe", SHAW_KEYS), ("bert_sin_rpe", SHAW_KEYS), ("deberta", {"deberta_max_distance": 3}),
    ("deberta", {"deberta_p2c": "paper", "deberta_rel_proj_bias": "none", "deberta_max_distance": 4}),
    ("deberta", {"deberta_share_att_key": True, "deberta_buckets": 4, "deberta_max_distance": 5})])
def test_shaw_keys_and_deberta_on_the_triton_backend_give_the_paper_equations(preset, overrides, dictionary,
                                                                              monkeypatch):
    """The relative terms read inside the kernel (no (B, H, T, T) mask), forward and every gradient."""
    model = build_model(f"{preset}_tiny", dictionary, attention_backend="triton", **overrides).to(DEVICE)
    tokens = random_tokens(dictionary, [9, 6, 4]).to(DEVICE)
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim, device=DEVICE) * keep
    calls = []
    original = triton_bias_attention.TritonBiasedAttention.apply

    def recording(q, k, v, bias, *rest):
        calls.append(bias)
        return original(q, k, v, bias, *rest)

    monkeypatch.setattr(triton_bias_attention.TritonBiasedAttention, "apply", recording)
    fused, fused_grads = features_and_grads(model, tokens, weights)
    assert calls == [None] * model.args.encoder_layers
    encoder = model.encoder.sentence_encoder
    plain, plain_grads = features_and_grads(model, tokens, weights, lambda t: encoder_features(encoder, t))
    torch.testing.assert_close(fused * keep, plain * keep, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, plain_grads)


# Biases of the offset in their O(T) form (T5's buckets, ALiBi's fixed rows with no gradient, KERPLE's r1 / r2
# and FIRE's MLP behind the rows, TUPE-R's untied product as the dense bias beside T5's rows): every preset
# whose encodings add OffsetRows and whose every part the kernel reads as the plan hands it over (PATH_READS:
# not a LayerTerm), then T5's buckets with the [CLS] reset, which no preset sets
DISTANCE_MODELS = [(preset, {}) for preset in PRESETS if OffsetRows in preset_config(preset).part_types()
                   and runs_on(AttentionPath.TRITON, preset)] + [("bert_r", {"cls_reset": "paper"})]
DISTANCE_IDS = [preset + "-cls_reset" * bool(overrides) for preset, overrides in DISTANCE_MODELS]


@pytest.mark.parametrize("preset, overrides", [
    ("tupe_a", {}), ("bert_a", {}), ("bert_rpe", SHAW_KEYS), ("deberta", {}), *DISTANCE_MODELS])
@pytest.mark.parametrize("attention_dropout", [0.0, 0.2])
def test_a_model_on_the_triton_backend_gives_the_explicit_paths_function_and_gradients(
        preset, overrides, attention_dropout, dictionary, monkeypatch):
    """Every layer on the kernel (the shared bias apart from the padding, a distance bias as its Toeplitz
    rows and [CLS] values, Shaw keys and DeBERTa's terms read by offset); the twin on the explicit path (the
    distance bias expanded, those terms gathered into the mask) with the kernel's keep-masks, drawn layer by
    layer from the same seeds."""
    model = build_model(f"{preset}_tiny", dictionary, attention_backend="triton",
                        attention_dropout=attention_dropout, **overrides).to(DEVICE)
    tokens = random_tokens(dictionary, [9, 6, 4]).to(DEVICE)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim, device=DEVICE)
    seeds, masks, calls = iter(range(100, 200)), [], []
    original = triton_bias_attention.TritonBiasedAttention.apply

    def recording(q, k, v, bias, lengths, scale, dropout, seed, *relative):
        seed = next(seeds)
        calls.append(lengths.tolist())
        masks.append(keep_mask(q.shape, dropout, seed, q.device) if dropout else None)
        return original(q, k, v, bias, lengths, scale, dropout, seed, *relative)

    monkeypatch.setattr(triton_bias_attention.TritonBiasedAttention, "apply", recording)
    fused, fused_grads = features_and_grads(model, tokens, weights)
    assert calls == [[9, 6, 4]] * model.args.encoder_layers
    layer_masks = iter(masks)

    def explicit_with_the_kernels_masks(q, k, v, mask, scale, dropout, *rest):
        keep = next(layer_masks)
        logits = scale * q @ k.transpose(-1, -2)
        probs = torch.softmax(logits if mask is None else add_mask_(logits, mask), -1)
        return (probs if keep is None else probs * keep / (1 - dropout)) @ v, probs

    monkeypatch.setattr(paths, "choose_path", lambda *a: AttentionPath.EXPLICIT)
    monkeypatch.setattr("tupe_plugin.attention.attend.explicit_attention", explicit_with_the_kernels_masks)
    explicit, explicit_grads = features_and_grads(model, tokens, weights)
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    torch.testing.assert_close(fused * keep, explicit * keep, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, explicit_grads)


@pytest.mark.parametrize("preset, overrides", DISTANCE_MODELS, ids=DISTANCE_IDS)
def test_a_distance_bias_reaches_the_triton_kernel_as_its_rows_and_no_dense_tensor_is_built_for_it(
        preset, overrides, dictionary, monkeypatch):
    """The kernel gets the term's Toeplitz rows (H, 2T - 1) and [CLS] values (H, 2) as they are, and as its
    dense bias TUPE's untied product alone (the only (H, T, T) tensor of the forward) or none; the distance
    bias is never expanded."""
    model = build_model(f"{preset}_tiny", dictionary, attention_backend="triton", **overrides).to(DEVICE)
    tokens = random_tokens(dictionary, [9, 6, 4]).to(DEVICE)
    calls = []
    original = triton_bias_attention.TritonBiasedAttention.apply
    monkeypatch.setattr(triton_bias_attention.TritonBiasedAttention, "apply",
                        lambda *a: calls.append((a[3], a[14], a[15])) or original(*a))
    expanded, toeplitz = [], positional_term.toeplitz
    monkeypatch.setattr(positional_term, "toeplitz", lambda *a: expanded.append(a) or toeplitz(*a))
    model(tokens, features_only=True)[0].sum().backward()
    assert expanded == []
    assert_kernel_took_the_terms_rows(model, tokens.size(1), calls)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_half_precision_the_kernel_stays_within_the_cuda_tolerances_of_the_float32_equation(dtype):
    q, k, v, bias = inputs(4, 4, 192, 64)
    lengths = torch.tensor([192, 130, 64, 1], device=DEVICE)
    half = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = biased_attention(*half, bias, lengths, scale=0.125)
    expected = twin(q, k, v, bias, lengths, 0.125)
    assert (out.float() - expected).abs().max().item() <= 0.05
    grad_out = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(out, [*half, bias], grad_out.to(dtype)),
                         gradients(expected, (q, k, v, bias), grad_out)):
        assert (got.float() - want).abs().max().item() <= 0.06 * max(1.0, want.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_half_precision_distance_rows_stay_within_the_cuda_tolerances_of_the_float32_equation(dtype):
    """The Toeplitz rows and the [CLS] values (float32, as the shared term hands them) beside a dense bias
    at a base-size head, with padding, against the float32 twin with the (H, T, T) bias they stand for:
    forward and the gradients of q, k, v, the dense bias, the rows and the [CLS] values."""
    q, k, v, bias = inputs(4, 4, 192, 64)
    rows, cls = distance_case(4, 192)
    lengths = torch.tensor([192, 130, 64, 1], device=DEVICE)
    half = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = biased_attention(*half, bias, lengths, 0.125, bias_rows=rows, cls=cls)
    expected = twin(q, k, v, bias + expanded_distance_bias(rows, cls, 4, 192), lengths, 0.125)
    assert (out.float() - expected).abs().max().item() <= 0.05
    grad_out = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(out, [*half, bias, rows, cls], grad_out.to(dtype)),
                         gradients(expected, (q, k, v, bias, rows, cls), grad_out)):
        assert (got.float() - want).abs().max().item() <= 0.06 * max(1.0, want.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_half_precision_relative_rows_stay_within_the_cuda_tolerances_of_the_float32_equation(dtype):
    """Shaw-like (K = 16, one table for the heads) and DeBERTa-like (rows per head on the key side, reversed
    offsets) terms at a base-size head, with padding, against the float32 twin with the rows of every pair
    gathered: forward and the gradients of q, k, v and both tables."""
    q, k, v, _ = inputs(2, 4, 192, 64, with_bias=False)
    generator = torch.Generator().manual_seed(2)
    query_index, key_index = toeplitz_index(192, -16, 16), toeplitz_index(192, -40, 39, sign=-1)
    query_rows = torch.randn(1, 33, 64, generator=generator).to(DEVICE).requires_grad_()
    key_rows = torch.randn(4, 80, 64, generator=generator).to(DEVICE).requires_grad_()
    lengths = torch.tensor([192, 77], device=DEVICE)
    half = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, query_rows, key_rows)]
    relative = RelativeRows(half[3], offsets_of(query_index), half[4], offsets_of(key_index))
    out = biased_attention(*half[:3], None, lengths, 0.125, relative=relative)
    gathered = relative_logits(q, k, (query_rows, query_index), (key_rows, key_index), scale=0.125)
    expected = twin(q, k, v, gathered, lengths, 0.125)
    assert (out.float() - expected).abs().max().item() <= 0.05
    grad_out = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(out, half, grad_out.to(dtype)),
                         gradients(expected, (q, k, v, query_rows, key_rows), grad_out)):
        assert (got.float() - want).abs().max().item() <= 0.06 * max(1.0, want.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_in_half_precision_shaw_value_vectors_stay_within_the_cuda_tolerances_of_the_float32_equation(dtype):
    """Shaw keys and values (K = 16, one table) at a base-size head, with padding and dropout, against the
    float32 twin under the kernel's keep-mask: the sums by distance stay float32 inside the kernel."""
    q, k, v, _ = inputs(2, 4, 192, 64, with_bias=False)
    generator = torch.Generator().manual_seed(2)
    index = toeplitz_index(192, -16, 16)
    table = (0.1 * torch.randn(33, 64, generator=generator)).to(DEVICE).requires_grad_()
    lengths = torch.tensor([192, 77], device=DEVICE)
    half = [t.detach().to(dtype).requires_grad_() for t in (q, k, v, table)]
    out = biased_attention(*half[:3], None, lengths, 0.125, 0.1, seed=3,
                           relative=RelativeRows(half[3][None], offsets_of(index)), value_table=half[3],
                           value_offsets=offsets_of(index))
    keep = keep_mask(q.shape, 0.1, 3, DEVICE)
    expected = twin(q, k, v, relative_logits(q, k, (table[None], index), scale=0.125), lengths, 0.125, keep,
                    0.1, table, index)
    assert (out.float() - expected).abs().max().item() <= 0.05
    grad_out = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(out, half, grad_out.to(dtype)),
                         gradients(expected, (q, k, v, table), grad_out)):
        assert (got.float() - want).abs().max().item() <= 0.06 * max(1.0, want.abs().max().item())
