"""The biases of the distance made for length extrapolation (KERPLE, Sandwich): the properties their papers
state, and the bias of every head against the paper twin (tests/paper_equations.py) with drawn parameters."""

import pytest
import torch
from conftest import build_model
from paper_equations import kerple_bias, sandwich_bias

# (preset, flags) of every distance bias and variant
DISTANCE_BIASES = [
    ("bert_kerple", {}),
    ("bert_kerple", {"rel_pos": "kerple-power"}),
    ("bert_sandwich", {"sandwich_dim": 32, "sandwich_scale": 0.25}),
]
SEQ_LEN = 9


def drawn_bias_module(preset, flags, dictionary):
    """The model's relative-bias module with its parameters drawn away from their (head-equal) start."""
    model = build_model(f"{preset}_tiny", dictionary, **flags)
    module = model.encoder.sentence_encoder.positional_term.relative_bias
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter))
    return model, module


@pytest.mark.parametrize("preset, flags", DISTANCE_BIASES)
def test_distance_bias_is_translation_invariant_and_symmetric(preset, flags, dictionary):
    _, module = drawn_bias_module(preset, flags, dictionary)
    with torch.no_grad():
        bias = module(SEQ_LEN)
    torch.testing.assert_close(bias[:, 1:, 1:], bias[:, :-1, :-1])
    torch.testing.assert_close(bias, bias.transpose(1, 2))


@pytest.mark.parametrize("preset, flags", DISTANCE_BIASES)
def test_every_head_of_the_distance_bias_equals_the_paper_twin(preset, flags, dictionary):
    model, module = drawn_bias_module(preset, flags, dictionary)
    config = model.encoder.sentence_encoder.config
    with torch.no_grad():
        bias = module(SEQ_LEN)
        for head in range(config.num_heads):
            for i in range(SEQ_LEN):
                for j in range(SEQ_LEN):
                    torch.testing.assert_close(bias[head, i, j], twin_bias(config, module, head, i, j))


def twin_bias(config, module, head, i, j):
    if config.kerple:
        return kerple_bias(module, head, abs(j - i), config.kerple_power)
    return torch.tensor(sandwich_bias(config, i, j))


def test_sandwich_is_zero_at_offset_zero_negative_elsewhere_and_has_no_parameters(dictionary):
    module = build_model("bert_sandwich_tiny", dictionary).encoder.sentence_encoder.positional_term \
        .relative_bias
    bias = module(SEQ_LEN)
    off_diagonal = ~torch.eye(SEQ_LEN, dtype=torch.bool)
    torch.testing.assert_close(torch.diagonal(bias, dim1=1, dim2=2), torch.zeros(4, SEQ_LEN))
    assert (bias[:, off_diagonal] < 0).all()
    assert list(module.parameters()) == []


def test_kerple_coefficients_stay_positive_and_the_power_at_most_two(dictionary):
    for rel_pos in ("kerple-log", "kerple-power"):
        module = build_model("bert_kerple_tiny", dictionary, rel_pos=rel_pos).encoder.sentence_encoder \
            .positional_term.relative_bias
        with torch.no_grad():
            module.raw_r1.fill_(-50.0)
            module.raw_r2.fill_(50.0)
        r1, r2 = module.coefficients()
        assert (r1 > 0).all() and (r2 > 0).all()
        assert rel_pos == "kerple-log" or (r2 <= 2).all()
