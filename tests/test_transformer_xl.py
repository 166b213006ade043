"""Transformer-XL's relative encoding (--rel-pos xl) against a reference no one here wrote: transformers'
XLNet relative attention (``XLNetRelativeAttention.rel_attn_core``, segment term off) with the same weights
and inputs; and what a model of it does with the plugin's commands."""

import argparse

import pytest
import torch
from conftest import build_model
from transformers import XLNetConfig
from transformers.models.xlnet.modeling_xlnet import XLNetModel, XLNetRelativeAttention
from tupe_plugin.conversion import hf_export
from tupe_plugin.encodings.position_config import PositionConfig, PositionFlagError

SEQ_LEN, BATCH = 9, 2


def xlnet_attention(attn, xl, x, clamp_len):
    """The output (B, T, C) of XLNet's relative attention core and output projection for ``x`` (B, T, C), with
    the plugin layer ``attn``'s projections and the shared u, v of ``xl``."""
    embed_dim, heads, head_dim = x.size(-1), attn.num_heads, attn.head_dim
    config = XLNetConfig(d_model=embed_dim, n_head=heads, d_inner=4 * embed_dim, attn_type="bi",
                         clamp_len=clamp_len, dropout=0.0)
    reference = XLNetRelativeAttention(config).eval()
    w_q, w_k, w_v = attn.in_proj.weight.detach().split(embed_dim)
    with torch.no_grad():
        for parameter, weight in ((reference.q, w_q), (reference.k, w_k), (reference.v, w_v),
                                  (reference.r, attn.relative_projections.key.weight.detach())):
            parameter.copy_(weight.t().reshape(embed_dim, heads, head_dim))
        reference.o.copy_(attn.out_proj.weight.detach().reshape(embed_dim, heads, head_dim))
        reference.r_w_bias.copy_(xl.content_bias)
        reference.r_r_bias.copy_(xl.position_bias)
    positions = XLNetModel(config).relative_positional_encoding(SEQ_LEN, SEQ_LEN, bsz=BATCH)
    h = x.transpose(0, 1)  # XLNet's (T, B, C)
    heads_of = lambda weights: torch.einsum("ibh,hnd->ibnd", weights[0], weights[1])  # noqa: E731
    with torch.no_grad():
        vector = reference.rel_attn_core(heads_of((h, reference.q)), heads_of((h, reference.k)),
                                         heads_of((h, reference.v)), heads_of((positions, reference.r)))
        out = torch.einsum("ibnd,hnd->ibh", vector, reference.o)
    return out.transpose(0, 1)


@pytest.mark.parametrize("max_distance", [0, 3])
def test_xl_attention_equals_transformers_xlnet_relative_attention(dictionary, max_distance):
    model = build_model("bert_xl_tiny", dictionary, xl_max_distance=max_distance).eval()
    encoder = model.encoder.sentence_encoder
    attn = encoder.layers[0].self_attn
    with torch.no_grad():  # XLNet's projections have no biases
        attn.in_proj.bias.zero_()
        attn.out_proj.bias.zero_()
        for bias in (encoder.positional_term.transformer_xl.content_bias,
                     encoder.positional_term.transformer_xl.position_bias):
            bias.normal_()
    x = torch.randn(BATCH, SEQ_LEN, encoder.config.embed_dim)
    plan = encoder.attention_plan(x.device, False, SEQ_LEN)
    term = encoder.positional_term.build(SEQ_LEN, plan.fold_untied, None, x.dtype, plan.padding_as_lengths,
                                         plan.offset_bias_as_rows)
    with torch.no_grad():
        ours, _ = attn(x, term, plan)
    expected = xlnet_attention(attn, encoder.positional_term.transformer_xl, x, max_distance or -1)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_xl_scale_is_one_over_sqrt_of_the_head_dimension():
    config = PositionConfig(embed_dim=64, num_heads=4, max_positions=8, rel_pos="xl")
    assert config.scale == pytest.approx(16 ** -0.5)


@pytest.mark.parametrize("flags, message", [
    (dict(rel_pos="xl", xl_max_distance=-1), "--xl-max-distance must be >= 0"),
    (dict(rel_pos="t5", xl_max_distance=4), "--xl-max-distance is an option of Transformer-XL's relative "
                                            "encoding; add --rel-pos xl"),
    (dict(rel_pos="xl", rotary="fixed"), "--rotary fixed with --rel-pos xl: two query-dependent"),
    (dict(rel_pos="xl", cls_reset="paper"), "--cls-reset paper resets a content-free term"),
])
def test_xl_options_are_checked_by_name(flags, message):
    with pytest.raises(PositionFlagError, match=message):
        PositionConfig(embed_dim=64, num_heads=4, max_positions=8, **flags).check()


def test_xl_layers_project_the_sinusoids_with_their_own_w_r(dictionary):
    model = build_model("bert_xl_tiny", dictionary)
    keys = model.state_dict()
    layers = model.args.encoder_layers
    assert all(f"encoder.sentence_encoder.layers.{n}.self_attn.relative_projections.key.weight" in keys
               for n in range(layers))
    assert "encoder.sentence_encoder.positional_term.transformer_xl.content_bias" in keys


def test_the_hf_export_refuses_xl_naming_it(dictionary):
    args = argparse.Namespace(**vars(build_model("bert_xl_tiny", dictionary).args))
    with pytest.raises(hf_export.ExportError,
                       match=r"model.pt: Transformer-XL's relative encoding \(--rel-pos xl\) "
                             r"cannot be exported"):
        hf_export.check_exportable(args, "model.pt")


def test_xl_needs_an_even_model_width_for_its_sinusoids():
    with pytest.raises(PositionFlagError, match="--rel-pos xl needs an even --encoder-embed-dim .*, got 63"):
        PositionConfig(embed_dim=63, num_heads=3, max_positions=8, rel_pos="xl").check()
