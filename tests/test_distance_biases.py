"""The biases of the distance made for length extrapolation (KERPLE, Sandwich, FIRE, ALiBi's options): the
properties their papers state, and the bias of every head against the paper twin
(tests/paper_equations.py) with drawn parameters."""

import pytest
import torch
from conftest import build_model
from paper_equations import alibi_bias, fire_bias, kerple_bias, sandwich_bias
from tupe_plugin.encodings import registry
from tupe_plugin.encodings.alibi_position import alibi_slopes

# (preset, flags, symmetric) of the papers' distance biases and their variants (every registered one: below)
DISTANCE_BIASES = [
    ("bert_kerple", {}, True),
    ("bert_kerple", {"rel_pos": "kerple-power"}, True),
    ("bert_kerple", {"kerple_param": "softplus"}, True),
    ("bert_kerple", {"rel_pos": "kerple-power", "kerple_param": "softplus"}, True),
    ("bert_sandwich", {"sandwich_dim": 32, "sandwich_scale": 0.25}, True),
    ("bert_sandwich", {"sandwich_dim": 32, "sandwich_frequencies": "zero-based"}, True),
    ("bert_alibi", {"alibi_learned_slopes": True}, True),
    ("bert_alibi", {"alibi_asymmetric": True}, False),
    ("bert_alibi_asym", {}, False),
    ("bert_fire", {}, True),
    ("bert_fire", {"fire_threshold": 4.0}, True),
    ("bert_fire", {"fire_threshold": 4.0, "fire_normaliser": "length"}, True),
    ("bert_fire", {"fire_signed": True}, False),
]
SEQ_LEN = 9


def drawn_bias_module(preset, flags, dictionary):
    """The model's encoder and relative-bias module, its parameters drawn away from their start."""
    encoder = build_model(f"{preset}_tiny", dictionary, **flags).encoder.sentence_encoder
    module = encoder.positional_term.relative_bias
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter))
    return encoder, module


@pytest.mark.parametrize("preset, flags, symmetric", DISTANCE_BIASES)
def test_distance_bias_is_translation_invariant_and_symmetric_where_promised(preset, flags, symmetric,
                                                                             dictionary):
    _, module = drawn_bias_module(preset, flags, dictionary)
    with torch.no_grad():
        bias = module(SEQ_LEN)
    torch.testing.assert_close(bias[:, 1:, 1:], bias[:, :-1, :-1])
    assert torch.allclose(bias, bias.transpose(1, 2)) == symmetric


REGISTERED = [(encoding, choice) for encoding in registry.ENCODINGS if encoding.kind == "distance_bias"
              for choice in encoding.choices]


@pytest.mark.parametrize("encoding, choice", REGISTERED, ids=[choice for _, choice in REGISTERED])
def test_every_registered_distance_bias_is_translation_invariant(encoding, choice, dictionary):
    model = build_model("bert_nope_tiny", dictionary, **{encoding.family: choice})
    encoder = model.encoder.sentence_encoder
    module = getattr(encoder.positional_term, encoding.slot)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter))
        bias = module(SEQ_LEN)
    torch.testing.assert_close(bias[:, 1:, 1:], bias[:, :-1, :-1])


@pytest.mark.parametrize("preset, flags, symmetric", DISTANCE_BIASES)
def test_every_head_of_the_distance_bias_equals_the_paper_twin(preset, flags, symmetric, dictionary):
    encoder, module = drawn_bias_module(preset, flags, dictionary)
    with torch.no_grad():
        bias = module(SEQ_LEN)
        for head in range(encoder.config.num_heads):
            for i in range(SEQ_LEN):
                for j in range(SEQ_LEN):
                    torch.testing.assert_close(bias[head, i, j], twin_bias(encoder, module, head, i, j))


def twin_bias(encoder, module, head, i, j):
    config = encoder.config
    if config.kerple:
        return kerple_bias(module, head, abs(j - i), config.kerple_power)
    if config.alibi:
        return alibi_bias(encoder, head, j - i)
    if config.fire:
        return fire_bias(module, head, i, j, SEQ_LEN, config.fire_signed)
    return torch.tensor(sandwich_bias(config, head, i, j))


def test_sandwich_is_zero_at_offset_zero_negative_elsewhere_and_has_no_parameters(dictionary):
    module = build_model("bert_sandwich_tiny", dictionary).encoder.sentence_encoder.positional_term \
        .relative_bias
    bias = module(SEQ_LEN)
    off_diagonal = ~torch.eye(SEQ_LEN, dtype=torch.bool)
    torch.testing.assert_close(torch.diagonal(bias, dim1=1, dim2=2), torch.zeros(4, SEQ_LEN))
    assert (bias[:, off_diagonal] < 0).all()
    assert list(module.parameters()) == []


def test_sandwich_heads_are_compressed_as_alibis_slopes_8h_over_h(dictionary):
    """Chi et al. 2023 (App. E): head h = 1..H divides p_i . p_j - d'/2 by 8h/H."""
    model = build_model("bert_sandwich_tiny", dictionary, encoder_attention_heads=8)
    encoder = model.encoder.sentence_encoder
    bias = encoder.positional_term.relative_bias(SEQ_LEN)
    for head in range(8):
        torch.testing.assert_close(bias[head] * (head + 1), bias[0])
    torch.testing.assert_close(bias[7, 0, 1], torch.tensor(sandwich_bias(encoder.config, 7, 0, 1)))


def kerple_module(dictionary, **flags):
    return build_model("bert_kerple_tiny", dictionary, encoder_attention_heads=8, **flags) \
        .encoder.sentence_encoder.positional_term.relative_bias


@pytest.mark.parametrize("rel_pos", ["kerple-log", "kerple-power"])
def test_released_kerple_clamps_its_parameters_in_place_to_the_authors_bounds(rel_pos, dictionary):
    """chijames/KERPLE clamps bias_p, bias_a to >= 0.01 (the power's exponent to [0.01, 2]) before each
    forward, on the parameters themselves."""
    module = kerple_module(dictionary, rel_pos=rel_pos)
    with torch.no_grad():
        module.r1.fill_(-50.0)
        module.r2.fill_(50.0)
    module(SEQ_LEN).sum().backward()
    assert torch.equal(module.r1.detach(), torch.full((8,), 0.01))
    assert torch.equal(module.r2.detach(), torch.full((8,), 2.0 if rel_pos == "kerple-power" else 50.0))
    assert (module.r1.grad != 0).all() and (module.r2.grad != 0).all()


@pytest.mark.parametrize("rel_pos, multiplier_bound, other_bound", [("kerple-log", 2.0, 1.0),
                                                                    ("kerple-power", 1.0, 2.0)])
def test_released_kerple_starts_every_head_at_random_as_the_authors(rel_pos, multiplier_bound, other_bound,
                                                                    dictionary):
    """The log variant's r1 (bias_p) ~ U[0, 2), r2 (bias_a) ~ U[0, 1); the power variant's r1 (bias_a)
    ~ U[0, 1), exponent r2 (bias_p) ~ U[0, 2)."""
    module = kerple_module(dictionary, rel_pos=rel_pos)
    for value, bound in ((module.r1, multiplier_bound), (module.r2, other_bound)):
        assert ((value >= 0) & (value < bound)).all()
        assert len(set(value.tolist())) == 8


@pytest.mark.parametrize("rel_pos", ["kerple-log", "kerple-power"])
def test_softplus_kerple_starts_every_head_at_one_and_stays_positive(rel_pos, dictionary):
    module = kerple_module(dictionary, rel_pos=rel_pos, kerple_param="softplus")
    for value in module.coefficients():
        torch.testing.assert_close(value, torch.ones(8))
    with torch.no_grad():
        module.raw_r1.fill_(-50.0)
        module.raw_r2.fill_(50.0)
    r1, r2 = module.coefficients()
    assert (r1 > 0).all() and (r2 > 0).all()
    assert rel_pos == "kerple-log" or (r2 <= 2).all()


def test_fixed_asymmetric_alibi_slopes_are_the_papers_left_and_reversed_right(dictionary):
    paper = alibi_slopes(4).float()
    module = build_model("bert_alibi_tiny", dictionary, alibi_asymmetric=True).encoder.sentence_encoder \
        .positional_term.relative_bias
    bias = module(SEQ_LEN).detach()
    torch.testing.assert_close(bias[:, 5, 2], -3 * paper)
    torch.testing.assert_close(bias[:, 2, 5], -3 * paper.flip(0))


def test_learned_asymmetric_alibi_slopes_start_equal_on_both_sides_as_x_transformers(dictionary):
    paper = alibi_slopes(4).float()
    module = build_model("bert_alibi_tiny", dictionary, alibi_asymmetric=True, alibi_learned_slopes=True) \
        .encoder.sentence_encoder.positional_term.relative_bias
    bias = module(SEQ_LEN).detach()
    torch.testing.assert_close(bias[:, 5, 2], -3 * paper)
    torch.testing.assert_close(bias[:, 2, 5], -3 * paper)


def paper_causal_fire(module, head, i, j, eps=1e-6):
    """FIRE's causal bias as the paper's appendix code computes it (row i normalised by
    log(|c max(i, L)| + 1) + eps), for the plugin's c = exp(a) and L, one head."""
    c = torch.exp(module.log_c)
    normaliser = torch.log(torch.abs(c * torch.maximum(torch.tensor(float(i)), module.threshold)) + 1) + eps
    x = torch.log(torch.abs(c * (i - j)) + 1) / normaliser
    first, second = module.mlp[0], module.mlp[2]
    return second.weight[head] @ torch.relu(first.weight[:, 0] * x + first.bias) + second.bias[head]


@pytest.mark.parametrize("threshold", [4.0, 512.0])
def test_fire_last_row_equals_the_papers_causal_form(threshold, dictionary):
    """The bidirectional adaptation normalises every row as the paper's last causal row, i = T - 1."""
    module = build_model("bert_fire_tiny", dictionary, fire_threshold=threshold).encoder.sentence_encoder \
        .positional_term.relative_bias
    with torch.no_grad():
        bias = module(SEQ_LEN)
        last = SEQ_LEN - 1
        for head in range(bias.size(0)):
            expected = torch.stack([paper_causal_fire(module, head, last, j) for j in range(SEQ_LEN)])
            torch.testing.assert_close(bias[head, last], expected)


def test_fire_normalises_by_the_threshold_up_to_it_and_by_the_largest_distance_beyond(dictionary):
    module = build_model("bert_fire_tiny", dictionary, fire_threshold=6.0).encoder.sentence_encoder \
        .positional_term.relative_bias
    torch.testing.assert_close(module(6)[:, :4, :4], module(4))
    assert not torch.allclose(module(9)[:, :4, :4], module(4))
    module(4).sum().backward()
    assert module.threshold.grad != 0
    module.zero_grad()
    module(9).sum().backward()
    assert module.threshold.grad == 0
