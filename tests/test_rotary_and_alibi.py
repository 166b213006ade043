"""RoPE (Su et al. 2021) and ALiBi (Press et al. 2022): the properties their papers state."""

import pytest
import torch
from conftest import build_model, choices_of_kind, random_tokens
from tupe_plugin.encodings import registry
from tupe_plugin.encodings.alibi_position import AlibiBias, alibi_slopes
from tupe_plugin.encodings.position_config import PositionConfig, PositionFlagError
from tupe_plugin.encoder.self_attention import PositionalSelfAttention
from tupe_plugin.encodings.rotary_position import RotaryPosition, rotate, rotate_in_place, rotates_in_place


@pytest.mark.parametrize("heads, expected", [
    (8, [2 ** -1, 2 ** -2, 2 ** -3, 2 ** -4, 2 ** -5, 2 ** -6, 2 ** -7, 2 ** -8]),
    (4, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]),
    # not a power of two: the 8 slopes of 8 heads, then every other slope of 16 heads from the first
    (12, [2 ** -1, 2 ** -2, 2 ** -3, 2 ** -4, 2 ** -5, 2 ** -6, 2 ** -7, 2 ** -8,
          2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]),
    (6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]),
])
def test_alibi_slopes_follow_the_papers_rule(heads, expected):
    torch.testing.assert_close(alibi_slopes(heads), torch.tensor(expected, dtype=torch.float64))


def test_alibi_bias_is_minus_slope_times_distance_and_has_no_parameters():
    module = AlibiBias(4)
    bias = module(6)
    slopes = alibi_slopes(4).float()
    for i in range(6):
        for j in range(6):
            torch.testing.assert_close(bias[:, i, j], -slopes * abs(j - i))
    assert list(module.parameters()) == [] and module.state_dict() == {}


def test_alibi_probabilities_with_constant_content_are_the_softmax_of_the_bias(dictionary):
    model = build_model("bert_alibi_tiny", dictionary).eval()
    tokens = torch.full((1, 9), dictionary.index("w3"))  # one word everywhere: equal content logits
    slopes = alibi_slopes(4).float()
    distance = (torch.arange(9)[None, :] - torch.arange(9)[:, None]).abs()
    expected = torch.softmax(-slopes[:, None, None] * distance, -1)
    with torch.no_grad():
        _, extra = model(tokens, features_only=True, need_attn=True)
    torch.testing.assert_close(extra["attn"][0][0], expected, atol=1e-5, rtol=1e-4)


def test_rotary_logits_depend_only_on_the_offset_for_identical_content():
    rotary = RotaryPosition(32)
    cos, sin = rotary(12)
    q, k = torch.randn(32), torch.randn(32)
    rotated_q = rotate(q.expand(12, -1), cos, sin)
    rotated_k = rotate(k.expand(12, -1), cos, sin)
    logits = rotated_q @ rotated_k.t()
    for offset in range(-11, 12):
        diagonal = torch.diagonal(logits, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(torch.diagonal(logits, 1)[0], torch.diagonal(logits, 3)[0])


def test_rotary_model_logits_depend_only_on_the_offset_for_identical_words(dictionary):
    model = build_model("bert_rope_tiny", dictionary).eval()
    encoder = model.encoder.sentence_encoder
    x = encoder.embed(torch.full((1, 10), dictionary.index("w5")))
    attention = encoder.layers[0].self_attn
    q, k, _ = attention.in_proj(x).view(1, 10, 3, 4, 32).permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = encoder.positional_term.rotary(10)
    logits = rotate(q, cos, sin) @ rotate(k, cos, sin).transpose(-1, -2)
    for offset in range(-9, 10):
        diagonal = torch.diagonal(logits, offset, dim1=-2, dim2=-1)
        torch.testing.assert_close(diagonal, diagonal[..., :1].expand_as(diagonal), atol=1e-4, rtol=1e-4)


def test_rotation_keeps_the_norm_of_every_pair():
    cos, sin = RotaryPosition(16)(7)
    x = torch.randn(3, 7, 16)
    pairs = rotate(x, cos, sin).view(3, 7, 8, 2).norm(dim=-1)
    torch.testing.assert_close(pairs, x.view(3, 7, 8, 2).norm(dim=-1))


def test_learnable_rotary_frequencies_start_at_the_fixed_ones_and_get_gradients(dictionary):
    model = build_model("bert_lrope_tiny", dictionary)
    fixed = build_model("bert_rope_tiny", dictionary)
    learnable = model.encoder.sentence_encoder.positional_term.rotary.sinusoid.frequencies
    constant = fixed.encoder.sentence_encoder.positional_term.rotary.sinusoid.frequencies
    assert isinstance(learnable, torch.nn.Parameter) and not isinstance(constant, torch.nn.Parameter)
    torch.testing.assert_close(learnable.detach(), constant)
    model(random_tokens(dictionary, [7, 4]), features_only=True)[0].sum().backward()
    assert learnable.grad is not None and learnable.grad.abs().sum() > 0


def test_rotary_base_sets_the_frequencies(dictionary):
    model = build_model("bert_rope_tiny", dictionary, rotary_base=500.0)
    frequencies = model.encoder.sentence_encoder.positional_term.rotary.sinusoid.frequencies
    torch.testing.assert_close(frequencies, 500.0 ** (-torch.arange(0, 32, 2).float() / 32))


@pytest.mark.parametrize("flags, message", [
    (dict(rotary="fixed", untied_pos="four-term"), "--rotary fixed with --untied-pos four-term"),
    (dict(rotary="learnable", rel_pos="shaw-learned"), "two query-dependent relative encodings"),
    (dict(rel_pos="sandwich", sandwich_dim=7), "--sandwich-dim must be even and >= 2, got 7"),
    (dict(rel_pos="sandwich", sandwich_scale=0.0), "--sandwich-scale must be > 0"),
    (dict(alibi_asymmetric=True), "--alibi-asymmetric is an option of ALiBi; add --rel-pos alibi"),
    (dict(rel_pos="t5", fire_signed=True), "--fire-signed is an option of FIRE; add --rel-pos fire"),
    (dict(rel_pos="fire", fire_hidden=0), "--fire-hidden must be >= 1, got 0"),
    (dict(rel_pos="t5", alibi_learned_slopes=True), "--alibi-learned-slopes is an option of ALiBi"),
    (dict(rotary="fixed", rotary_base=1.0), "--rotary-base must be > 1"),
    (dict(rotary="spiral"), "--rotary must be one of none, fixed, learnable"),
])
def test_nonsense_rotary_and_alibi_combinations_are_refused_by_name(flags, message):
    with pytest.raises(PositionFlagError, match=message):
        PositionConfig(embed_dim=64, num_heads=4, max_positions=8, **flags).check()


@pytest.mark.parametrize("rotary", registry.family_choices("rotary")[1:])  # every choice but none
@pytest.mark.parametrize("family, choice", choices_of_kind("distance_bias"))
def test_rotary_with_any_distance_bias_is_refused_by_name(rotary, family, choice):
    with pytest.raises(PositionFlagError, match=f"--rotary {rotary} with --rel-pos {choice}: two relative"):
        PositionConfig(embed_dim=64, num_heads=4, max_positions=8, rotary=rotary, **{family: choice}).check()


@pytest.mark.parametrize("family, choice", choices_of_kind("distance_bias"))
def test_the_released_cls_reset_of_a_distance_bias_is_refused_by_name(family, choice):
    with pytest.raises(PositionFlagError, match=f"--cls-reset release .* {choice}"):
        PositionConfig(embed_dim=64, num_heads=4, max_positions=8, untied_pos="tupe", cls_reset="release",
                       **{family: choice}).check()


def test_rotary_needs_an_even_head_dimension():
    with pytest.raises(PositionFlagError, match="head dimension must be even, got 9"):
        PositionConfig(embed_dim=36, num_heads=4, max_positions=8, rotary="fixed").check()


@pytest.mark.parametrize("flags", [
    dict(rotary="fixed", rel_pos="t5"), dict(rotary="fixed", untied_pos="tupe", cls_reset="paper"),
    dict(rel_pos="alibi", untied_pos="tupe", cls_reset="paper"), dict(rel_pos="alibi", abs_pos="learned"),
])
def test_meaningful_combinations_build(flags, dictionary):
    model = build_model("bert_nope_tiny", dictionary, **flags)
    out = model(random_tokens(dictionary, [6, 3]), features_only=True)[0]
    assert torch.isfinite(out).all()


def test_fixed_tables_rotate_q_and_k_in_place_so_no_second_copy_is_kept():
    cos, sin = RotaryPosition(8)(5)
    projection = torch.randn(2, 5, 3, 4, 8)  # (B, T, q k v, H, d_h)
    q, k, v = (t.transpose(1, 2) for t in projection.clone().unbind(2))
    rotate_in_place(projection[:, :, :2], cos, sin)
    torch.testing.assert_close(projection[:, :, 0].transpose(1, 2), rotate(q, cos, sin))
    torch.testing.assert_close(projection[:, :, 1].transpose(1, 2), rotate(k, cos, sin))
    assert torch.equal(projection[:, :, 2].transpose(1, 2), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rotation_in_place_gives_the_pairwise_rotations_values_and_gradients(dtype):
    """As complex products in float32 and float64, in the real form otherwise: both are Eq. 34 of RoFormer,
    the pairs (2k, 2k+1) rotated by theta_k t, and the projection's gradient follows either way."""
    cos, sin = RotaryPosition(8)(5)
    projection = torch.randn(2, 5, 3, 4, 8, dtype=torch.float64)
    weights = torch.randn_like(projection)

    def in_place(x):
        x = x.to(dtype) * 1
        rotate_in_place(x[:, :, :2], cos, sin)
        return x

    def pairwise(x):
        x = x.to(dtype)
        qk = rotate(x[:, :, :2], cos[:, None, None], sin[:, None, None])
        return torch.cat([qk, x[:, :, 2:]], 2)

    results = []
    for rotation in (in_place, pairwise):
        leaf = projection.clone().requires_grad_()
        out = rotation(leaf)
        (out.double() * weights).sum().backward()
        results.append((out.double().detach(), leaf.grad))
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-6
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)


def test_learnable_tables_rotate_out_of_place_and_train_their_frequencies():
    rope = RotaryPosition(8, learnable=True)
    cos, sin = rope(5)
    assert not rotates_in_place(cos, sin)
    projection = torch.randn(2, 5, 3 * 4 * 8).view(2, 5, 3, 4, 8)
    before = projection.clone()
    q, k, _ = PositionalSelfAttention._rotated(projection, cos, sin)
    assert torch.equal(projection, before)
    torch.testing.assert_close(q, rotate(before[:, :, 0].transpose(1, 2), cos, sin))
    (q.sum() + k.sum()).backward()
    assert rope.sinusoid.frequencies.grad is not None and rope.sinusoid.frequencies.grad.abs().sum() > 0
