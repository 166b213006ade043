import pytest
import torch
from conftest import PRESETS, build_model, random_tokens


@pytest.mark.parametrize("preset", PRESETS)
def test_padded_keys_receive_zero_attention(preset, dictionary):
    model = build_model(f"{preset}_tiny", dictionary)
    tokens = random_tokens(dictionary, [6, 3])
    _, extra = model(tokens, features_only=True, need_attn=True)
    for probs in extra["attn"]:
        assert torch.all(probs[1, :, :, 3:] == 0)
        torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))


@pytest.mark.parametrize("preset", PRESETS)
def test_padding_does_not_change_the_outputs_of_real_tokens(preset, dictionary):
    # eval mode: the two forwards compared are the same function even for an encoding that samples its
    # positions in training
    model = build_model(f"{preset}_tiny", dictionary).eval()
    batch = random_tokens(dictionary, [9, 4])
    alone = batch[1:, :4]
    in_batch = model(batch, features_only=True)[0][1, :4]
    torch.testing.assert_close(in_batch, model(alone, features_only=True)[0][0], atol=1e-5, rtol=1e-5)


def test_left_padded_input_is_refused_with_a_clear_error(dictionary):
    model = build_model("tupe_r_tiny", dictionary)
    tokens = random_tokens(dictionary, [5, 3]).flip(1)
    with pytest.raises(ValueError, match="right-padded"):
        model(tokens)
