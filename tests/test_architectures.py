import pytest
import torch
from conftest import PRESETS, build_model, random_tokens

from tupe_plugin.encodings import registry
from tupe_plugin.models.architectures import ARCHITECTURES, POSITION_PRESETS, SIZES
from tupe_plugin.encodings.position_config import PositionFlagError

# The specification of the papers' rows (README, Architectures): (--abs-pos, --rel-pos, --untied-pos,
# --cls-reset, --rotary) of each. Presets beyond these rows are tested through POSITION_PRESETS.
PAPER_ROWS = {
    "bert_a": ("learned", "none", "none", "none", "none"),
    "bert_r": ("learned", "t5", "none", "none", "none"),
    "tupe_a": ("none", "none", "tupe", "paper", "none"),
    "tupe_r": ("none", "t5", "tupe", "paper", "none"),
    "tupe_a_tie_cls": ("none", "none", "tupe", "none", "none"),
    "bert_a_d": ("none", "none", "four-term", "none", "none"),
    # Wang et al. 2021, Tables 2 and 3
    "bert_nope": ("none", "none", "none", "none", "none"),
    "bert_sin_ape": ("sinusoidal", "none", "none", "none", "none"),
    "bert_lsin_ape": ("learnable-sinusoidal", "none", "none", "none", "none"),
    "bert_rpe": ("none", "shaw-learned", "none", "none", "none"),
    "bert_sin_rpe": ("none", "shaw-sinusoidal", "none", "none", "none"),
    "bert_lsin_rpe": ("none", "shaw-learnable-sinusoidal", "none", "none", "none"),
    "bert_a_rpe": ("learned", "shaw-learned", "none", "none", "none"),
    "bert_a_sin_rpe": ("learned", "shaw-sinusoidal", "none", "none", "none"),
    "bert_a_lsin_rpe": ("learned", "shaw-learnable-sinusoidal", "none", "none", "none"),
    "bert_lsin_ape_rpe": ("learnable-sinusoidal", "shaw-learned", "none", "none", "none"),
    "bert_lsin_ape_sin_rpe": ("learnable-sinusoidal", "shaw-sinusoidal", "none", "none", "none"),
    "bert_lsin_ape_lsin_rpe": ("learnable-sinusoidal", "shaw-learnable-sinusoidal", "none", "none", "none"),
    # RoPE (Su et al. 2021) and ALiBi (Press et al. 2022)
    "bert_rope": ("none", "none", "none", "none", "fixed"),
    "bert_lrope": ("none", "none", "none", "none", "learnable"),
    "bert_alibi": ("none", "alibi", "none", "none", "none"),
    "bert_alibi_asym": ("none", "alibi", "none", "none", "none"),  # slopes per side, learned
    "bert_alibi_cls": ("none", "alibi", "none", "paper", "none"),  # TUPE's [CLS] reset of the ALiBi bias
    # KERPLE (Chi et al. 2022)
    "bert_kerple": ("none", "kerple-log", "none", "none", "none"),
    # Sandwich (Chi et al. 2023)
    "bert_sandwich": ("none", "sandwich", "none", "none", "none"),
    # FIRE (Li et al. 2023), normalised by the sequence length
    "bert_fire": ("none", "fire", "none", "none", "none"),
    "tupe_rope": ("none", "none", "tupe", "paper", "fixed"),
    # DeBERTa (He et al. 2021): disentangled attention, no absolute position at the input
    "deberta": ("none", "deberta", "none", "none", "none"),
    "deberta_emd": ("none", "deberta", "none", "none", "none"),  # and the Enhanced Mask Decoder (§3.2)
    # Transformer-XL (Dai et al. 2019 §3.3), bidirectional as XLNet
    "bert_xl": ("none", "xl", "none", "none", "none"),
}


def test_every_paper_row_is_a_preset():
    assert set(PAPER_ROWS) <= set(PRESETS)


def test_every_preset_is_registered_in_every_size():
    expected = {f"{preset}_{size}" for preset in PRESETS for size in SIZES}
    assert expected <= set(ARCHITECTURES)


@pytest.mark.parametrize("row", sorted(PAPER_ROWS))
def test_paper_rows_set_the_papers_flags(row, dictionary):
    args = build_model(f"{row}_tiny", dictionary).args
    assert (args.abs_pos, args.rel_pos, args.untied_pos, args.cls_reset, args.rotary) == PAPER_ROWS[row]


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_set_their_flags_and_select_registered_encodings(preset, dictionary):
    args = build_model(f"{preset}_tiny", dictionary).args
    assert {flag: getattr(args, flag) for flag in POSITION_PRESETS[preset]} == POSITION_PRESETS[preset]
    for family in registry.FAMILIES:
        assert getattr(args, family) in registry.family_choices(family)


def test_command_line_flags_override_a_preset(dictionary):
    model = build_model("tupe_r_tiny", dictionary, encoder_layers=3, rel_pos="none")
    assert len(model.encoder.sentence_encoder.layers) == 3
    assert model.encoder.sentence_encoder.positional_term.relative_bias is None


def test_sizes_match_the_design_table(dictionary):
    model = build_model("bert_a_medium", dictionary)
    encoder = model.encoder.sentence_encoder
    attn = encoder.layers[0].self_attn
    assert (len(encoder.layers), attn.num_heads * attn.head_dim, attn.num_heads,
            encoder.layers[0].fc1.out_features) == SIZES["medium"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (dict(abs_pos="learned"), "--abs-pos learned .* --untied-pos tupe"),
        (dict(untied_pos="none", rel_pos="none"), "--cls-reset paper resets a content-free term .* none"),
        (dict(untied_pos="none", rel_pos="shaw-learned"), "--cls-reset paper resets a content-free term"),
        (dict(untied_pos="four-term"), "--cls-reset paper with --untied-pos four-term"),
        (dict(rel_pos_buckets=7), "--rel-pos-buckets must be even"),
        (dict(rel_pos_max_distance=4), "--rel-pos-max-distance"),
        (dict(encoder_attention_heads=3), "multiple of --encoder-attention-heads"),
        (dict(encoder_attention_heads=0), "multiple of --encoder-attention-heads"),
        (dict(rel_pos="shaw-learned", shaw_max_distance=-1), "--shaw-max-distance must be >= 1"),
        (dict(rel_pos="shaw-sinusoidal", encoder_attention_heads=128, untied_pos="none",
              cls_reset="none"), "needs an even head dimension"),
    ],
)
def test_flag_combinations_that_make_no_sense_raise_a_clear_error(flags, message, dictionary):
    with pytest.raises(PositionFlagError, match=message):
        build_model("tupe_r_tiny", dictionary, **flags)


@pytest.mark.parametrize("size", ["medium", pytest.param("base", marks=pytest.mark.slow),
                                  pytest.param("large", marks=pytest.mark.slow)])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_size_builds_and_runs_one_forward(preset, size, dictionary):
    model = build_model(f"{preset}_{size}", dictionary).eval()
    with torch.no_grad():
        logits, _ = model(random_tokens(dictionary, [12, 7]))
    assert logits.shape == (2, 12, len(dictionary))
    assert torch.isfinite(logits).all()
