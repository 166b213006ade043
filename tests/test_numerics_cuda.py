"""fp16 / bf16 on CUDA: the checks of test_numerics.py (written for CPU bf16) on the GPU's kernels.

Every position preset, tiny and medium size, in two precisions and two ways of running them:

* ``autocast``: ``torch.autocast("cuda", dtype)`` (fairseq's ``--amp``; the benchmark's ``--fp16`` /
  ``--bf16``): projections and the fused attention in fp16/bf16, embeddings, LayerNorm and the built
  mask float32 (autocast casts the mask to the query's dtype inside ``scaled_dot_product_attention``);
* ``model``: the whole model cast (fairseq's ``--fp16`` / ``--bf16``): the term and the mask are built
  in fp16/bf16, padded keys at that dtype's most negative value.

Checked: finite features, logits and gradients; features close to the plain float32 path (explicit
matmul-softmax-matmul, ``need_attn=True``); padded keys get exactly zero attention and leave the real
tokens' features as they are without padding; no overflow of the summed bias (T5 + untied term) in
fp16 at T = 512 with content-free logits up to ~4e4; a layer fed a query whose keys are all padding stays
finite. Skipped, not passed, where torch sees no CUDA device. Every measured error is attached to its
test (``record_property``; ``pytest -o junit_family=xunit1 --junitxml=FILE`` keeps them); docs/benchmarks.md
says what has been measured so far.
"""

import contextlib
import copy
import functools

import pytest
import torch
from conftest import PRESETS, build_model, make_dictionary, preset_encodings, random_tokens
from tupe_plugin.attention.paths import plan_attention
from tupe_plugin.terms.parts import OffsetRows

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SIZES = ["tiny", "medium"]
MODES = ["autocast", "model"]
LENGTHS = [512, 1, 5]  # a long row, a row that is only <s>, a short one
# Largest |features - float32 plain path| over real tokens (features are LayerNorm-ed, of order 1).
# bf16 keeps 8 significant bits, fp16 11; a cast model also runs LayerNorm and the residual stream in
# that dtype. On an H100 (two runs, the same largest errors: 0.0021, 0.019, 0.013, 0.108 in the order
# below) the bounds are 1.4x to 3x those; a cast model's features are where bf16/fp16 rounding shows most.
FEATURE_TOLERANCE = {("fp16", "autocast"): 0.006, ("bf16", "autocast"): 0.05,
                     ("fp16", "model"): 0.02, ("bf16", "model"): 0.15}
# Largest relative error ||g - g_fp32|| / ||g_fp32|| of a parameter's gradient (training mode, no dropout);
# measured on the H100: 0.0022, 0.020, 0.0028, 0.026; the bounds about 3x those.
GRADIENT_TOLERANCE = {("fp16", "autocast"): 0.006, ("bf16", "autocast"): 0.06,
                      ("fp16", "model"): 0.008, ("bf16", "model"): 0.08}
# The encodings whose parameters _large_position_parameters scales, and every preset using one of them
LARGE_TERM_ENCODINGS = ("t5", "untied", "shaw")
LARGE_TERM_PRESETS = [preset for preset in PRESETS
                      if any(encoding.name in LARGE_TERM_ENCODINGS for encoding in preset_encodings(preset))]


@functools.lru_cache(maxsize=None)
def _float32_model(preset, size):
    """One float32 model per architecture on the GPU (callers copy it before changing it)."""
    torch.manual_seed(0)
    return build_model(f"{preset}_{size}", make_dictionary(), max_positions=max(LENGTHS)).cuda()


def _model(preset, size, precision, mode, train=False):
    model = copy.deepcopy(_float32_model(preset, size)).train(train)
    return model.to(DTYPES[precision]) if mode == "model" else model


def _context(precision, mode):
    return torch.autocast("cuda", dtype=DTYPES[precision], enabled=mode == "autocast")


def _tokens(lengths=LENGTHS):
    return random_tokens(make_dictionary(), lengths).cuda()


def _keep(tokens):
    return tokens.ne(make_dictionary().pad()).unsqueeze(-1)


@functools.lru_cache(maxsize=None)
def _plain_float32_features(preset, size):
    """The float32 reference: every layer's explicit matmul-softmax-matmul (need_attn=True)."""
    model = _float32_model(preset, size).eval()
    with torch.no_grad():
        return model(_tokens(), features_only=True, need_attn=True)[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset", PRESETS)
def test_fused_forward_is_finite_and_close_to_the_plain_float32_path(
        preset, size, precision, mode, record_property):
    model = _model(preset, size, precision, mode)
    tokens = _tokens()
    with torch.no_grad(), _context(precision, mode):
        features = model(tokens, features_only=True)[0]
        logits = model(tokens)[0]
    assert torch.isfinite(features).all() and torch.isfinite(logits).all()
    keep = _keep(tokens)
    error = ((features.float() - _plain_float32_features(preset, size)) * keep).abs().max().item()
    record_property("max_abs_error", error)
    assert error <= FEATURE_TOLERANCE[precision, mode]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset", PRESETS)
def test_padded_keys_get_no_attention(preset, size, precision, mode, record_property):
    """The explicit path's probabilities are exactly 0 at padded keys, and the fused path gives the
    real tokens of a padded row what it gives them without padding."""
    model = _model(preset, size, precision, mode)
    tokens = _tokens()
    with torch.no_grad(), _context(precision, mode):
        padded = model(tokens, features_only=True)[0]
        alone = [model(tokens[row:row + 1, :length], features_only=True)[0][0]
                 for row, length in ((1, 1), (2, 5))]
        _, extra = model(tokens, features_only=True, need_attn=True)
    for probs in extra["attn"]:
        assert torch.isfinite(probs).all()
        assert torch.all(probs[1, :, :, 1:] == 0) and torch.all(probs[2, :, :, 5:] == 0)
    error = max((padded[1, :1] - alone[0]).abs().max().item(),
                (padded[2, :5] - alone[1]).abs().max().item())
    record_property("max_abs_error", error)
    assert error <= FEATURE_TOLERANCE[precision, mode]


@functools.lru_cache(maxsize=None)
def _float32_gradients(preset, size):
    model = copy.deepcopy(_float32_model(preset, size)).train()
    return _gradients(model, contextlib.nullcontext(), need_attn=True)


def _gradients(model, context, need_attn=False):
    tokens = _tokens()
    generator = torch.Generator().manual_seed(1)
    weights = (torch.randn(*tokens.shape, model.args.encoder_embed_dim, generator=generator).cuda()
               * _keep(tokens))
    model.zero_grad()
    torch.manual_seed(0)  # the forwards compared sample alike where an encoding samples positions in training
    with context:
        features = model(tokens, features_only=True, need_attn=need_attn)[0]
    (features.float() * weights).sum().backward()
    return {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("preset", PRESETS)
def test_gradients_are_finite_and_close_to_float32(preset, size, precision, mode, record_property):
    """Training mode without dropout (deterministic): every parameter's gradient through the fused
    kernels (the T5 bias's through SDPA's attention-mask gradient) against the float32 plain path."""
    model = _model(preset, size, precision, mode, train=True)
    grads = _gradients(model, _context(precision, mode))
    reference = _float32_gradients(preset, size)
    assert set(grads) == set(reference)
    # A gradient that vanishes in float32 is judged against a thousandth of the largest one: FIRE's
    # output bias shifts every logit of a row alike, which the softmax ignores (its exact gradient is 0).
    floor = 1e-3 * max(gradient.norm().item() for gradient in reference.values())
    worst, worst_name = 0.0, None
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), name
        error = (grad - reference[name]).norm().item() / max(reference[name].norm().item(), floor)
        if error > worst:
            worst, worst_name = error, name
    record_property("max_relative_gradient_error", worst)
    record_property("worst_parameter", worst_name)
    assert worst <= GRADIENT_TOLERANCE[precision, mode], worst_name


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("preset", PRESETS)
def test_training_with_attention_dropout_is_finite(preset, precision, mode):
    """Attention dropout 0.1 (the presets' default) through the fused kernels' dropout."""
    torch.manual_seed(0)
    model = build_model(f"{preset}_tiny", make_dictionary(), max_positions=max(LENGTHS),
                        attention_dropout=0.1, dropout=0.1).cuda().train()
    if mode == "model":
        model = model.to(DTYPES[precision])
    grads = _gradients(model, _context(precision, mode))
    assert all(torch.isfinite(grad).all() for grad in grads.values())


def _large_position_parameters(model, peak=2e4):
    """The T5 bias scaled to peak at ``peak``, the untied projections so that the untied term (with
    its [CLS] reset) does too, Shaw vectors x300: summed, up to 4e4, within fp16's range (65504).
    (The CPU test's x300 of every position parameter makes the untied logits ~1e10, beyond fp16.)"""
    encoder = model.encoder.sentence_encoder
    positional = encoder.positional_term
    with torch.no_grad():
        if encoder.config.uses("shaw"):
            for parameter in positional.shaw.parameters():
                parameter.mul_(300.0)
        if encoder.config.uses("t5"):
            table = positional.relative_bias.relative_attention_bias.weight
            table.mul_(peak / table.abs().max().item())
        if encoder.config.uses("untied"):
            untied = positional.content_free(512).with_parts(without=(OffsetRows,)).dense().abs().max().item()
            for projection in (positional.untied_position.q_proj, positional.untied_position.k_proj):
                projection.weight.mul_((peak / untied) ** 0.5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("preset", LARGE_TERM_PRESETS)
def test_large_position_logits_at_512_tokens_neither_overflow_nor_reach_padded_keys(
        preset, precision, mode, record_property):
    """Content-free logits up to ~4e4 at T = 512 (see _large_position_parameters): the summed bias
    stays finite in fp16, and so do outputs and gradients; padded keys still get no attention."""
    torch.manual_seed(0)
    model = build_model(f"{preset}_tiny", make_dictionary(), max_positions=512).cuda()
    _large_position_parameters(model)
    if mode == "model":
        model = model.to(DTYPES[precision])
    tokens = _tokens([512, 1, 300])
    encoder = model.encoder.sentence_encoder
    with _context(precision, mode):
        term = encoder.positional_term.content_free(512).folded()
        dense = term.dense()
        if dense is not None:
            record_property("max_abs_content_free_logit", dense.abs().max().item())
            mask = term.attention_mask(encoder.padding_mask(tokens), dense.dtype)
            assert torch.isfinite(mask).all()
        features = model(tokens, features_only=True)[0]
        with torch.no_grad():
            logits = model(tokens)[0]
            _, extra = model(tokens, features_only=True, need_attn=True)
    features.float().sum().backward()
    assert torch.isfinite(features).all() and torch.isfinite(logits).all()
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            assert torch.isfinite(parameter.grad).all(), name
    for probs in extra["attn"]:
        assert torch.isfinite(probs).all()
        assert torch.all(probs[1, :, :, 1:] == 0) and torch.all(probs[2, :, :, 300:] == 0)


@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("preset", ["bert_a", "bert_r", "tupe_r", "bert_rpe"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_query_whose_keys_are_all_padding_stays_finite(preset, need_weights, precision):
    """The model refuses rows that start with padding; a layer fed one directly must not produce NaN
    (under autocast the float32 mask's padding value becomes -inf in fp16 inside SDPA)."""
    torch.manual_seed(0)
    encoder = build_model(f"{preset}_tiny", make_dictionary()).cuda().eval().encoder.sentence_encoder
    attention = encoder.layers[0].self_attn
    x = torch.randn(2, 6, attention.head_dim * attention.num_heads, device="cuda")
    padding = torch.tensor([[False] * 3 + [True] * 3, [True] * 6], device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=DTYPES[precision]):
        plan = plan_attention(x.device, 0.0, need_weights, encoder.config, x.size(1))
        term = encoder.positional_term.build(6, plan.fold_untied, padding, x.dtype)
        out, _ = encoder.layers[0](x, term, plan, need_weights)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("seq_len", [64, 192])  # T % 128 == 64: where cuDNN's backward returned NaN
@pytest.mark.parametrize("precision", sorted(DTYPES))
@pytest.mark.parametrize("preset", ["bert_r", "tupe_r", "bert_rpe"])
def test_a_learned_bias_backward_is_finite_with_padded_rows_at_lengths_64_and_192(preset, precision, seq_len):
    model = build_model(f"{preset}_tiny", make_dictionary(), max_positions=seq_len).cuda().train()
    tokens = _tokens([seq_len, seq_len // 2, 1])
    with _context(precision, "autocast"):
        features = model(tokens, features_only=True)[0]
    (features.float() * _keep(tokens)).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
