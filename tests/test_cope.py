"""CoPE (Golovneva, Wang, Weston, Sukhbaatar, arXiv 2405.18719): the keys up to the query against the
authors' released equations (facebookresearch/RAM, ``ContextPosSelfAttn.forward`` under its causal mask,
restated below), the keys after it by their own definition, padding, the clip, gradients, training, the
paper twin with a table that is not zeros, and the kernels that refuse it."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_equals_the_twin, build_model, random_tokens
from tupe_plugin.encodings.cope_position import ContextualPositions, contextual_positions
from tupe_plugin.encodings.position_config import PositionFlagError

BATCH, HEADS, LENGTH, HEAD_DIM = 2, 3, 8, 16


def released_cope(query, key, pos_emb, attn_mask):
    """The released CoPE attention logits with its default flags, restated: query and key (B*h, L, d),
    ``pos_emb`` (1, d, npos), ``attn_mask`` a 0/1 float (B*h or 1, L, L). Returns (positions, position
    logits, attention logits before the mask's log), each (B*h, L, L).

    gates = sigmoid(q k^T / sqrt(d)) * mask; positions = the reverse cumulative sum of the gates along the
    keys, clamped to npos - 1; position logits = q pos_emb gathered at ceil and floor of the positions and
    mixed by w = p - floor(p); attention logits = (q k^T + position logits) / sqrt(d)."""
    npos, dim = pos_emb.size(-1), query.size(-1)
    gate_logits = query @ key.transpose(-1, -2)
    gates = torch.sigmoid(gate_logits / math.sqrt(dim)) * attn_mask
    positions = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)
    fixed = query @ pos_emb
    ceil, floor = positions.ceil().long(), positions.floor().long()
    weight = positions - floor
    pos_logits = fixed.gather(-1, ceil) * weight + fixed.gather(-1, floor) * (1 - weight)
    return positions, pos_logits, (gate_logits + pos_logits) / math.sqrt(dim)


def _inputs(seed=0):
    """q, k (B, H, T, d_h) and the scaled logits q . k / sqrt(d_h), spread enough for gates of 0.1 to 0.9."""
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, generator=generator) * 1.5 for _ in range(2))
    return q, k, q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)


def _layer(max_position, seed=1):
    layer = ContextualPositions(HEAD_DIM, max_position)
    with torch.no_grad():
        layer.table.copy_(torch.randn(layer.table.shape, generator=torch.Generator().manual_seed(seed)))
    return layer


def _gates(logits, padding=None):
    gates = torch.sigmoid(logits)
    return gates if padding is None else gates.masked_fill(padding[:, None, None, :], 0.0)


def _upto_query():
    return torch.ones(LENGTH, LENGTH).tril().bool()


@pytest.mark.parametrize("max_position", [LENGTH, 2])  # 2: the clip reached
def test_keys_up_to_the_query_get_the_released_positions_and_logits(max_position):
    q, k, logits = _inputs()
    layer = _layer(max_position)
    pos_emb = layer.table.detach().t()[None]  # the released (1, d, npos) layout
    causal = torch.ones(LENGTH, LENGTH).tril()[None]
    positions, pos_logits, attention = released_cope(q.flatten(0, 1), k.flatten(0, 1), pos_emb, causal)
    keep = _upto_query()

    ours = contextual_positions(_gates(logits)).clamp(max=max_position).flatten(0, 1)
    added = layer(logits, q, k, None, None).detach().flatten(0, 1)
    torch.testing.assert_close(ours[:, keep], positions[:, keep], atol=1e-6, rtol=0)
    torch.testing.assert_close(added[:, keep] * math.sqrt(HEAD_DIM), pos_logits[:, keep], atol=1e-6, rtol=0)
    torch.testing.assert_close((logits.flatten(0, 1) + added)[:, keep], attention[:, keep], atol=1e-6, rtol=0)


def test_keys_after_the_query_count_the_gates_from_the_query_to_the_key():
    _, _, logits = _inputs()
    gates = _gates(logits)
    positions = contextual_positions(gates)
    for i in range(LENGTH):
        for j in range(i + 1, LENGTH):
            torch.testing.assert_close(positions[..., i, j], gates[..., i, i: j + 1].sum(-1))


def test_the_query_counts_its_own_gate_once():
    _, _, logits = _inputs()
    gates = _gates(logits)
    torch.testing.assert_close(contextual_positions(gates).diagonal(0, -2, -1), gates.diagonal(0, -2, -1))


def _padding():
    padding = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    padding[1, 5:] = True
    return padding


def test_padded_keys_get_no_gate():
    q, k, logits = _inputs()
    layer = _layer(LENGTH)
    padded = layer(logits, q, k, None, _padding())
    positions = contextual_positions(_gates(logits, _padding()))
    # no count grows past the last real key: every padded key is as far as it
    assert positions[1, :, :5, 5:].sub(positions[1, :, :5, 4:5]).abs().max() == 0
    torch.testing.assert_close(padded[1, :, :5, 5:], padded[1, :, :5, 4:5].expand(-1, -1, 3))


def test_the_real_pairs_of_a_padded_row_are_those_of_the_row_alone():
    q, k, logits = _inputs()
    layer = _layer(LENGTH)
    padded = layer(logits, q, k, None, _padding())
    alone = layer(logits[1:, :, :5, :5], q[1:, :, :5], k[1:, :, :5], None, None)
    torch.testing.assert_close(padded[1:, :, :5, :5], alone, atol=1e-6, rtol=0)


def test_positions_are_clipped_to_the_largest_position():
    q, k, _ = _inputs()
    layer = _layer(2)
    open_gates = torch.full((BATCH, HEADS, LENGTH, LENGTH), 30.0)  # every gate 1: p_ij = |i - j| + 1
    added = layer(open_gates, q, k, None, None)
    expected = q @ layer.table.t() / math.sqrt(HEAD_DIM)  # z of the positions 0, 1, 2
    offsets = (torch.arange(LENGTH)[None] - torch.arange(LENGTH)[:, None]).abs()
    torch.testing.assert_close(added, expected.gather(-1, (offsets + 1).clamp(max=2).expand_as(added)))


def test_gradients_reach_the_table_and_the_gates():
    q, k, logits = _inputs()
    layer = _layer(LENGTH)
    logits.requires_grad_(True)
    layer(logits, q, k, None, None).square().sum().backward()
    assert layer.table.grad.abs().sum() > 0
    assert logits.grad.abs().sum() > 0


def _random_tables(model):
    with torch.no_grad():
        for layer in model.encoder.sentence_encoder.layers:
            layer.self_attn.layer_terms["cope"].table.normal_()


def test_each_layer_holds_its_own_table_of_max_position_plus_one_rows_at_zero(dictionary):
    model = build_model("bert_cope_tiny", dictionary, max_positions=32)
    tables = [layer.self_attn.layer_terms["cope"].table for layer in model.encoder.sentence_encoder.layers]
    assert len({id(table) for table in tables}) == len(tables) == model.args.encoder_layers
    assert all(table.shape == (513, model.args.encoder_embed_dim // model.args.encoder_attention_heads)
               and not table.any() for table in tables)
    assert build_model("bert_cope_tiny", dictionary, cope_max_position=5).encoder.sentence_encoder.layers[0] \
        .self_attn.layer_terms["cope"].table.size(0) == 6


@pytest.mark.parametrize("normalize_before", [False, True])
def test_a_model_with_random_tables_equals_the_paper_twin(normalize_before, dictionary):
    model = build_model("bert_cope_tiny", dictionary, encoder_normalize_before=normalize_before,
                        cope_max_position=3)
    _random_tables(model)
    assert_equals_the_twin(model, dictionary, lengths=(7, 5, 3))


def _as_bert_nope(model, dictionary):
    """bert_nope with ``model``'s weights (all but its CoPE tables)."""
    nope = build_model("bert_nope_tiny", dictionary)
    missing, unexpected = nope.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all("layer_terms.cope" in name for name in unexpected)
    return nope.eval()


def _features(model, tokens):
    keep = tokens.ne(model.encoder.dictionary.pad())[..., None]
    with torch.no_grad():
        return model.eval()(tokens, features_only=True)[0] * keep


def test_one_training_step_moves_the_tables_and_the_features_away_from_bert_nope(dictionary):
    """At zero tables CoPE adds nothing: bert_nope with the same weights has the same features. One step of
    training moves every layer's table, and then the features differ from that bert_nope's."""
    tokens = random_tokens(dictionary, [7, 5, 3])
    model = build_model("bert_cope_tiny", dictionary)
    torch.testing.assert_close(_features(model, tokens), _features(_as_bert_nope(model, dictionary), tokens))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    logits = model.train()(tokens)[0]
    F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), ignore_index=dictionary.pad()).backward()
    optimizer.step()
    tables = [layer.self_attn.layer_terms["cope"].table for layer in model.encoder.sentence_encoder.layers]
    assert all(table.any() for table in tables)
    difference = _features(model, tokens) - _features(_as_bert_nope(model, dictionary), tokens)
    assert difference.abs().max() > 1e-4


@pytest.mark.parametrize("backend", ["triton", "flex", "cudnn-graph"])
def test_a_kernel_backend_is_refused_naming_cope(backend, dictionary):
    with pytest.raises(PositionFlagError, match=rf"--attention-backend {backend} computes no term of a "
                                                r"layer's own logits \(CoPE\)"):
        build_model("bert_cope_tiny", dictionary, attention_backend=backend)


@pytest.mark.parametrize("max_position", [0, -1])
def test_a_max_position_below_one_is_refused(dictionary, max_position):
    with pytest.raises(PositionFlagError, match=f"--cope-max-position must be >= 1, got {max_position}"):
        build_model("bert_cope_tiny", dictionary, cope_max_position=max_position)


def test_the_max_position_without_cope_is_refused(dictionary):
    with pytest.raises(PositionFlagError,
                       match="--cope-max-position is an option of CoPE; add --rel-pos cope"):
        build_model("bert_nope_tiny", dictionary, cope_max_position=8)


def test_the_table_keeps_its_shape_whatever_the_max_positions(dictionary):
    shapes = {build_model("bert_cope_tiny", dictionary, max_positions=length).encoder.sentence_encoder
              .layers[0].self_attn.layer_terms["cope"].table.shape for length in (32, 256)}
    assert len(shapes) == 1


def test_the_export_refuses_cope_in_one_line(dictionary):
    from tupe_plugin.conversion.hf_export import ExportError, check_exportable

    args = build_model("bert_cope_tiny", dictionary).args
    with pytest.raises(ExportError, match=r"^model.pt: CoPE \(--rel-pos cope\) cannot be exported: [^\n]*$"):
        check_exportable(args, "model.pt")
