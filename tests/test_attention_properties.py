"""Property test: for drawn shapes, padding patterns and position flags, the fused encoder equals the
step-by-step paper equations (tests/paper_equations.py) in fp32, forward, to 1e-5."""

import torch
from conftest import PRESETS, build_model, make_dictionary, random_tokens
from hypothesis import given, settings
from hypothesis import strategies as st
from paper_equations import encoder_features

DICTIONARY = make_dictionary()


@st.composite
def encoders_and_batches(draw):
    preset = draw(st.sampled_from(PRESETS))
    flags = dict(
        encoder_normalize_before=draw(st.booleans()),
        encoder_attention_heads=draw(st.sampled_from([1, 2, 4, 8])),
        shaw_max_distance=draw(st.integers(1, 6)),
        shaw_keys_only=draw(st.booleans()),
        rel_pos_buckets=draw(st.sampled_from([4, 8, 32])),
    )
    flags["rel_pos_max_distance"] = draw(st.integers(flags["rel_pos_buckets"] // 4 + 1, 128))
    lengths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    return preset, flags, lengths, draw(st.integers(0, 2**16))


@settings(max_examples=30, deadline=None)
@given(encoders_and_batches())
def test_fused_attention_equals_the_paper_equations(drawn):
    preset, flags, lengths, seed = drawn
    torch.manual_seed(seed)
    model = build_model(f"{preset}_tiny", DICTIONARY, **flags).eval()
    tokens = random_tokens(DICTIONARY, lengths, seed=seed)
    keep = tokens.ne(DICTIONARY.pad()).unsqueeze(-1)
    with torch.no_grad():
        fused = model(tokens, features_only=True)[0]
        plain = encoder_features(model.encoder.sentence_encoder, tokens)
    torch.testing.assert_close(fused * keep, plain * keep, atol=1e-5, rtol=1e-5)
