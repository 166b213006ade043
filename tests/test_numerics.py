"""bf16 on CPU: finite outputs for short, padded and long inputs, padded keys masked, close to fp32.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` the projections and the fused attention run in
bf16 while embeddings, LayerNorm and the built mask stay float32; fairseq's ``--bf16`` instead casts
the whole model. bf16 keeps 8 significant bits (relative rounding 2^-9), so the LayerNorm-ed features
(of order 1) are compared to float32 within 0.02 absolute; measured at most 0.004 over every tiny
architecture at 512 tokens.
"""


import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer
from tupe_plugin.attention.paths import plan_attention
from tupe_plugin.terms.parts import DenseBias, Shift
from conftest import PRESETS, build_model, random_tokens

BF16_TOLERANCE = 0.02
LENGTHS = [512, 1, 5]  # a long row, a row that is only <s>, a short one


@pytest.mark.parametrize("preset", PRESETS)
def test_bf16_autocast_is_finite_and_close_to_fp32(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary, max_positions=max(LENGTHS)).eval()
    tokens = random_tokens(dictionary, LENGTHS)
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    with torch.no_grad():
        reference = model(tokens, features_only=True)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            features = model(tokens, features_only=True)[0]
            logits = model(tokens)[0]
    assert torch.isfinite(features).all() and torch.isfinite(logits).all()
    torch.testing.assert_close(features.float() * keep, reference * keep, atol=BF16_TOLERANCE, rtol=0)


@pytest.mark.parametrize("preset", PRESETS)
def test_bf16_model_is_finite(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary, max_positions=64).eval().to(torch.bfloat16)
    with torch.no_grad():
        logits = model(random_tokens(dictionary, [64, 1, 5]))[0]
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def _scale_position_parameters(model, factor):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "positional_term" in name:
                parameter.mul_(factor)


@pytest.mark.parametrize("preset", ["bert_r", "tupe_r", "bert_rpe", "bert_a_d"])
@pytest.mark.parametrize("precision", ["autocast", "bf16 model"])
def test_large_position_logits_neither_overflow_nor_reach_padded_keys(preset, precision, dictionary):
    """Position parameters x300 give content-free logits in the hundreds to thousands."""
    model = build_model(f"{preset}_tiny", dictionary).eval()
    _scale_position_parameters(model, 300.0)
    if precision == "bf16 model":
        model = model.to(torch.bfloat16)
    tokens = random_tokens(dictionary, [12, 1, 4])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "autocast"):
        logits = model(tokens)[0]
        _, extra = model(tokens, features_only=True, need_attn=True)
    assert torch.isfinite(logits).all()
    for probs in extra["attn"]:
        assert torch.isfinite(probs).all()
        assert torch.all(probs[1, :, :, 1:] == 0) and torch.all(probs[2, :, :, 4:] == 0)


@pytest.mark.parametrize("preset", ["bert_a", "bert_r", "tupe_r", "bert_rpe"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_query_whose_keys_are_all_padding_stays_finite(preset, need_weights, dictionary):
    """The model refuses rows that start with padding; a layer fed one directly must not produce NaN."""
    encoder = build_model(f"{preset}_tiny", dictionary).eval().encoder.sentence_encoder
    x = torch.randn(2, 6, encoder.layers[0].self_attn.head_dim * encoder.layers[0].self_attn.num_heads)
    padding = torch.tensor([[False] * 3 + [True] * 3, [True] * 6])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plan = plan_attention(x.device, 0.0, need_weights, encoder.config, x.size(1))
        term = encoder.positional_term.build(6, plan.fold_untied, padding, x.dtype)
        out, _ = encoder.layers[0](x, term, plan, need_weights)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("preset", ["bert_r", "tupe_r"])
def test_summed_bias_is_built_in_float32_under_autocast(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary).eval()
    encoder = model.encoder.sentence_encoder
    tokens = random_tokens(dictionary, [6, 3])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        x = encoder.embed(tokens)
        term = encoder.positional_term.content_free(6).expanded()
        folded = term.folded()
        masks = [t.attention_mask(encoder.padding_mask(tokens), x.dtype) for t in (term, folded)]
    assert folded.get(DenseBias).bias.dtype == torch.float32
    for mask in masks:
        assert mask.dtype == torch.float32
        assert torch.isfinite(mask).all() and torch.all(mask[1, :, :, 3:] == torch.finfo(torch.float32).min)


def test_dense_term_does_not_overflow_fp16_where_the_scaled_logits_fit(dictionary):
    """dense() (analysis, the benchmark's plain reference) scales before the product, as the kernels
    do: factors whose scaled product peaks at 2e4 have an unscaled product over fp16's 65504."""
    positional = build_model("bert_a_d_tiny", dictionary).encoder.sentence_encoder.positional_term
    with torch.no_grad():
        term = positional.content_free(16)
        factor = (2e4 / term.dense().abs().max().item()) ** 0.5
        for projection in (positional.untied_position.q_proj, positional.untied_position.k_proj):
            projection.weight.mul_(factor)
        positional.half()
        term = positional.content_free(16)
        dense = term.dense()
        reference = term.with_parts(Shift(term.get(Shift).q.float(), term.get(Shift).k.float())).dense()
    assert (term.get(Shift).q.float() @ term.get(Shift).k.float().transpose(1, 2)).abs().max() > 65504
    assert dense.dtype == torch.float16 and torch.isfinite(dense).all()
    torch.testing.assert_close(dense.float(), reference, rtol=0, atol=1e-3 * 2e4)  # fp16 rounding


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("preset", ["bert_sin_ape", "bert_lsin_ape", "bert_sin_rpe", "bert_lsin_rpe",
                                    "bert_rope", "bert_lrope"])
def test_sinusoids_of_a_cast_model_are_the_float32_ones_rounded(preset, dtype, dictionary):
    """fairseq's --bf16 / --fp16 cast the model: positions up to 511 and their angles (hundreds of
    radians) must not be rounded to that dtype before the sine (the cosine and sine of RoPE's
    rotation), only the result. The frequencies, learnable ones too, stay float32: a learned
    frequency rounded to bf16 puts position 511 up to a radian off the float32 model's."""
    model = build_model(f"{preset}_tiny", dictionary, max_positions=512)
    encoder = model.encoder.sentence_encoder
    rotary = encoder.positional_term.rotary
    if rotary is not None:
        sinusoid, positions = rotary.sinusoid, torch.arange(512)
        compute = lambda: torch.stack(rotary(512)[::-1], -1).flatten(-2)  # noqa: E731  (sin, cos) pairs
    elif encoder.embed_positions is not None:
        sinusoid, positions = encoder.embed_positions.sinusoid, torch.arange(512)
        compute = lambda: encoder.embed_positions(512)  # noqa: E731
    else:
        shaw = encoder.positional_term.shaw
        sinusoid, positions = shaw.sinusoid, torch.arange(-shaw.max_distance, shaw.max_distance + 1)
        compute = shaw.table
    float32_frequencies = sinusoid.frequencies.detach().clone()
    model.to(dtype)
    with torch.no_grad():
        angles = positions.double()[:, None] * float32_frequencies.double()
        reference = torch.stack([angles.sin(), angles.cos()], -1).flatten(-2)
        waves = compute()
    assert sinusoid.frequencies.dtype == torch.float32
    torch.testing.assert_close(sinusoid.frequencies, float32_frequencies, atol=0, rtol=0)
    assert waves.dtype == dtype
    # float32 angles and sines against float64, both rounded to dtype: at most one rounding step
    # apart (with positions rounded: 1.6 in bf16, 0.12 in fp16 for the absolute sinusoids at T = 512;
    # for RoPE, 1.68 in bf16, where positions 256 and 257 shared one rotation; with learned
    # frequencies rounded, up to 0.9 in bf16)
    torch.testing.assert_close(waves.double(), reference.to(dtype).double(),
                               atol=torch.finfo(dtype).eps, rtol=0)


@pytest.mark.parametrize("optimizer", [FP16Optimizer, MemoryEfficientFP16Optimizer])
def test_float32_frequencies_of_a_cast_model_train_through_fairseqs_fp16_optimizers(optimizer, dictionary):
    """fairseq's --bf16 builds FP16Optimizer (or, with --memory-efficient-bf16, its memory-efficient
    twin) over a model cast to bf16: the frequencies the cast left float32 take their update and
    stay float32."""
    argv = ["DATA", "--task", "masked_lm", "--arch", "bert_lsin_ape_tiny", "--bf16",
            "--optimizer", "adam", "--lr", "0.1"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(),
                                                                     input_args=argv))
    model = build_model("bert_lsin_ape_tiny", dictionary, max_positions=512).to(torch.bfloat16)
    frequencies = model.encoder.sentence_encoder.embed_positions.sinusoid.frequencies
    before = frequencies.detach().clone()
    trainer_optimizer = optimizer.build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    trainer_optimizer.backward(model(random_tokens(dictionary, [300, 20]))[0].float().sum())
    trainer_optimizer.step()
    assert frequencies.dtype == torch.float32
    assert (frequencies - before).abs().max() > 0.05  # Adam's first step moves each by ~lr
