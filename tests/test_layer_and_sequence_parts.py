"""The two kinds of parts that are not shared by the layers and the rows: a term each layer computes from its
own logits (LayerTerm), and tables of each sequence's own positions (a Rotary of (B, T, d/2) tables, the
positions of a Forward)."""

import pytest
import torch
from torch import nn

from tupe_plugin.attention.paths import AttentionPath, AttentionPlan, fuse_rotary
from tupe_plugin.encoder.self_attention import PositionalSelfAttention
from tupe_plugin.encodings.absolute_position import LearnedAbsolutePosition, SinusoidalAbsolutePosition
from tupe_plugin.encodings.positional_term import PositionalTerm
from tupe_plugin.encodings.rotary_position import RotaryPosition, rotate, rotate_in_place
from tupe_plugin.terms.forward import Forward
from tupe_plugin.terms.parts import DenseBias, LayerTerm, Rotary

pytestmark = pytest.mark.smoke


class HeadMix(nn.Module):
    """A layer term for the tests: a learned mix across heads of the logits and the bias, per (i, j)."""

    def __init__(self, heads):
        super().__init__()
        self.mix = nn.Linear(2 * heads, heads)

    def forward(self, logits, q, k, bias, padding):
        bias = torch.zeros_like(logits[0]) if bias is None else bias
        inputs = torch.cat([logits, bias.expand_as(logits)], 1)
        return self.mix(inputs.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _attention_with_layer_term(heads=2, dim=8):
    torch.manual_seed(0)
    return PositionalSelfAttention(dim, heads, layer_terms=lambda: {"mix": HeadMix(heads)})


def test_a_layer_holds_its_own_module_of_each_layer_term_under_layer_terms():
    first, second = _attention_with_layer_term(), _attention_with_layer_term()
    assert first.layer_terms["mix"] is not second.layer_terms["mix"]
    assert {name for name, _ in first.named_parameters()} >= {"layer_terms.mix.mix.weight",
                                                             "layer_terms.mix.mix.bias"}


def test_a_layer_without_layer_terms_holds_no_module_for_them():
    assert PositionalSelfAttention(8, 2).layer_terms is None


def test_the_explicit_path_adds_the_layer_term_to_the_logits_as_its_equation_says():
    attention = _attention_with_layer_term()
    x = torch.randn(2, 5, 8, requires_grad=True)
    bias = torch.randn(2, 5, 5)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    term = PositionalTerm(scale=0.5, key_padding=padding)
    term.add(DenseBias(bias))
    term.add(LayerTerm("mix"))
    mask = bias[None].masked_fill(padding[:, None, None], torch.finfo(torch.float32).min)
    term.attn_mask = mask
    out, _ = attention(x, term, AttentionPlan(AttentionPath.EXPLICIT))

    q, k, v = attention.project(x)
    logits = 0.5 * q @ k.transpose(-1, -2)
    expected_logits = logits + mask + attention.layer_terms["mix"](logits, q, k, bias, padding)
    expected = torch.softmax(expected_logits, -1) @ v
    expected = attention.out_proj(expected.transpose(1, 2).reshape(2, 5, 8))
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    gradient, = torch.autograd.grad(out.sum(), x)
    expected_gradient, = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(gradient, expected_gradient, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("path", [path for path in AttentionPath if path is not AttentionPath.EXPLICIT])
def test_every_path_but_the_explicit_one_refuses_a_layer_term_by_name(path):
    with pytest.raises(ValueError, match=r"does not read a term each layer computes from its own logits"
                                         r" \(LayerTerm\).*the paths that read them all: explicit"):
        AttentionPlan(path).check_reads([LayerTerm("mix")])


def test_a_forward_of_a_length_has_positions_shared_by_its_rows():
    forward = Forward.of_length(6, batch=3)
    assert not forward.per_sequence
    assert forward.positions.tolist() == list(range(6))


def _positions_per_row():
    return torch.tensor([[0, 2, 3, 7, 9], [1, 4, 5, 6, 11]])


def test_rotary_tables_of_each_sequence_rotate_each_row_by_its_own_positions():
    rotary = RotaryPosition(8)
    positions = _positions_per_row()
    cos, sin = rotary(positions)
    assert cos.shape == (2, 5, 4) and Rotary(cos, sin).per_sequence
    x = torch.randn(2, 3, 5, 8)
    rotated = rotate(x, cos, sin)
    for row in range(2):
        torch.testing.assert_close(rotated[row], rotate(x[row], *rotary(positions[row])))


def test_rotary_tables_of_each_sequence_rotate_a_projection_in_place_as_out_of_place():
    cos, sin = RotaryPosition(8)(_positions_per_row())
    qkv = torch.randn(2, 5, 3, 2, 8)
    expected = rotate(qkv[:, :, :2].permute(0, 2, 3, 1, 4), cos[:, None, None], sin[:, None, None])
    rotate_in_place(qkv[:, :, :2], cos, sin)
    torch.testing.assert_close(qkv[:, :, :2].permute(0, 2, 3, 1, 4), expected)


@pytest.mark.parametrize("table", [LearnedAbsolutePosition(16, 6), SinusoidalAbsolutePosition(6)])
def test_an_absolute_embedding_reads_each_sequences_own_positions(table):
    positions = _positions_per_row()
    embedded = table(positions)
    assert embedded.shape == (2, 5, 6)
    full = table(16)
    for row in range(2):
        torch.testing.assert_close(embedded[row], full[positions[row]])


def test_a_learned_table_refuses_a_position_beyond_it_naming_its_size():
    with pytest.raises(ValueError, match="position 11 is beyond the 8 learned absolute positions"):
        LearnedAbsolutePosition(8, 6)(_positions_per_row())


def test_the_fused_rotation_is_not_planned_for_tables_of_each_sequence(monkeypatch):
    class Config:
        rotary_applies, learnable_rotary_frequencies = True, False
    monkeypatch.setattr("tupe_plugin.attention.paths.find_spec", lambda name: object())
    assert fuse_rotary("cuda", Config, "triton")
    assert not fuse_rotary("cuda", Config, "triton", per_sequence=True)
