"""The properties Wang et al. 2021 states for its position encodings (§2, §3.2), and learnable frequencies."""

import pytest
import torch

from conftest import PRESETS, build_model, preset_encodings, random_tokens
from tupe_plugin.encodings.absolute_position import SinusoidalAbsolutePosition
from tupe_plugin.encodings.shaw_position import ShawRelativePosition


def test_fixed_sinusoidal_ape_dot_products_depend_only_on_the_offset():
    positions = SinusoidalAbsolutePosition(768)(100).double()
    dots = positions @ positions.t()
    for offset in range(-20, 21):
        diagonal = torch.diagonal(dots, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-4, rtol=0)


def test_fixed_sinusoidal_ape_dot_products_are_symmetric():
    positions = SinusoidalAbsolutePosition(768)(100)
    dots = positions @ positions.t()
    torch.testing.assert_close(dots, dots.t())


def test_sinusoidal_rpe_tells_forward_from_backward_offsets():
    shaw = ShawRelativePosition(64, max_distance=16, learned=False)
    table = shaw.table()
    query = torch.randn(64)
    forward, backward = table[16 + 5], table[16 - 5]
    assert not torch.allclose(query @ forward, query @ backward)
    torch.testing.assert_close(forward @ table[16], backward @ table[16])


def test_no_pe_model_is_permutation_equivariant(dictionary):
    model = build_model("bert_nope_tiny", dictionary).eval()
    tokens = random_tokens(dictionary, [9])
    permutation = torch.randperm(9)
    with torch.no_grad():
        out = model(tokens, features_only=True)[0]
        permuted = model(tokens[:, permutation], features_only=True)[0]
    torch.testing.assert_close(permuted, out[:, permutation], atol=1e-5, rtol=1e-5)


# every preset whose only encoding is Shaw's relative vectors (one a --rel-pos shaw-* value)
SHAW_ONLY = [preset for preset in PRESETS
             if [encoding.name for encoding in preset_encodings(preset)] == ["shaw"]]


@pytest.mark.parametrize("preset", SHAW_ONLY)
def test_rpe_only_outputs_do_not_depend_on_the_batch(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary).eval()
    sequence = random_tokens(dictionary, [6], seed=1)
    others = random_tokens(dictionary, [11, 3], seed=2)
    batch = torch.full((3, 11), dictionary.pad())
    batch[:2] = others
    batch[2, :6] = sequence[0]
    with torch.no_grad():
        alone = model(sequence, features_only=True)[0][0]
        in_batch = model(batch, features_only=True)[0][2, :6]
    torch.testing.assert_close(in_batch, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "preset, name",
    [("bert_lsin_ape", "embed_positions.sinusoid.frequencies"),
     ("bert_lsin_rpe", "positional_term.shaw.sinusoid.frequencies")],
)
def test_learnable_frequencies_receive_gradients_and_change(preset, name, dictionary):
    model = build_model(f"{preset}_tiny", dictionary)
    frequencies = dict(model.encoder.sentence_encoder.named_parameters())[name]
    before = frequencies.detach().clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(random_tokens(dictionary, [8, 5]))[0].logsumexp(-1).mean().backward()
    assert frequencies.grad is not None and frequencies.grad.abs().sum() > 0
    optimizer.step()
    assert not torch.equal(frequencies.detach(), before)


@pytest.mark.parametrize(
    "preset, name",
    [("bert_sin_ape", "embed_positions.sinusoid.frequencies"),
     ("bert_sin_rpe", "positional_term.shaw.sinusoid.frequencies")],
)
def test_fixed_frequencies_are_buffers_that_training_leaves_alone(preset, name, dictionary):
    model = build_model(f"{preset}_tiny", dictionary)
    encoder = model.encoder.sentence_encoder
    assert name not in dict(encoder.named_parameters())
    before = dict(encoder.named_buffers())[name].clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(random_tokens(dictionary, [8, 5]))[0].logsumexp(-1).mean().backward()
    optimizer.step()
    assert torch.equal(dict(encoder.named_buffers())[name], before)
