"""A converted Hugging Face model against transformers' own forward: the plugin ids of HF ids, and every
hidden state and the MLM logits compared on the real (unpadded) positions of a batch."""

import torch


def plugin_ids(root, hf_ids):
    """(the plugin ids of ``hf_ids``, plugin id -> HF id) of the conversion written to ``root / "out"``."""
    order = torch.load(root / "out" / "model.pt", weights_only=False)["extra_state"]["hf_token_ids"]
    inverse = torch.full((max(order) + 1,), -1, dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return inverse[hf_ids], torch.tensor(order)


def assert_equal_to_transformers(hf_model, hub, tokens, hf_ids, mask, order):
    """Every hidden state and the MLM logits (columns in plugin id order) equal transformers' to 1e-5."""
    with torch.no_grad():
        expected = hf_model(input_ids=hf_ids, attention_mask=mask, output_hidden_states=True)
        logits, extra = hub.model(tokens, return_all_hiddens=True)
    real = mask.bool()
    assert len(extra["inner_states"]) == len(expected.hidden_states)
    for ours, theirs in zip(extra["inner_states"], expected.hidden_states):
        torch.testing.assert_close(ours.transpose(0, 1)[real], theirs[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[real], expected.logits[..., order][real], atol=1e-5, rtol=1e-5)
