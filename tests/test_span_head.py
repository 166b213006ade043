"""The span head on the model and the checks on checkpoints given to --restore-file."""

import pytest
import torch
from conftest import build_model, random_tokens


def test_span_head_gives_start_and_end_logits_per_token(dictionary):
    model = build_model("tupe_r_tiny", dictionary).eval()
    model.register_span_head("squad")
    tokens = random_tokens(dictionary, [12, 7])
    (start, end), _ = model(tokens, span_head_name="squad")
    assert start.shape == end.shape == tokens.shape
    features, _ = model(tokens, features_only=True)
    expected = model.span_heads["squad"].out_proj(features)
    torch.testing.assert_close(torch.stack([start, end], dim=-1), expected)


def test_span_head_is_added_when_fine_tuning_from_a_masked_lm_checkpoint(dictionary):
    pretrained = build_model("tupe_r_tiny", dictionary).state_dict()
    model = build_model("tupe_r_tiny", dictionary)
    model.register_span_head("squad")
    initial = {k: v.clone() for k, v in model.span_heads.state_dict().items()}
    model.load_state_dict(dict(pretrained))  # fairseq's load: upgrade_state_dict_named, then strict load
    for key, value in initial.items():
        assert torch.equal(model.span_heads.state_dict()[key], value)
    embed = "encoder.sentence_encoder.embed_tokens.weight"
    assert torch.equal(model.state_dict()[embed], pretrained[embed])


def test_fine_tuned_span_head_is_saved_and_loaded(dictionary):
    model = build_model("tupe_r_tiny", dictionary).eval()
    model.register_span_head("squad")
    torch.nn.init.normal_(model.span_heads["squad"].out_proj.weight)
    loaded = build_model("tupe_r_tiny", dictionary).eval()
    loaded.register_span_head("squad")
    loaded.load_state_dict(model.state_dict())
    tokens = random_tokens(dictionary, [9])
    torch.testing.assert_close(loaded(tokens, span_head_name="squad")[0],
                               model(tokens, span_head_name="squad")[0])


def test_span_head_absent_from_the_model_is_dropped_from_the_checkpoint(dictionary):
    model = build_model("tupe_r_tiny", dictionary)
    model.register_span_head("squad")
    plain = build_model("tupe_r_tiny", dictionary)
    plain.load_state_dict(model.state_dict())  # e.g. sentence_prediction from a SQuAD checkpoint
    assert len(plain.span_heads) == 0


@pytest.mark.parametrize("pretrained_arch", ["bert_a_tiny", "tupe_r_medium"])
def test_checkpoint_of_another_arch_names_the_arch(pretrained_arch, dictionary):
    pretrained = build_model(pretrained_arch, dictionary).state_dict()
    model = build_model("tupe_r_tiny", dictionary)
    with pytest.raises(ValueError,
                       match=r"the checkpoint does not fit --arch tupe_r_tiny \((missing|.* is )"):
        model.load_state_dict(pretrained)
