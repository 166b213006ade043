"""The fused path against the step-by-step paper equations (tests/paper_equations.py)."""

import pytest
import torch
from conftest import (PRESETS, assert_gradients_close, build_model, features_and_grads, preset_encodings,
                      random_tokens)
from paper_equations import encoder_features
from tupe_plugin.attention import cpu_kernels, paths

pytestmark = pytest.mark.smoke

LENGTHS = [7, 5, 3]

# Every preset as it is, then the options no preset sets.
VARIANTS = [(preset, {}) for preset in PRESETS] + [
    ("bert_kerple", {"rel_pos": "kerple-power"}),
    ("bert_sandwich", {"sandwich_dim": 16, "sandwich_scale": 0.5}),
    ("bert_alibi", {"alibi_asymmetric": True}),
    ("bert_alibi", {"alibi_learned_slopes": True}),
    ("bert_fire", {"fire_signed": True, "fire_threshold": 4.0}),
    # TUPE's [CLS] reset of every content-free bias, alone and beside the untied term
    ("bert_r", {"cls_reset": "paper"}),
    ("bert_kerple", {"cls_reset": "paper", "rel_pos": "kerple-power"}),
    ("bert_sandwich", {"cls_reset": "paper"}),
    ("bert_fire", {"cls_reset": "paper"}),
    ("tupe_r", {"rel_pos": "kerple-log"}),
    ("tupe_a", {"rel_pos": "fire"}),
    # RoPE's angles scaled for longer inputs (--rotary-scaling)
    ("bert_rope", {"rotary_scaling": "linear", "rotary_scaling_factor": 4.0}),
    ("bert_lrope", {"rotary_scaling": "linear", "rotary_scaling_factor": 2.5}),
    ("tupe_rope", {"rotary_scaling": "ntk", "rotary_scaling_factor": 4.0}),
    # DeBERTa: distances clipped within the batch's length, v2/v3's shared projections and log buckets
    ("deberta", {"deberta_max_distance": 3}),
    ("deberta", {"deberta_share_att_key": True, "deberta_max_distance": 2}),
    ("deberta", {"deberta_buckets": 4, "deberta_max_distance": 5}),
    ("deberta", {"deberta_rel_proj_bias": "both"}),
    ("deberta", {"deberta_share_att_key": True, "deberta_table_norm": True, "deberta_buckets": 4,
                 "deberta_max_distance": 5}),
    # the forms of the checkpoints saved before the released ones became the defaults
    ("deberta", {"deberta_p2c": "paper", "deberta_rel_proj_bias": "none"}),
    ("bert_kerple", {"kerple_param": "softplus"}),
    ("bert_sandwich", {"sandwich_frequencies": "zero-based"}),
    ("bert_fire", {"fire_normaliser": "length", "fire_threshold": 4.0}),
    # Transformer-XL's distances clamped (XLNet's clamp_len)
    ("bert_xl", {"xl_max_distance": 2}),
    # DAPE on the other biases it may sit on, on none, with the [CLS] reset in its bias, of another width
    ("bert_dape_alibi", {"rel_pos": "t5"}),
    ("bert_dape_alibi", {"rel_pos": "fire"}),
    ("bert_dape_alibi", {"rel_pos": "none"}),
    ("bert_dape_kerple", {"cls_reset": "paper", "dape_width": 8}),
    # randomized positions (Ruoss et al. 2023) read by a learned table and by learnable sinusoids
    ("bert_a", {"randomized_positions": 32}),
    ("bert_lsin_ape", {"randomized_positions": 100}),
]


@pytest.mark.parametrize("preset, overrides", VARIANTS)
@pytest.mark.parametrize("normalize_before", [False, True])
def test_forward_and_gradients_equal_the_paper_equations(preset, overrides, normalize_before, dictionary):
    model = build_model(f"{preset}_tiny", dictionary, encoder_normalize_before=normalize_before,
                        shaw_max_distance=3, **overrides)
    tokens = random_tokens(dictionary, LENGTHS)
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim) * keep
    encoder = model.encoder.sentence_encoder

    # one seed before each forward: an encoding that samples its positions in training samples them alike
    fused, fused_grads = features_and_grads(model, tokens, weights, seed=0)
    plain, plain_grads = features_and_grads(model, tokens, weights,
                                            lambda t: encoder_features(encoder, t), seed=0)

    torch.testing.assert_close(fused * keep, plain * keep, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, plain_grads)


@pytest.mark.parametrize("preset, overrides", [("bert_r", {}), ("tupe_r", {}),
                                               ("bert_rpe", {"shaw_keys_only": True}),
                                               ("bert_kerple", {}),
                                               ("bert_kerple", {"rel_pos": "kerple-power"}),
                                               ("bert_alibi_asym", {}), ("bert_fire", {}),
                                               ("bert_alibi_cls", {}),
                                               ("deberta", {"deberta_buckets": 4,
                                                            "deberta_max_distance": 5})])
@pytest.mark.parametrize("normalize_before", [False, True])
def test_biased_flash_path_equals_the_paper_equations(preset, overrides, normalize_before, dictionary,
                                                      monkeypatch):
    """Short sequences take the explicit path; with its length bound at 0 every length takes the
    flash forward and recomputing backward, which must give the same function and gradients."""
    monkeypatch.setattr(paths, "EXPLICIT_MAX_LENGTH_PER_HEAD_DIM", 0)
    calls = []
    original = cpu_kernels.BiasedFlashAttention.apply
    monkeypatch.setattr(cpu_kernels.BiasedFlashAttention, "apply",
                        lambda *args: calls.append(1) or original(*args))
    model = build_model(f"{preset}_tiny", dictionary, encoder_normalize_before=normalize_before,
                        shaw_max_distance=3, **overrides)
    tokens = random_tokens(dictionary, LENGTHS)
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim) * keep
    encoder = model.encoder.sentence_encoder

    fused, fused_grads = features_and_grads(model, tokens, weights, seed=0)
    assert len(calls) == model.args.encoder_layers
    plain, plain_grads = features_and_grads(model, tokens, weights,
                                            lambda t: encoder_features(encoder, t), seed=0)

    torch.testing.assert_close(fused * keep, plain * keep, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, plain_grads)


@pytest.mark.parametrize("preset", PRESETS)
def test_explicit_attention_path_equals_the_fused_path(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary)
    tokens = random_tokens(dictionary, LENGTHS)
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    # one seed before each forward: an encoding that samples its positions in training samples them alike
    torch.manual_seed(0)
    fused = model(tokens, features_only=True)[0]
    torch.manual_seed(0)
    explicit, extra = model(tokens, features_only=True, need_attn=True)
    torch.testing.assert_close(fused * keep, explicit * keep, atol=1e-5, rtol=1e-5)
    assert len(extra["attn"]) == model.args.encoder_layers


# every preset whose only encoding is Shaw's relative vectors (one a --rel-pos shaw-* value)
SHAW_ONLY = [preset for preset in PRESETS
             if [encoding.name for encoding in preset_encodings(preset)] == ["shaw"]]


@pytest.mark.parametrize("preset", SHAW_ONLY)
def test_shaw_keys_only_equals_the_paper_equations(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary, shaw_keys_only=True, shaw_max_distance=2)
    tokens = random_tokens(dictionary, LENGTHS)
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    fused = model(tokens, features_only=True)[0]
    plain = encoder_features(model.encoder.sentence_encoder, tokens)
    torch.testing.assert_close(fused * keep, plain * keep, atol=1e-5, rtol=1e-5)
