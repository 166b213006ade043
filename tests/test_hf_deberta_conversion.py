"""tupe-convert-hf on DeBERTa: tiny random-weight DebertaForMaskedLM (v1) and DebertaV2ForMaskedLM (v2/v3
settings) built and saved here with ``transformers``, converted into plugin ``deberta_*`` checkpoints, and
compared with transformers' own forward (every hidden state and the MLM logits, padded batch)."""

import io
import json
import logging

import pytest
import sentencepiece
import torch
import transformers
from conftest import build_model, test_data
from fairseq.data import Dictionary
from hf_comparison import assert_equal_to_transformers, plugin_ids

from tupe_plugin.conversion import hf_cli
from tupe_plugin.conversion.hf import HfCheckpointError
from tupe_plugin.conversion.hf_deberta import convert_any
from tupe_plugin.models import TupeRobertaModel

SIZE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-7,
            relative_attention=True, pos_att_type=["c2p", "p2c"], max_position_embeddings=16)
LENGTHS = (16, 9, 3)
CHARS = list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "."]
MERGES = ["Ġ t", "h e", "Ġt he", "a t", "Ġ c", "Ġc at"]
V1_TOKENS = (["[PAD]", "[CLS]", "[SEP]", "[UNK]"] + CHARS + [m.replace(" ", "") for m in MERGES]
             + [f"w{i}" for i in range(30)] + ["[MASK]"])
V1_VARIANTS = {
    "v1 (released: no input positions, distances clipped at 6)": dict(position_biased_input=False,
                                                                      max_relative_positions=6),
    "v1 with input positions, current MLM head": dict(position_biased_input=True, legacy=False),
}
V2_VARIANTS = {
    "v3 (log buckets, shared projections, normalised table)": dict(
        position_buckets=8, max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm",
        position_biased_input=False),
    "v2 (own biased projections, input positions with token types)": dict(
        max_relative_positions=6, share_att_key=False, position_biased_input=True, type_vocab_size=2),
}
UNUSED_ROWS = 3  # DeBERTa-v2/v3 pads the embedding past the tokenizer's tokens


def randomize(model):
    """Weights far from their initialisation, biases and LayerNorms included."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            gain = name.endswith("LayerNorm.weight")
            parameter.copy_(torch.randn_like(parameter) * (0.3 if parameter.dim() > 1 else 0.5) + gain)


def save_v1(folder, **config):
    torch.manual_seed(0)
    model = transformers.DebertaForMaskedLM(transformers.DebertaConfig(
        vocab_size=len(V1_TOKENS), pad_token_id=0, type_vocab_size=0, **dict(SIZE, **config)))
    randomize(model)
    model.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(V1_TOKENS)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(merge + "\n" for merge in MERGES))
    return model.eval(), len(V1_TOKENS) - 1


def sentencepiece_model():
    """A small unigram model trained on the wikitext excerpt, [PAD] [CLS] [SEP] [UNK] at ids 0-3 as in
    DeBERTa-v2/v3's spm.model."""
    with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()][:300]
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=proto, vocab_size=120, model_type="unigram",
        pad_id=0, pad_piece="[PAD]", bos_id=1, bos_piece="[CLS]", eos_id=2, eos_piece="[SEP]", unk_id=3,
        unk_piece="[UNK]", hard_vocab_limit=False, minloglevel=2)
    return proto.getvalue()


def save_v2(folder, **config):
    proto = sentencepiece_model()
    pieces = sentencepiece.SentencePieceProcessor(model_proto=proto).get_piece_size()
    torch.manual_seed(1)
    model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(
        vocab_size=pieces + 1 + UNUSED_ROWS, pad_token_id=0, **dict(dict(SIZE, type_vocab_size=0), **config)))
    randomize(model)
    model.save_pretrained(folder)
    (folder / "spm.model").write_bytes(proto)
    return model.eval(), pieces  # [MASK] right after the pieces


def hf_batch(mask_id, seed=0):
    """(B, T) HF ids, right-padded with [PAD] 0, rows [CLS] ... [SEP] with a [MASK]; the attention mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.zeros((len(LENGTHS), max(LENGTHS)), dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = torch.randint(4, mask_id, (length,), generator=generator)
        ids[row, 0], ids[row, length - 1], ids[row, length // 2] = 1, 2, mask_id
    return ids, ids.ne(0).long()


def converted(tmp_path_factory, save, config):
    root = tmp_path_factory.mktemp("deberta")
    hf_model, mask_id = save(root / "hf", **config)
    convert_any(str(root / "hf"), str(root / "out"))
    return hf_model, mask_id, root


def converted_equals_transformers(hf_model, mask_id, root, bpe):
    hf_ids, mask = hf_batch(mask_id)
    tokens, order = plugin_ids(root, hf_ids)
    hub = TupeRobertaModel.from_pretrained(str(root / "out"), bpe=bpe)
    assert tokens[2, 3:].eq(hub.task.source_dictionary.pad()).all()
    assert_equal_to_transformers(hf_model, hub, tokens, hf_ids, mask, order)
    return hub


@pytest.mark.parametrize("variant", sorted(V1_VARIANTS))
def test_deberta_v1_hidden_states_and_mlm_logits_equal_transformers(variant, tmp_path_factory):
    hf_model, mask_id, root = converted(tmp_path_factory, save_v1, V1_VARIANTS[variant])
    hub = converted_equals_transformers(hf_model, mask_id, root, "hf_byte_bpe")
    config = hub.model.encoder.sentence_encoder.config
    assert (config.deberta_p2c, config.deberta_rel_proj_bias) == ("released", "query")


@pytest.mark.parametrize("variant", sorted(V2_VARIANTS))
def test_deberta_v2_v3_hidden_states_and_mlm_logits_equal_transformers(variant, tmp_path_factory):
    hf_model, mask_id, root = converted(tmp_path_factory, save_v2, V2_VARIANTS[variant])
    converted_equals_transformers(hf_model, mask_id, root, "sentencepiece")


def test_deberta_v3_text_is_encoded_with_its_sentencepiece_pieces(tmp_path):
    save_v2(tmp_path / "hf", **V2_VARIANTS["v3 (log buckets, shared projections, normalised table)"])
    convert_any(str(tmp_path / "hf"), str(tmp_path / "out"))
    hub = TupeRobertaModel.from_pretrained(str(tmp_path / "out"), bpe="sentencepiece")
    text = "The game began development in 2010 ."
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "hf" / "spm.model"))
    expected, _ = plugin_ids(tmp_path, torch.tensor([1] + processor.encode(text) + [2]))
    assert torch.equal(hub.encode(text), expected)


TEXT = "The Game began, in 2010 (as planned)."


def test_deberta_v3_text_is_encoded_as_transformers_deberta_v2_tokenizer_encodes_it(tmp_path):
    save_v2(tmp_path / "hf", **V2_VARIANTS["v3 (log buckets, shared projections, normalised table)"])
    convert_any(str(tmp_path / "hf"), str(tmp_path / "out"))
    hub = TupeRobertaModel.from_pretrained(str(tmp_path / "out"), bpe="sentencepiece")
    hf_ids = transformers.DebertaV2Tokenizer.from_pretrained(str(tmp_path / "hf"))(TEXT)["input_ids"]
    expected, _ = plugin_ids(tmp_path, torch.tensor(hf_ids))
    assert torch.equal(hub.encode(TEXT), expected)


@pytest.mark.parametrize("option, does", [("do_lower_case", "lowercases the text"),
                                          ("split_by_punct", "splits the text at every punctuation mark")])
def test_a_deberta_v2_tokenizer_that_changes_the_text_is_refused_naming_the_option(option, does, tmp_path):
    """transformers' DebertaV2Tokenizer applies the option before the sentencepiece model: the same text
    gets other ids than the model alone gives (checked here), which the converted model would encode."""
    save_v2(tmp_path / "hf", **V2_VARIANTS["v3 (log buckets, shared projections, normalised table)"])
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({option: True}))
    plain = transformers.DebertaV2Tokenizer.from_pretrained(str(tmp_path / "hf"), **{option: False})(TEXT)
    changed = transformers.DebertaV2Tokenizer.from_pretrained(str(tmp_path / "hf"))(TEXT)
    assert changed["input_ids"] != plain["input_ids"]
    with pytest.raises(HfCheckpointError, match=f"^tokenizer_config.json: {option} = True: DeBERTa-v2's "
                       f"tokenizer {does} before its sentencepiece model and the converted model's --bpe "
                       f"sentencepiece does not .* to convert anyway, set {option} to false in "
                       "tokenizer_config.json"):
        convert_any(str(tmp_path / "hf"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_log_says_the_converted_model_clips_distances_as_microsofts_code(tmp_path, caplog):
    save_v2(tmp_path / "hf", **V2_VARIANTS["v3 (log buckets, shared projections, normalised table)"])
    with caplog.at_level(logging.INFO, logger="convert_hf"):
        convert_any(str(tmp_path / "hf"), str(tmp_path / "out"))
    assert "clips distances to 16 - 1 before the log buckets, as Microsoft's DeBERTa code" in caplog.text
    assert f"{UNUSED_ROWS} rows of the word embeddings belong to no token" in caplog.text


@pytest.mark.parametrize("field, value, message", [
    ("relative_attention", False, "relative_attention = False is not supported"),
    ("pos_att_type", ["c2p"], "pos_att_type = \\['c2p'\\] is not supported"),
    ("talking_head", True, "talking_head = True is not supported"),
    ("conv_kernel_size", 3, "conv_kernel_size = 3 is not supported"),
    ("embedding_size", 16, "embedding_size = 16 is not supported"),
])
def test_a_deberta_the_plugin_cannot_build_is_refused_naming_the_field(field, value, message, tmp_path):
    save_v1(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config[field] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HfCheckpointError, match=message):
        convert_any(str(tmp_path / "hf"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("save, field, value, table", [
    (save_v1, "max_relative_positions", 10**12, "relative table"),
    (save_v2, "position_buckets", 10**12, "relative table"),
    (save_v1, "max_position_embeddings", 10**12, "position table"),
])
def test_a_deberta_size_past_memory_is_refused_naming_the_field_before_allocating(save, field, value, table,
                                                                                    tmp_path):
    """Sizes that would need TiB of table on any machine (was: an allocation of that size, or an abort)."""
    save(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config[field] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HfCheckpointError, match=f"config.json: {field} = {value} would need a .* GiB "
                       f"{table}.*, more than the .* GiB of memory of this machine: a typo\\? .*: "
                       f"correct {field}$"):
        convert_any(str(tmp_path / "hf"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_deberta_v2_folder_without_spm_model_names_the_file(tmp_path):
    save_v2(tmp_path / "hf", **V2_VARIANTS["v3 (log buckets, shared projections, normalised table)"])
    (tmp_path / "hf" / "spm.model").unlink()
    with pytest.raises(SystemExit) as exited:
        hf_cli.main(["--hf-model", str(tmp_path / "hf"), "--out", str(tmp_path / "out")])
    assert "has no spm.model, the sentencepiece model of DeBERTa-v2/v3's tokenizer" in str(exited.value.code)


def test_a_converted_deberta_v3_starts_a_swap_to_tupe_r_with_its_layers_and_embeddings(tmp_path, caplog):
    """The swap protocol of Wang et al. (--init-from-checkpoint) from a DeBERTa-v3: every tensor both models
    have is copied, DeBERTa's relative table is dropped, TUPE-R's position parameters start fresh."""
    save_v2(tmp_path / "hf", **V2_VARIANTS["v3 (log buckets, shared projections, normalised table)"])
    path = convert_any(str(tmp_path / "hf"), str(tmp_path / "out"))
    dictionary = Dictionary.load(str(tmp_path / "out" / "dict.txt"))
    dictionary.add_symbol("<mask>")
    with caplog.at_level(logging.INFO):
        swapped = build_model("tupe_r_tiny", dictionary, max_positions=16, init_from_checkpoint=path,
                              encoder_layers=2, encoder_embed_dim=32, encoder_attention_heads=4,
                              encoder_ffn_embed_dim=64)
    saved = torch.load(path, weights_only=False)["model"]
    ours = swapped.state_dict()
    for key in ("encoder.sentence_encoder.embed_tokens.weight", "encoder.lm_head.dense.weight",
                "encoder.sentence_encoder.layers.1.self_attn.in_proj.weight",
                "encoder.sentence_encoder.layers.1.final_layer_norm.bias"):
        assert torch.equal(ours[key], saved[key])
    assert "positional_term.disentangled" in caplog.text and swapped.args.layer_norm_eps == 1e-7
