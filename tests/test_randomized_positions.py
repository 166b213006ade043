"""Randomized positions (Ruoss et al., "Randomized Positional Encodings Boost Length Generalization of
Transformers", ACL 2023, arXiv 2305.16843, §3): in training each sequence's positions are a sorted sample of
T distinct integers of [0, L), one draw per sequence from torch's global generator; at evaluation 0..T-1. The
encodings indexed by position read them (RoPE's angles, the absolute tables); the others are refused."""

import re

import pytest
import torch
from conftest import build_model, make_dictionary, random_tokens

from tupe_plugin.encodings import registry
from tupe_plugin.encodings.position_config import PositionConfig, PositionFlagError
from tupe_plugin.encodings.randomized_position import sample_positions
from tupe_plugin.encodings.rotary_position import RotaryPosition
from tupe_plugin.terms.forward import Forward
from tupe_plugin.terms.parts import Rotary

PRESET = "bert_rope_randomized_tiny"


def _config(length, **flags):
    return PositionConfig(embed_dim=8, num_heads=2, max_positions=16, randomized_positions=length,
                          **dict(dict(rotary="fixed"), **flags))


def _draw(length=50, seq_len=20, batch=8):
    return sample_positions(_config(length), Forward.of_length(seq_len, batch))


def _encoder(model):
    return model.encoder.sentence_encoder


def test_each_sequence_takes_sorted_distinct_positions_of_0_to_L():
    torch.manual_seed(0)
    positions = _draw()
    assert positions.shape == (8, 20) and positions.dtype == torch.long
    assert bool((positions[:, 1:] > positions[:, :-1]).all())  # sorted and distinct
    assert int(positions.min()) >= 0 and int(positions.max()) < 50


def test_each_sequence_has_a_draw_of_its_own():
    torch.manual_seed(0)
    positions = _draw()
    assert len({tuple(row) for row in positions.tolist()}) == 8


def test_the_draw_is_reproducible_under_torch_manual_seed():
    torch.manual_seed(3)
    first = _draw()
    torch.manual_seed(3)
    assert torch.equal(first, _draw())


def test_the_draws_cover_0_to_L_about_uniformly():
    """4000 draws of 8 positions of [0, 32): each position is drawn 1000 times on average, with a standard
    deviation of about 27; a fixed seed makes the bound (25% either side) a fact, not a chance."""
    torch.manual_seed(0)
    counts = torch.bincount(_draw(length=32, seq_len=8, batch=4000).flatten(), minlength=32)
    assert counts.numel() == 32
    assert int(counts.min()) > 750 and int(counts.max()) < 1250


def test_a_sequence_as_long_as_L_takes_every_position():
    torch.manual_seed(0)
    assert torch.equal(_draw(length=12, seq_len=12, batch=3), torch.arange(12).expand(3, 12))


def test_a_training_sequence_longer_than_L_is_refused_naming_the_flag_and_T():
    model = build_model(PRESET, randomized_positions=6).train()
    with pytest.raises(ValueError, match=r"--randomized-positions 6 .* this batch has T = 10 tokens"):
        model(random_tokens(make_dictionary(), [10, 7]))


def test_evaluation_reads_positions_0_to_T_minus_1():
    term = _encoder(build_model(PRESET).eval()).positional_term
    forward = term.forward_of(3, 9)
    assert not forward.per_sequence and forward.positions.tolist() == list(range(9))


def test_in_evaluation_the_model_is_bert_rope_with_the_same_weights():
    dictionary = make_dictionary()
    randomized, rope = build_model(PRESET, dictionary), build_model("bert_rope_tiny", dictionary)
    rope.load_state_dict(randomized.state_dict())
    tokens = random_tokens(dictionary, [12, 9, 5])
    with torch.no_grad():
        expected = rope.eval()(tokens, features_only=True)[0]
        assert torch.equal(randomized.eval()(tokens, features_only=True)[0], expected)


def test_a_training_forward_rotates_each_row_by_the_angles_of_its_own_positions():
    term = _encoder(build_model(PRESET).train()).positional_term
    torch.manual_seed(0)
    forward = term.forward_of(4, 10)
    rotary = term.content_free(forward).get(Rotary)
    assert forward.per_sequence and rotary.per_sequence and rotary.cos.shape == (4, 10, 16)
    cos, sin = RotaryPosition(32)(forward.positions)  # the tiny heads' d_h
    torch.testing.assert_close(rotary.cos, cos)
    torch.testing.assert_close(rotary.sin, sin)
    assert not torch.equal(rotary.cos[0], rotary.cos[1])


def test_a_learned_table_adds_its_rows_at_the_sampled_positions():
    model = build_model("bert_a_tiny", randomized_positions=32).train()
    encoder = _encoder(model)
    seen = {}
    encoder.embed_positions.register_forward_hook(
        lambda module, inputs, output: seen.update(positions=inputs[0], rows=output))
    tokens = random_tokens(make_dictionary(), [10, 10, 6])
    torch.manual_seed(5)
    expected = sample_positions(encoder.config, Forward.of_length(10, 3))
    torch.manual_seed(5)
    model(tokens)
    assert torch.equal(seen["positions"], expected)
    torch.testing.assert_close(seen["rows"], encoder.embed_positions.weight[expected])


@pytest.mark.parametrize("encoding", [encoding for encoding in registry.ENCODINGS
                                      if encoding.kind != "positions" and not encoding.reads_positions],
                         ids=lambda encoding: encoding.name)
def test_an_encoding_that_does_not_read_the_sampled_positions_is_refused_by_name(encoding):
    flags = {encoding.family: encoding.choices[0] if encoding.choices else True}  # a switch: on
    with pytest.raises(PositionFlagError, match=rf"--randomized-positions 64 samples the positions of each "
                                                rf"sequence in training and {re.escape(encoding.label)} "
                                                rf"\(--{encoding.family.replace('_', '-')}[ )]"):
        _config(64, **flags).check()


def test_a_model_without_an_encoding_indexed_by_position_is_refused():
    with pytest.raises(PositionFlagError, match=r"--randomized-positions 64 samples the positions of the "
                                                r"encodings indexed by position .* and the model has none"):
        _config(64, rotary="none").check()


def test_a_learned_table_with_fewer_rows_than_L_is_refused():
    with pytest.raises(PositionFlagError, match=r"--randomized-positions 64 samples positions up to 63 and "
                                                r"--abs-pos learned has --max-positions 16 rows"):
        _config(64, rotary="none", abs_pos="learned").check()


def test_a_negative_L_is_refused():
    with pytest.raises(PositionFlagError, match=r"--randomized-positions must be >= 0 \(0 = off\), got -2"):
        _config(-2).check()


def test_L_of_0_is_off():
    assert not any(encoding.kind == "positions" for encoding in _config(0).encodings())
