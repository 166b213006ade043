import pytest
import torch
from conftest import PRESETS, build_model, choices_of_kind, random_tokens
from tupe_plugin.encodings.positional_term import SharedPositionalTerm


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("layers", [2, 5])
def test_positional_term_is_built_once_per_forward_whatever_the_depth(preset, layers, dictionary,
                                                                     monkeypatch):
    model = build_model(f"{preset}_tiny", dictionary, encoder_layers=layers)
    calls = []
    original = SharedPositionalTerm.content_free
    monkeypatch.setattr(SharedPositionalTerm, "content_free",
                        lambda self, seq_len: calls.append(1) or original(self, seq_len))
    model(random_tokens(dictionary, [8, 5]))
    assert len(calls) == 1


@pytest.mark.parametrize("preset", ["tupe_a", "tupe_r"])
def test_cls_reset_sets_exactly_row_0_and_column_0(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary)
    positional = model.encoder.sentence_encoder.positional_term
    seq_len = 10
    reset = positional.content_free(seq_len).dense()
    thetas = positional.untied_position.cls_thetas() * positional.config.scale
    # the same tables without the reset: no theta vectors, the relative bias not zeroed
    positional.untied_position.cls_vectors = None
    if positional.relative_bias is not None:
        positional.relative_bias.zero_cls = False
    untouched = positional.content_free(seq_len).dense()

    changed = (reset - untouched).abs() > 0
    expected = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    expected[0, :] = True
    expected[:, 0] = True
    assert torch.equal(changed.any(0), expected)
    torch.testing.assert_close(reset[:, 0, :], thetas[:, :1].expand(-1, seq_len))
    torch.testing.assert_close(reset[:, 1:, 0], thetas[:, 1:].expand(-1, seq_len - 1))


@pytest.mark.parametrize("family, choice", choices_of_kind("bias", "distance_bias"))
def test_cls_reset_without_untied_term_sets_row_0_and_column_0_to_its_thetas(family, choice, dictionary):
    model = build_model("bert_nope_tiny", dictionary, cls_reset="paper", **{family: choice})
    positional = model.encoder.sentence_encoder.positional_term
    thetas = positional.cls_reset.thetas.detach().normal_()
    seq_len = 10
    reset = positional.content_free(seq_len).dense().detach()
    positional.cls_reset, positional.relative_bias.zero_cls = None, False
    untouched = positional.content_free(seq_len).dense().detach()

    torch.testing.assert_close(reset[:, 0, :], thetas[:, :1].expand(-1, seq_len))
    torch.testing.assert_close(reset[:, 1:, 0], thetas[:, 1:].expand(-1, seq_len - 1))
    torch.testing.assert_close(reset[:, 1:, 1:], untouched[:, 1:, 1:])


@pytest.mark.parametrize("preset", PRESETS)
def test_position_tables_are_shared_by_all_layers(preset, dictionary):
    """A layer holds no table of positions; DeBERTa's layers hold only their projections of the shared
    table (He et al. 2021 Eq. 4: W^{q,r}, W^{k,r} per layer)."""
    model = build_model(f"{preset}_tiny", dictionary, encoder_layers=3)
    layer_names = [n for n, _ in model.named_parameters()
                   if ".layers." in n and ".relative_projections." not in n]
    assert not [n for n in layer_names if "pos" in n or "relative" in n]


def test_deberta_layers_project_the_one_shared_table_with_their_own_weights(dictionary):
    model = build_model("deberta_tiny", dictionary, encoder_layers=3)
    names = [n for n, _ in model.named_parameters()]
    assert [n for n in names if "disentangled" in n] == [
        "encoder.sentence_encoder.positional_term.disentangled.weight"]
    # W^{q,r} with its bias, W^{k,r} without (released v1)
    assert len([n for n in names if ".relative_projections." in n]) == 3 * 3
    shared = build_model("deberta_tiny", dictionary, encoder_layers=3, deberta_share_att_key=True)
    assert not [n for n, _ in shared.named_parameters() if ".relative_projections." in n]


def test_tupe_scales_word_and_position_terms_by_one_over_sqrt_2_dh(dictionary):
    model = build_model("tupe_a_tiny", dictionary)
    head_dim = 128 // 4
    assert model.encoder.sentence_encoder.positional_term.content_free(4).scale == pytest.approx(
        (2 * head_dim) ** -0.5
    )
    bert = build_model("bert_a_tiny", dictionary)
    assert bert.encoder.sentence_encoder.positional_term.content_free(4).scale == pytest.approx(
        head_dim ** -0.5
    )


def test_learned_table_longer_input_names_max_positions(dictionary):
    for arch in ("bert_a_tiny", "tupe_a_tiny"):
        model = build_model(arch, dictionary, max_positions=8)
        with pytest.raises(ValueError, match="--max-positions"):
            model(random_tokens(dictionary, [9]))
