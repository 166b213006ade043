"""When the untied term is folded into the dense bias (CPU training with attention dropout, or a T5
bias added in every layer anyway), and that folding leaves the function unchanged."""

import pytest
import torch
from conftest import (PRESETS, assert_gradients_close, build_model, features_and_grads, preset_config,
                      random_tokens)
from tupe_plugin.encodings.positional_term import PositionalTerm
from tupe_plugin.terms.parts import LowRank

# every preset whose term holds TUPE's untied factors as widened heads (a LowRank part), which folding
# multiplies out
UNTIED_PRESETS = [preset for preset in PRESETS if LowRank in preset_config(preset).part_types()]


@pytest.mark.parametrize("preset", UNTIED_PRESETS)
def test_folded_term_has_the_same_content_free_logits(preset, dictionary):
    positional = build_model(f"{preset}_tiny", dictionary).encoder.sentence_encoder.positional_term
    term = positional.content_free(9)
    folded = term.folded()
    assert folded.get(LowRank) is None
    torch.testing.assert_close(folded.dense(), term.dense(), atol=1e-6, rtol=1e-6)


def _assert_folds_once_without_changing_the_function(model, dictionary, monkeypatch):
    tokens = random_tokens(dictionary, [7, 5, 3])
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim)
    folds = []
    original = PositionalTerm.folded
    monkeypatch.setattr(PositionalTerm, "folded",
                        lambda term, memory=None: folds.append(1) or original(term, memory))
    folded, folded_grads = features_and_grads(model, tokens, weights, seed=3)
    assert folds == [1]
    monkeypatch.setattr(PositionalTerm, "folded", lambda term, memory=None: term)
    factored, factored_grads = features_and_grads(model, tokens, weights, seed=3)
    torch.testing.assert_close(folded, factored, atol=1e-5, rtol=1e-5)
    assert_gradients_close(folded_grads, factored_grads, atol=1e-6)


@pytest.mark.parametrize("preset", UNTIED_PRESETS)
def test_attention_dropout_training_folds_the_untied_term_without_changing_the_function(
        preset, dictionary, monkeypatch):
    model = build_model(f"{preset}_tiny", dictionary, attention_dropout=0.3)
    _assert_folds_once_without_changing_the_function(model, dictionary, monkeypatch)


def test_a_t5_bias_takes_in_the_untied_term_without_dropout_too(dictionary, monkeypatch):
    model = build_model("tupe_r_tiny", dictionary, attention_dropout=0.0)
    _assert_folds_once_without_changing_the_function(model, dictionary, monkeypatch)


def test_cpu_training_without_dropout_folds_the_untied_term_alone_without_changing_the_function(
        dictionary, monkeypatch):
    model = build_model("tupe_a_tiny", dictionary, attention_dropout=0.0)
    _assert_folds_once_without_changing_the_function(model, dictionary, monkeypatch)


def test_without_a_dense_bias_or_gradients_the_untied_term_stays_factored(dictionary, monkeypatch):
    model = build_model("tupe_a_tiny", dictionary, attention_dropout=0.0).eval()
    folds = []
    monkeypatch.setattr(PositionalTerm, "folded", lambda term, memory=None: folds.append(1) or term)
    with torch.no_grad():
        model(random_tokens(dictionary, [7, 5, 3]), features_only=True)
    assert folds == []
