"""DAPE (Zheng et al., "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation", NeurIPS 2024,
arXiv 2405.14722) against the equations of the authors' released ``AliBi_DAPE`` and
``ParallelKerpleLog_DAPE`` (causal, restated below with the plugin's weights), its MLP per pair across the
heads, padding masked after it, what --dape may sit on, and a training step."""

import argparse
import math

import pytest
import torch
from conftest import build_model, choices_of_kind, random_tokens
from torch import nn

from tupe_plugin.conversion import hf_export
from tupe_plugin.encodings.dape_position import DapeLayerTerm
from tupe_plugin.encodings.position_config import PositionConfig, PositionFlagError

SEQ_LEN = 9


def released_mlp(module):
    """The released ``mlp2``, Linear(2h -> W), LeakyReLU, Linear(W -> h), holding the plugin module's
    weights."""
    heads, width = module.num_heads, module.hidden.out_features
    mlp = nn.Sequential(nn.Linear(2 * heads, width), nn.LeakyReLU(), nn.Linear(width, heads))
    with torch.no_grad():
        mlp[0].weight.copy_(module.hidden.weight)
        mlp[0].bias.copy_(module.hidden.bias)
        mlp[2].weight.copy_(module.output.weight)
        mlp[2].bias.copy_(module.output.bias)
    return mlp


def causal_distance(seq_len):
    """The released ``tril(arange(L).view(L, 1).repeat(1, L) + arange(0, -L, -1))``: i - j below the
    diagonal, 0 above."""
    rows = torch.arange(seq_len).view(seq_len, 1).repeat(1, seq_len)
    return torch.tril(rows + torch.arange(0, -seq_len, -1)).float()


def released_dape(scores, bias, mlp):
    """``x + a + mlp2(cat((x, tile(a)), dim=1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)``."""
    tiled = torch.tile(bias, (scores.shape[0], 1, 1, 1))
    mixed = mlp(torch.permute(torch.cat((scores, tiled), dim=1), (0, 2, 3, 1)))
    return scores + bias + torch.permute(mixed, (0, 3, 1, 2))


def released_alibi_bias(slopes, seq_len):
    """``AliBi_DAPE``'s a = -tril(i - j) * m_h."""
    return -causal_distance(seq_len) * slopes.view(-1, 1, 1)


def released_kerple_log_bias(r1, r2, seq_len):
    """``ParallelKerpleLog_DAPE``'s -p log(1 + a tril(i - j)), p and a clamped to >= 1e-2."""
    p, a = r1.clamp(min=1e-2).view(-1, 1, 1), r2.clamp(min=1e-2).view(-1, 1, 1)
    return -p * torch.log(1 + a * causal_distance(seq_len))


def plugin_layer_logits(model, tokens, monkeypatch):
    """The input x of the first layer's attention and the logits its softmax reads."""
    attention = model.encoder.sentence_encoder.layers[0].self_attn
    seen, logits = [], []
    hook = attention.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    softmax = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda x, dim: logits.append(x.detach()) or softmax(x, dim))
    with torch.no_grad():
        model(tokens, features_only=True)
    hook.remove()
    return attention, seen[0], logits[0]


def released_reference(attention, x, bias):
    q, k, _ = attention.project(x)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(attention.head_dim)
    return released_dape(scores, bias, released_mlp(attention.layer_terms["dape"]))


def assert_equal_on_keys_up_to_the_query(actual, expected):
    causal = torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool).tril()
    torch.testing.assert_close(actual[..., causal], expected[..., causal], atol=1e-6, rtol=1e-6)


def test_alibi_dape_logits_equal_the_released_alibi_dape(dictionary, monkeypatch):
    model = build_model("bert_dape_alibi_tiny", dictionary)
    tokens = random_tokens(dictionary, [SEQ_LEN, SEQ_LEN])
    attention, x, logits = plugin_layer_logits(model, tokens, monkeypatch)
    slopes = model.encoder.sentence_encoder.positional_term.relative_bias.slopes[0]
    expected = released_reference(attention, x, released_alibi_bias(slopes, SEQ_LEN))
    assert_equal_on_keys_up_to_the_query(logits, expected)


def test_kerple_dape_logits_equal_the_released_kerple_log_dape(dictionary, monkeypatch):
    model = build_model("bert_dape_kerple_tiny", dictionary)
    kerple = model.encoder.sentence_encoder.positional_term.relative_bias
    with torch.no_grad():
        kerple.r2[0] = 1e-3  # below the bound: both clamp it to 1e-2
    r1, r2 = kerple.r1.detach().clone(), kerple.r2.detach().clone()
    tokens = random_tokens(dictionary, [SEQ_LEN, SEQ_LEN])
    attention, x, logits = plugin_layer_logits(model, tokens, monkeypatch)
    expected = released_reference(attention, x, released_kerple_log_bias(r1, r2, SEQ_LEN))
    assert_equal_on_keys_up_to_the_query(logits, expected)


def test_the_mlp_mixes_the_heads_of_one_pair_and_nothing_else():
    torch.manual_seed(0)
    module = DapeLayerTerm(num_heads=4, width=32)
    logits, bias = torch.randn(2, 4, 5, 5), torch.randn(4, 5, 5)
    changed = logits.clone()
    changed[1, :, 2, 3] += torch.randn(4)
    difference = (module(changed, None, None, bias, None) - module(logits, None, None, bias, None)).abs()
    assert difference[1, :, 2, 3].min() > 0
    difference[1, :, 2, 3] = 0
    assert difference.max() == 0


def test_without_a_bias_the_mlp_reads_zeros_beside_the_logits():
    torch.manual_seed(0)
    module = DapeLayerTerm(num_heads=4, width=8)
    logits = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(module(logits, None, None, None, None),
                               module(logits, None, None, torch.zeros(4, 5, 5), None))


def test_padded_keys_are_masked_after_the_mlp_which_reads_them_unmasked(dictionary, monkeypatch):
    model = build_model("bert_dape_kerple_tiny", dictionary)
    module = model.encoder.sentence_encoder.layers[0].self_attn.layer_terms["dape"]
    read = []
    forward = module.forward
    monkeypatch.setattr(module, "forward",
                        lambda logits, *rest: read.append(logits) or forward(logits, *rest))
    tokens = random_tokens(dictionary, [7, 4])
    with torch.no_grad():
        padded = model(tokens, features_only=True)[0]
        alone = model(tokens[1:, :4], features_only=True)[0]
        _, extra = model(tokens, features_only=True, need_attn=True)
    assert read[0][1, ..., 4:].abs().max() < 1e3  # the scores of the padded keys, not the mask's value
    torch.testing.assert_close(padded[1, :4], alone[0], atol=1e-5, rtol=1e-5)
    assert all(probs[1, ..., 4:].max() == 0 for probs in extra["attn"])


@pytest.mark.parametrize("family, value", [("rel_pos", "none"), *choices_of_kind("bias", "distance_bias"),
                                           ("rotary", "fixed"), ("abs_pos", "learned")])
def test_dape_sits_on_a_bias_of_the_distance_or_on_none(family, value):
    PositionConfig(embed_dim=16, num_heads=4, max_positions=8, dape=True, **{family: value}).check()


@pytest.mark.parametrize("family, value", choices_of_kind("relative_vectors"))
def test_dape_beside_relative_vectors_of_the_content_is_refused_naming_them(family, value):
    with pytest.raises(PositionFlagError, match=rf"--dape with --rel-pos {value}: its relative vectors "
                                                r"depend on the content, so there is no content-free bias B"):
        PositionConfig(embed_dim=16, num_heads=4, max_positions=8, rel_pos=value, dape=True).check()


@pytest.mark.parametrize("untied", ["tupe", "four-term"])
def test_dape_beside_an_untied_term_is_refused_naming_it(untied):
    message = rf"--dape with --untied-pos {untied}: DAPE's MLP reads B\(i, j\) as a bias of the distance"
    with pytest.raises(PositionFlagError, match=message + ".*use --untied-pos none"):
        PositionConfig(embed_dim=16, num_heads=4, max_positions=8, untied_pos=untied, cls_reset="none",
                       rel_pos="alibi", dape=True).check()


def test_dape_width_must_be_positive():
    with pytest.raises(PositionFlagError, match="--dape-width must be >= 1, got 0"):
        PositionConfig(embed_dim=16, num_heads=4, max_positions=8, rel_pos="alibi", dape=True,
                       dape_width=0).check()


def test_dape_width_without_dape_is_refused_naming_the_switch():
    with pytest.raises(PositionFlagError, match=r"--dape-width is an option of DAPE; add --dape"):
        PositionConfig(embed_dim=16, num_heads=4, max_positions=8, rel_pos="alibi", dape_width=8).check()


def test_each_layer_holds_its_own_mlp_of_the_width_asked(dictionary):
    model = build_model("bert_dape_alibi_tiny", dictionary, dape_width=8)
    layers = model.encoder.sentence_encoder.layers
    modules = [layer.self_attn.layer_terms["dape"] for layer in layers]
    assert len({id(module) for module in modules}) == len(layers)
    heads = model.args.encoder_attention_heads
    assert all(module.hidden.weight.shape == (8, 2 * heads) for module in modules)


def test_a_kernel_backend_is_refused_naming_dape(dictionary):
    with pytest.raises(PositionFlagError, match=r"--attention-backend triton computes no term of a layer's "
                                                r"own logits \(DAPE\)"):
        build_model("bert_dape_kerple_tiny", dictionary, attention_backend="triton")


def test_the_hf_export_refuses_dape_naming_it(dictionary):
    args = argparse.Namespace(**vars(build_model("bert_dape_alibi_tiny", dictionary).args))
    with pytest.raises(hf_export.ExportError, match=r"model.pt: DAPE \(--dape\) cannot be exported"):
        hf_export.check_exportable(args, "model.pt")


def test_a_dape_model_trains_one_step(dictionary):
    model = build_model("bert_dape_kerple_tiny", dictionary)
    model.train()
    tokens = random_tokens(dictionary, [7, 5, 3])
    before = {name: p.detach().clone() for name, p in model.named_parameters() if "layer_terms.dape" in name}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    logits = model(tokens)[0]
    loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), tokens.view(-1),
                                       ignore_index=dictionary.pad())
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert before and all(not torch.equal(before[name], p) for name, p in model.named_parameters()
                          if name in before)
