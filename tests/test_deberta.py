"""DeBERTa's disentangled attention (He et al. 2021, arXiv 2006.03654): the flag combinations it refuses, the
relative index and log buckets against the paper twin, and the translation invariance of its position terms.
The whole model against the paper's Eq. 4 is in test_attention_matches_paper_equations.py."""

import pytest
import torch
from conftest import assert_equals_the_twin, build_model, random_tokens
from paper_equations import deberta_delta
from tupe_plugin.attention import toeplitz_scores
from tupe_plugin.encodings.deberta_position import log_bucket
from tupe_plugin.encodings.position_config import PositionConfig, PositionFlagError
from tupe_plugin.terms.parts import ProjectedTable


@pytest.mark.parametrize("preset, flags, message", [
    ("deberta", dict(untied_pos="tupe"), "--rel-pos deberta with --untied-pos tupe"),
    ("deberta", dict(untied_pos="four-term"), "--rel-pos deberta with --untied-pos four-term"),
    ("deberta", dict(rotary="fixed"), "--rotary fixed with --rel-pos deberta: two relative encodings"),
    ("deberta", dict(cls_reset="paper"), "--cls-reset paper resets a content-free term .* there is none"),
    ("deberta", dict(cls_reset="release"), "--cls-reset release needs --untied-pos tupe"),
    ("deberta", dict(deberta_buckets=3), "--deberta-buckets must be 0 \\(none\\) or even"),
    ("deberta", dict(deberta_buckets=8, deberta_max_distance=5), "--deberta-max-distance \\(5\\) must be > "),
    ("deberta", dict(deberta_max_distance=0), "--deberta-max-distance must be >= 1"),
    ("bert_rpe", dict(deberta_share_att_key=True),
     "--deberta-share-att-key is an option of DeBERTa; add --rel-pos deberta \\(got --rel-pos shaw-learned"),
    ("bert_r", dict(deberta_buckets=256), "--deberta-buckets is an option of DeBERTa; .*--rel-pos t5"),
    ("bert_r", dict(deberta_emd=True),
     "--deberta-emd is an option of DeBERTa; add --rel-pos deberta \\(got --rel-pos t5"),
    ("deberta", dict(abs_pos="learned", deberta_emd=True),
     "--deberta-emd with --abs-pos learned: .*--abs-pos none"),
    ("deberta", dict(deberta_emd_layers=3),
     "--deberta-emd-layers is an option of the Enhanced Mask Decoder; add --deberta-emd"),
    ("deberta_emd", dict(deberta_emd_layers=0), "--deberta-emd-layers must be >= 1, got 0"),
])
def test_deberta_refuses_combinations_it_does_not_define(preset, flags, message, dictionary):
    with pytest.raises(PositionFlagError, match=message):
        build_model(f"{preset}_tiny", dictionary, **flags)


def test_deberta_scales_its_three_terms_by_one_over_sqrt_3_dh_and_adds_no_content_free_term():
    config = PositionConfig(embed_dim=64, num_heads=4, max_positions=8, rel_pos="deberta")
    assert config.scale == pytest.approx((3 * 16) ** -0.5)
    assert (config.offset_bias, config.learned_dense_bias, config.learned_tables) == (False, True, False)


@pytest.mark.parametrize("buckets, max_distance", [(0, 512), (0, 3), (256, 512), (8, 20)])
def test_relative_index_is_the_paper_twins_delta(buckets, max_distance, dictionary):
    config = PositionConfig(embed_dim=8, num_heads=2, max_positions=8, rel_pos="deberta",
                            deberta_buckets=buckets, deberta_max_distance=max_distance)
    model = build_model("deberta_tiny", dictionary, deberta_buckets=buckets,
                        deberta_max_distance=max_distance)
    seq_len = 600
    index = model.encoder.sentence_encoder.positional_term.disentangled.index(seq_len)
    expected = torch.tensor([[deberta_delta(i, j, config) for j in range(seq_len)]
                             for i in range(0, seq_len, 7)])
    assert torch.equal(index[::7], expected)


def test_log_buckets_are_odd_monotone_exact_up_to_half_and_end_at_the_last_bucket():
    relative = torch.arange(-700, 701)
    buckets = log_bucket(relative, 256, 512)
    assert torch.equal(buckets, -log_bucket(-relative, 256, 512))
    assert (buckets.diff() >= 0).all()
    exact = relative.abs() <= 128
    assert torch.equal(buckets[exact], relative[exact])
    assert buckets.max() == 255 and (buckets[relative >= 511] == 255).all() and buckets[relative == 400] < 255


def test_a_length_projects_only_the_table_rows_it_reaches(dictionary):
    encoder = build_model("deberta_tiny", dictionary).encoder.sentence_encoder
    term = encoder.positional_term.content_free(10)
    index = encoder.positional_term.disentangled.rows_and_index(10)[2]
    assert term.get(ProjectedTable).table.shape[0] == 2 * 10 - 1
    torch.testing.assert_close(term.get(ProjectedTable).table[index[4, 4]],
                               encoder.positional_term.disentangled.weight[512])


@pytest.mark.parametrize("flags", [{}, {"deberta_share_att_key": True}, {"deberta_max_distance": 3},
                                   {"deberta_buckets": 4, "deberta_max_distance": 6}])
def test_position_terms_are_translation_invariant(flags, dictionary):
    """Content shifted one position later shifts both position terms with it: they depend on i - j alone."""
    encoder = build_model("deberta_tiny", dictionary, **flags).encoder.sentence_encoder
    with torch.no_grad():
        for parameter in encoder.positional_term.parameters():
            parameter.normal_()
        attention = encoder.layers[0].self_attn
        x = torch.randn(2, 12, 128)
        shifted = torch.cat([torch.randn(2, 1, 128), x[:, :-1]], 1)
        term = encoder.positional_term.content_free(12)
        terms = [attention.disentangled_terms(*attention.project(h)[:2], term) for h in (x, shifted)]
    for original, moved in zip(*terms):
        torch.testing.assert_close(moved[:, :, 1:, 1:], original[:, :, :-1, :-1])


def test_identical_content_gives_position_terms_constant_along_each_offset(dictionary):
    encoder = build_model("deberta_tiny", dictionary).encoder.sentence_encoder
    with torch.no_grad():
        encoder.positional_term.disentangled.weight.normal_()
        attention = encoder.layers[0].self_attn
        x = torch.randn(1, 1, 128).expand(1, 9, 128)
        content_to_position, position_to_content = attention.disentangled_terms(
            *attention.project(x)[:2], encoder.positional_term.content_free(9))
    for term in (content_to_position, position_to_content):
        torch.testing.assert_close(term[..., 1:, 1:], term[..., :-1, :-1])
        assert not torch.allclose(term[..., 0, 1], term[..., 0, 2])



@pytest.mark.parametrize("flags", [{}, {"deberta_share_att_key": True}, {"deberta_max_distance": 6},
                                   {"deberta_buckets": 8, "deberta_max_distance": 12}])
def test_position_terms_by_bands_equal_the_paper_equations(flags, dictionary, monkeypatch):
    """With bands of two query rows every table here is longer than the bands reach: the banded products
    give the paper's Eq. 4, forward and every gradient."""
    monkeypatch.setattr(toeplitz_scores, "BAND_ROWS", 2)
    calls = []
    original = toeplitz_scores.ToeplitzScores.apply
    monkeypatch.setattr(toeplitz_scores.ToeplitzScores, "apply", lambda *a: calls.append(1) or original(*a))
    model = build_model("deberta_tiny", dictionary, **flags)
    assert_equals_the_twin(model, dictionary)
    assert len(calls) == model.args.encoder_layers  # c2p and p2c of each layer, by bands, in one tensor


def test_offsets_lay_out_the_relative_index_by_offset(dictionary):
    positional = build_model("deberta_tiny", dictionary, deberta_max_distance=3).encoder.sentence_encoder \
        .positional_term
    term = positional.content_free(7)
    positions = torch.arange(7)
    by_offset = term.get(ProjectedTable).offsets[positions[None, :] - positions[:, None] + 6]
    assert torch.equal(by_offset, positional.disentangled.rows_and_index(7)[2])


def drawn_deberta(dictionary, **flags):
    """A tiny DeBERTa whose every parameter (projection biases and LayerNorms included) is drawn away from
    its start, so that a bias or a row read wrongly shows."""
    model = build_model("deberta_tiny", dictionary, deberta_max_distance=4, **flags)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


@pytest.mark.parametrize("flags", [{}, {"deberta_rel_proj_bias": "both"}, {"deberta_p2c": "paper"},
                                   {"deberta_rel_proj_bias": "none"},
                                   {"deberta_share_att_key": True, "deberta_table_norm": True}])
def test_every_form_equals_its_twin_with_every_parameter_drawn(flags, dictionary):
    assert_equals_the_twin(drawn_deberta(dictionary, **flags), dictionary)


def test_released_position_to_content_reads_the_content_to_position_row(dictionary):
    """Released: k_j . Q^r_delta(i,j); printed Eq. 4: k_j . Q^r_delta(j,i). The two differ on the same
    weights; the released p2c term of the pair (key j, query i) reads the c2p index of (i, j)."""
    released = drawn_deberta(dictionary)
    printed = build_model("deberta_tiny", dictionary, deberta_max_distance=4, deberta_p2c="paper")
    printed.load_state_dict(released.state_dict())
    tokens = random_tokens(dictionary, [9])
    with torch.no_grad():
        assert not torch.allclose(released(tokens, features_only=True)[0],
                                  printed(tokens, features_only=True)[0])
    term = released.encoder.sentence_encoder.positional_term.content_free(9)
    # the offset j - i of the pair (key j, query i) reads the row of offset i - j of the c2p term
    assert torch.equal(term.get(ProjectedTable).p2c_offsets, term.get(ProjectedTable).offsets.flip(0))


@pytest.mark.parametrize("flags, biases", [({}, (True, False)),
                                           ({"deberta_rel_proj_bias": "both"}, (True, True)),
                                           ({"deberta_rel_proj_bias": "none"}, (False, False))])
def test_relative_projections_carry_the_released_biases(flags, biases, dictionary):
    """v1 releases a bias on the query-side projection W^{q,r} only (pos_q_proj), v2/v3 on both."""
    projections = build_model("deberta_tiny", dictionary, **flags).encoder.sentence_encoder.layers[0] \
        .self_attn.relative_projections
    assert (projections.query.bias is not None, projections.key.bias is not None) == biases


@pytest.mark.parametrize("flags, message", [
    (dict(deberta_share_att_key=True, deberta_rel_proj_bias="both"),
     "--deberta-rel-proj-bias both with --deberta-share-att-key"),
    (dict(rel_pos="t5", deberta_p2c="paper"), "--deberta-p2c is an option of DeBERTa; add --rel-pos deberta"),
    (dict(rel_pos="t5", deberta_table_norm=True), "--deberta-table-norm is an option of DeBERTa"),
])
def test_deberta_options_are_refused_where_they_cannot_apply(flags, message, dictionary):
    with pytest.raises(PositionFlagError, match=message):
        build_model("deberta_tiny", dictionary, **flags)
