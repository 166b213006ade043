"""Saving, loading and the RoBERTa hub interface (encode / extract_features / predict)."""

import pytest
import torch
from conftest import PRESETS, build_model, random_tokens
from fairseq import checkpoint_utils

from tupe_plugin.models import TupeRobertaModel
from tupe_plugin.models.hub import MASK

@pytest.mark.parametrize("preset", PRESETS)
def test_save_then_load_gives_identical_outputs(preset, dictionary, tmp_path):
    model = build_model(f"{preset}_tiny", dictionary).eval()
    path = tmp_path / "model.pt"
    torch.save({"args": model.args, "model": model.state_dict()}, path)
    state = torch.load(path)
    loaded = build_model(state["args"].arch, dictionary, **{
        k: v for k, v in vars(state["args"]).items() if k != "arch"
    }).eval()
    loaded.load_state_dict(state["model"], strict=True)
    tokens = random_tokens(dictionary, [10, 6])
    with torch.no_grad():
        assert torch.equal(model(tokens)[0], loaded(tokens)[0])


def test_hub_encode_extract_features_and_predict(pretrained_dir):
    hub = TupeRobertaModel.from_pretrained(
        str(pretrained_dir / "checkpoints"), "checkpoint_last.pt",
        str(pretrained_dir / "data-bin"),
    ).eval()
    tokens = hub.encode("a gripping , funny film", "not at all")
    assert tokens[0] == hub.task.source_dictionary.bos()
    assert hub.task.source_dictionary.unk() not in tokens.tolist()

    features = hub.extract_features(tokens)
    assert features.shape == (1, len(tokens), 128)
    layers = hub.extract_features(tokens, return_all_hiddens=True)
    assert len(layers) == 3 and torch.equal(layers[-1], features)

    hub.register_classification_head("sentiment", num_classes=2)
    assert hub.predict("sentiment", tokens).shape == (1, 2)


def test_hub_without_a_sentencepiece_model_says_where_it_looked(pretrained_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="sentencepiece_model=PATH"):
        TupeRobertaModel.from_pretrained(str(pretrained_dir / "checkpoints"),
                                         "checkpoint_last.pt", str(tmp_path))


def test_hub_output_equals_the_training_checkpoint_model(pretrained_dir):
    checkpoint = str(pretrained_dir / "checkpoints" / "checkpoint_last.pt")
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": str(pretrained_dir / "data-bin")}
    )
    hub = TupeRobertaModel.from_pretrained(
        str(pretrained_dir / "checkpoints"), "checkpoint_last.pt",
        str(pretrained_dir / "data-bin"),
    ).eval()
    tokens = hub.encode("an engaging story")
    with torch.no_grad():
        expected = models[0].eval()(tokens[None], features_only=True)[0]
    torch.testing.assert_close(hub.extract_features(tokens), expected)


def test_hub_is_returned_in_eval_mode_and_two_calls_agree_exactly(pretrained_dir):
    hub = TupeRobertaModel.from_pretrained(
        str(pretrained_dir / "checkpoints"), "checkpoint_last.pt", str(pretrained_dir / "data-bin"),
    )
    assert not hub.training and not hub.model.training
    tokens = hub.encode("two identical calls give identical features")
    assert torch.equal(hub.extract_features(tokens), hub.extract_features(tokens))
    with torch.no_grad():
        first = hub.model(tokens[None], features_only=True, need_attn=True)[1]["attn"]
        second = hub.model(tokens[None], features_only=True, need_attn=True)[1]["attn"]
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_fill_mask_returns_k_tokens_each_with_its_own_probability_when_eos_is_on_top(pretrained_dir):
    hub = TupeRobertaModel.from_pretrained(
        str(pretrained_dir / "checkpoints"), "checkpoint_last.pt", str(pretrained_dir / "data-bin"),
    )
    dictionary = hub.task.source_dictionary
    with torch.no_grad():  # </s> the most probable token at every position, <s> the third
        hub.model.encoder.lm_head.bias[dictionary.eos()] += 100.0
        hub.model.encoder.lm_head.bias[dictionary.bos()] += 99.0
    text = "the game was <mask> in the north"
    pieces = f" {MASK} ".join(hub.bpe.encode(span.rstrip()) for span in text.split(MASK)).strip()
    tokens = dictionary.encode_line(f"<s> {pieces} </s>", append_eos=False, add_if_not_exist=False).long()
    with torch.no_grad():
        logits = hub.model(tokens[None])[0][0, tokens.tolist().index(hub.task.mask_idx)]
    expected = logits.softmax(dim=-1).topk(5)
    assert dictionary.eos() == expected.indices[0] and dictionary.bos() in expected.indices
    filled = hub.fill_mask(text, topk=5)
    assert len(filled) == 5
    for (sentence, probability, token), index, softmax in zip(filled, expected.indices.tolist(),
                                                                expected.values.tolist()):
        assert token.strip() == hub.bpe.decode(dictionary[index])
        assert probability == pytest.approx(softmax, rel=1e-6)
        assert sentence == text.replace(f" {MASK}", token)
