"""DeBERTa's Enhanced Mask Decoder (He et al. 2021, arXiv 2006.03654, §3.2; --deberta-emd): the masked-LM
logits and every gradient against the paper twin, the features it leaves alone, and checkpoints with it.
Its refusals are in test_deberta.py."""

import pytest
import torch
from conftest import assert_gradients_close, build_model, features_and_grads, random_tokens
from paper_equations import masked_lm_logits
from tupe_plugin.models.checkpoint_guards import CheckpointMismatchError
from tupe_plugin.attention import cpu_kernels, paths

LENGTHS = [7, 5, 3]


def logits_and_twin(model, dictionary):
    """The model's masked-LM logits and the twin's, with every gradient of a random weighting of them,
    padded positions left out."""
    tokens = random_tokens(dictionary, LENGTHS)
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    weights = torch.randn(*tokens.shape, len(dictionary)) * keep
    fused = features_and_grads(model, tokens, weights, lambda t: model(t)[0])
    plain = features_and_grads(model, tokens, weights, lambda t: masked_lm_logits(model, t))
    return keep, fused, plain


@pytest.mark.parametrize("flags", [
    {},
    {"encoder_normalize_before": True},
    {"deberta_emd_layers": 1, "deberta_share_att_key": True, "deberta_max_distance": 2},
    {"deberta_emd_layers": 3, "deberta_buckets": 4, "deberta_max_distance": 5,
     "encoder_normalize_before": True},
])
def test_masked_lm_logits_and_gradients_equal_the_paper_twin(flags, dictionary):
    model = build_model("deberta_emd_tiny", dictionary, **flags)
    keep, (fused, fused_grads), (plain, plain_grads) = logits_and_twin(model, dictionary)
    torch.testing.assert_close(fused * keep, plain * keep, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, plain_grads)
    assert "encoder.sentence_encoder.enhanced_mask_decoder.embed_positions.weight" in fused_grads


@pytest.mark.parametrize("normalize_before", [False, True])
def test_biased_flash_path_runs_the_decoder_passes_and_equals_the_paper_twin(normalize_before, dictionary,
                                                                            monkeypatch):
    monkeypatch.setattr(paths, "EXPLICIT_MAX_LENGTH_PER_HEAD_DIM", 0)
    calls = []
    original = cpu_kernels.BiasedFlashAttention.apply
    monkeypatch.setattr(cpu_kernels.BiasedFlashAttention, "apply",
                        lambda *args: calls.append(1) or original(*args))
    model = build_model("deberta_emd_tiny", dictionary, encoder_normalize_before=normalize_before)
    keep, (fused, fused_grads), (plain, plain_grads) = logits_and_twin(model, dictionary)
    assert len(calls) == model.args.encoder_layers + model.args.deberta_emd_layers
    torch.testing.assert_close(fused * keep, plain * keep, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, plain_grads)


@pytest.mark.parametrize("normalize_before", [False, True])
def test_features_and_hidden_states_are_those_of_the_model_without_the_decoder(normalize_before, dictionary):
    model = build_model("deberta_emd_tiny", dictionary, encoder_normalize_before=normalize_before).eval()
    plain = build_model("deberta_tiny", dictionary, encoder_normalize_before=normalize_before).eval()
    state = model.state_dict()
    del state["encoder.sentence_encoder.enhanced_mask_decoder.embed_positions.weight"]
    plain.load_state_dict(state)
    tokens = random_tokens(dictionary, LENGTHS)
    with torch.no_grad():
        features, extra = model(tokens, features_only=True, return_all_hiddens=True)
        expected, expected_extra = plain(tokens, features_only=True, return_all_hiddens=True)
        _, masked_lm_extra = model(tokens, return_all_hiddens=True)
        assert not torch.allclose(model(tokens)[0], plain(tokens)[0])
    assert torch.equal(features, expected)
    for states in (extra["inner_states"], masked_lm_extra["inner_states"]):
        assert all(torch.equal(a, b) for a, b in zip(states, expected_extra["inner_states"], strict=True))


def test_one_pass_without_positions_is_the_last_layer_again(dictionary):
    """Q_0 = H with P = 0: a single pass reads its queries, keys and values from H, as the last layer does."""
    model = build_model("deberta_emd_tiny", dictionary, deberta_emd_layers=1).eval()
    tokens = random_tokens(dictionary, LENGTHS)
    with torch.no_grad():
        model.encoder.sentence_encoder.enhanced_mask_decoder.embed_positions.weight.zero_()
        decoded = model.encoder.extract_features(tokens, masked_lm=True)[0]
        features = model(tokens, features_only=True)[0]
    torch.testing.assert_close(decoded, features, atol=1e-6, rtol=1e-6)


def test_checkpoint_round_trip_keeps_the_decoder(dictionary, tmp_path):
    model = build_model("deberta_tiny", dictionary, deberta_emd=True, deberta_emd_layers=3).eval()
    path = tmp_path / "model.pt"
    torch.save({"args": model.args, "model": model.state_dict()}, path)
    state = torch.load(path)
    loaded = build_model(state["args"].arch, dictionary, **{
        key: value for key, value in vars(state["args"]).items() if key != "arch"}).eval()
    loaded.load_state_dict(state["model"], strict=True)
    tokens = random_tokens(dictionary, LENGTHS)
    assert loaded.encoder.sentence_encoder.enhanced_mask_decoder.passes == 3
    with torch.no_grad():
        assert torch.equal(model(tokens)[0], loaded(tokens)[0])


@pytest.mark.parametrize("arch, flags, message", [
    ("deberta_tiny", {}, "missing encoder.sentence_encoder.enhanced_mask_decoder.embed_positions.weight"),
    ("deberta_emd_tiny", {"max_positions": 16},
     "has 32 positions but the model is built for --max-positions 16"),
])
def test_a_checkpoint_that_does_not_fit_the_decoder_is_refused_by_name(arch, flags, message, dictionary):
    source = build_model(arch, dictionary)
    target = build_model("deberta_emd_tiny", dictionary, **flags)
    with pytest.raises(CheckpointMismatchError, match=message):
        target.load_state_dict(source.state_dict(), strict=True)
