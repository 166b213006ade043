"""tupe-convert-hf: tiny random-weight BertForMaskedLM / RobertaForMaskedLM built and saved here with
``transformers``, converted, and compared with transformers' own forward (hidden states and MLM logits, padded
batch), its tokenizers, and the refusals."""

import json
import logging
import shutil
import struct

import pytest
import torch
import transformers
from cli import logged_losses, run_fairseq_steps
from conftest import test_data
from fairseq import checkpoint_utils
from hf_comparison import assert_equal_to_transformers, plugin_ids
from safetensors.torch import load_file, save_file

from tupe_plugin.conversion import hf_cli
from tupe_plugin.conversion.hf import HfCheckpointError, convert
from tupe_plugin.models import TupeRobertaModel

SIZE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# BERT's specials away from fairseq's ids 0-3, as in bert-base-uncased ([PAD] 0, [UNK] 100, [CLS] 101, ...)
BERT_TOKENS = (["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
               + ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", ".", ","]
               + list("bcdefghijklmnopqrstuvwxyz") + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
               + [f"w{i}" for i in range(30)])
BERT_MAX_POSITIONS = 16
ROBERTA_CHARS = list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "."]
ROBERTA_MERGES = ["Ġ t", "h e", "Ġt he", "a t", "Ġ c", "Ġc at", "Ġ s", "Ġs at", "Ġ m", "Ġm at"]
ROBERTA_TOKENS = (["<s>", "<pad>", "</s>", "<unk>"] + ROBERTA_CHARS
                  + [merge.replace(" ", "") for merge in ROBERTA_MERGES] + [f"w{i}" for i in range(50)]
                  + ["<mask>"])
ROBERTA_TABLE = 18  # rows, 16 positions after RoBERTa's offset of pad + 1 = 2
LENGTHS = (16, 9, 3)  # the longest fills the position table
TEXT = "the cat sat on the mat."


def save_bert(folder, **config):
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(BERT_TOKENS), max_position_embeddings=BERT_MAX_POSITIONS, pad_token_id=0,
        **dict(SIZE, **config)))
    _randomize(model)
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_text("".join(token + "\n" for token in BERT_TOKENS))
    return model.eval()


def save_roberta(folder, **config):
    torch.manual_seed(1)
    model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
        vocab_size=len(ROBERTA_TOKENS), max_position_embeddings=ROBERTA_TABLE, pad_token_id=1,
        type_vocab_size=1, **dict(SIZE, **config)))
    _randomize(model)
    model.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(ROBERTA_TOKENS)}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(merge + "\n" for merge in ROBERTA_MERGES))
    return model.eval()


def _randomize(model):
    """Weights far from their initialisation (LayerNorms, biases, the padding row included): a mapping that
    swapped two of them would show."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            gain = name.endswith(("LayerNorm.weight", "layer_norm.weight"))
            parameter.copy_(torch.randn_like(parameter) * (0.3 if parameter.dim() > 1 else 0.5) + gain)


def hf_batch(pad, cls, sep, vocab, seed=0):
    """(B, T) HF ids, right-padded, each row <cls> ... <sep>; and the attention mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(LENGTHS), max(LENGTHS)), pad)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = torch.randint(7, vocab - 1, (length,), generator=generator)
        ids[row, 0], ids[row, length - 1] = cls, sep
    return ids, ids.ne(pad).long()


def converted(tmp_path_factory, save, **config):
    root = tmp_path_factory.mktemp("hf")
    hf_model = save(root / "hf", **config)
    convert(str(root / "hf"), str(root / "out"))
    return hf_model, root


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return converted(tmp_path_factory, save_bert, layer_norm_eps=1e-5)


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    return converted(tmp_path_factory, save_roberta, layer_norm_eps=1e-5)


def test_bert_hidden_states_and_mlm_logits_equal_transformers_on_a_padded_batch(bert):
    hf_model, root = bert
    hf_ids, mask = hf_batch(pad=0, cls=4, sep=5, vocab=len(BERT_TOKENS))
    tokens, order = plugin_ids(root, hf_ids)
    hub = TupeRobertaModel.from_pretrained(str(root / "out"), bpe="bert")
    assert tokens[2, 3:].eq(hub.task.source_dictionary.pad()).all()  # fairseq's padding: by pad id
    assert_equal_to_transformers(hf_model, hub, tokens, hf_ids, mask, order)


def test_roberta_hidden_states_and_mlm_logits_equal_transformers_on_a_padded_batch(roberta):
    hf_model, root = roberta
    hf_ids, mask = hf_batch(pad=1, cls=0, sep=2, vocab=len(ROBERTA_TOKENS))
    tokens, order = plugin_ids(root, hf_ids)
    assert torch.equal(tokens, hf_ids)  # RoBERTa's ids are fairseq's
    hub = TupeRobertaModel.from_pretrained(str(root / "out"), bpe="hf_byte_bpe")
    assert_equal_to_transformers(hf_model, hub, tokens, hf_ids, mask, order)


def test_bert_specials_map_onto_fairseq_specials_by_id_and_dict_keeps_the_vocab_order(bert):
    _, root = bert
    lines = (root / "out" / "dict.txt").read_text().splitlines()
    others = [t for t in BERT_TOKENS if t not in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    assert [line.split()[0] for line in lines] == others
    _, order = plugin_ids(root, torch.tensor([0]))
    assert order[:4].tolist() == [4, 0, 5, 3] and order[-1] == 6  # <s> <pad> </s> <unk> ... <mask>


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_from_pretrained_encodes_text_as_the_hf_tokenizer(family, bert, roberta):
    _, root = bert if family == "bert" else roberta
    if family == "bert":
        tokenizer = transformers.BertTokenizer(str(root / "hf" / "vocab.txt"))
    else:
        tokenizer = transformers.RobertaTokenizer(str(root / "hf" / "vocab.json"),
                                                  str(root / "hf" / "merges.txt"))
    hf_ids = torch.tensor(tokenizer(TEXT)["input_ids"])
    expected, _ = plugin_ids(root, hf_ids)
    hub = TupeRobertaModel.from_pretrained(str(root / "out"),
                                           bpe="bert" if family == "bert" else "hf_byte_bpe")
    unk = hub.task.source_dictionary.unk()
    assert torch.equal(hub.encode(TEXT), expected) and unk not in expected


def test_bert_layer_norm_eps_of_1e_12_is_recorded_and_the_outputs_equal_transformers(tmp_path):
    hf_model = save_bert(tmp_path / "hf")  # BertConfig's default layer_norm_eps 1e-12
    convert(str(tmp_path / "hf"), str(tmp_path / "out"))
    hf_ids, mask = hf_batch(pad=0, cls=4, sep=5, vocab=len(BERT_TOKENS), seed=1)
    tokens, order = plugin_ids(tmp_path, hf_ids)
    hub = TupeRobertaModel.from_pretrained(str(tmp_path / "out"), bpe="bert")
    assert hub.cfg.model.layer_norm_eps == 1e-12
    assert {module.eps for module in hub.model.modules() if isinstance(module, torch.nn.LayerNorm)} == {1e-12}
    assert_equal_to_transformers(hf_model, hub, tokens, hf_ids, mask, order)


def test_checkpoint_records_the_sizes_bpe_and_positions(bert, roberta):
    for (_, root), bpe, positions in ((bert, "bert", BERT_MAX_POSITIONS),
                                      (roberta, "hf_byte_bpe", ROBERTA_TABLE - 2)):
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(root / "out" / "model.pt")])
        assert cfg.model.arch == "bert_a_base" and cfg.bpe._name == bpe
        sizes = (cfg.model.encoder_layers, cfg.model.encoder_embed_dim, cfg.model.max_positions)
        assert sizes == (2, 32, positions)
        assert cfg.task.data == str(root / "out")


def old_format_state_dict(hf_model):
    """bert-base-uncased's pytorch_model.bin layout: LayerNorm gamma/beta, the tied decoder stored, the
    pooler, the next-sentence head and the position_ids buffer."""
    state = {}
    for key, value in hf_model.state_dict().items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state[key] = value
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    state["bert.pooler.dense.weight"], state["bert.pooler.dense.bias"] = torch.ones(32, 32), torch.ones(32)
    state["cls.seq_relationship.weight"] = torch.ones(2, 32)
    state["cls.seq_relationship.bias"] = torch.ones(2)
    state["bert.embeddings.position_ids"] = torch.arange(BERT_MAX_POSITIONS)[None]
    return state


def test_pytorch_model_bin_of_bert_base_layout_converts_to_the_same_weights(bert, tmp_path, caplog):
    hf_model, root = bert
    shutil.copytree(root / "hf", tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(old_format_state_dict(hf_model), tmp_path / "hf" / "pytorch_model.bin")
    with caplog.at_level(logging.INFO, logger="convert_hf"):
        convert(str(tmp_path / "hf"), str(tmp_path / "out"))
    assert "dropped the next-sentence-prediction head: cls.seq_relationship.bias" in caplog.text
    ours = torch.load(tmp_path / "out" / "model.pt", weights_only=False)["model"]
    reference = torch.load(root / "out" / "model.pt", weights_only=False)["model"]
    assert ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in ours)


@pytest.mark.slow
def test_fairseq_validate_runs_on_the_converted_checkpoint_over_data_binarized_with_its_dict(bert, tmp_path):
    _, root = bert
    words = BERT_TOKENS[7:]  # WordPiece tokens, as --bpe bert writes them
    generator = torch.Generator().manual_seed(0)
    lines = [" ".join(words[i] for i in torch.randint(len(words), (int(n),), generator=generator))
             for n in torch.randint(5, 15, (200,), generator=generator)]
    text = tmp_path / "text.txt"
    text.write_text("\n".join(lines) + "\n")
    outputs = run_fairseq_steps(
        ("preprocess", ["--only-source", "--trainpref", text, "--validpref", text, "--srcdict",
                        root / "out" / "dict.txt", "--destdir", tmp_path / "bin", "--workers", 1]),
        ("validate", [tmp_path / "bin", "--user-dir", "tupe_plugin", "--path", root / "out" / "model.pt",
                      "--task", "masked_lm", "--tokens-per-sample", BERT_MAX_POSITIONS, "--batch-size", 8,
                      "--cpu"]),
    )
    (loss,) = logged_losses(outputs[1], "valid")
    assert 0 < loss < 100


# ---------------------------------------------------------------- refusals

@pytest.fixture
def bert_folder(bert, tmp_path):
    shutil.copytree(bert[1] / "hf", tmp_path / "hf")
    return tmp_path / "hf"


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes, message", [
    (dict(model_type="gpt2"), "config.json: model_type 'gpt2' is not supported"),
    (dict(position_embedding_type="relative_key"),
     "config.json: position_embedding_type = 'relative_key' is not supported"),
    (dict(hidden_act="relu"), "config.json: hidden_act = 'relu' is not supported"),
    (dict(is_decoder=True), "config.json: is_decoder = True is not supported"),
    (dict(tie_word_embeddings=False), "config.json: tie_word_embeddings = False is not supported"),
    (dict(hidden_size=48), r"31 sizes differ from config.json's .*embed_tokens.weight: \(98, 32\), "
                           r"config.json gives \(98, 48\)"),
    (dict(vocab_size=99), "vocab.txt holds 98 tokens but config.json vocab_size is 99"),
    (dict(max_position_embeddings=20), "position_embeddings.weight has 16 rows but config.json "
                                       "max_position_embeddings is 20"),
    (dict(pad_token_id=3), "config.json pad_token_id = 3 but the tokenizer's padding token has id 0"),
])
def test_unsupported_config_is_refused_naming_the_field(bert_folder, tmp_path, changes, message):
    edit_config(bert_folder, **changes)
    with pytest.raises(HfCheckpointError, match=message):
        convert(str(bert_folder), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def edit_weights(folder, drop=(), add=None):
    weights = load_file(folder / "model.safetensors")
    for key in drop:
        del weights[key]
    save_file(dict(weights, **(add or {})), folder / "model.safetensors")


@pytest.mark.parametrize("drop, add, message", [
    (["cls.predictions.bias"], None,
     r"missing cls\.predictions\.bias \(a BertModel/RobertaModel has no MLM head"),
    ([], {"bert.encoder.layer.2.output.dense.bias": torch.zeros(32)},
     r"no place in the plugin's encoder for bert\.encoder\.layer\.2\.output\.dense\.bias"),
    ([], {"cls.predictions.decoder.weight": torch.zeros(len(BERT_TOKENS), 32)},
     "cls.predictions.decoder.weight differs from bert.embeddings.word_embeddings.weight"),
])
def test_weights_that_do_not_fit_are_refused_naming_the_keys(bert_folder, tmp_path, drop, add, message):
    edit_weights(bert_folder, drop, add)
    with pytest.raises(HfCheckpointError, match=message):
        convert(str(bert_folder), str(tmp_path / "out"))


@pytest.mark.parametrize("vocab, message", [
    (BERT_TOKENS[:-1] + ["the"], "vocab.txt line 98: token 'the' repeats line 8"),
    (BERT_TOKENS[:-1] + ["<mask>"], "vocab.txt line 98: token '<mask>' is one of fairseq's special symbols"),
    (["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[BOS]"] + BERT_TOKENS[5:], r"vocab.txt has no \[CLS\]"),
])
def test_bert_vocabulary_fairseq_cannot_hold_is_refused(bert_folder, tmp_path, vocab, message):
    (bert_folder / "vocab.txt").write_text("".join(token + "\n" for token in vocab))
    with pytest.raises(HfCheckpointError, match=message):
        convert(str(bert_folder), str(tmp_path / "out"))


def test_roberta_vocabulary_with_specials_elsewhere_is_refused(roberta, tmp_path):
    shutil.copytree(roberta[1] / "hf", tmp_path / "hf")
    tokens = list(ROBERTA_TOKENS)
    tokens[-1], tokens[-2] = tokens[-2], tokens[-1]
    (tmp_path / "hf" / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(tokens)}))
    with pytest.raises(HfCheckpointError, match=r"vocab.json: <mask> is 91; fairseq needs <s> <pad> </s> "
                                                "<unk> at ids 0-3 and <mask> last"):
        convert(str(tmp_path / "hf"), str(tmp_path / "out"))


def test_truncated_safetensors_is_named(bert_folder, tmp_path):
    data = (bert_folder / "model.safetensors").read_bytes()
    (bert_folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(HfCheckpointError, match=r"model.safetensors \(\d+ bytes\) is not a complete "
                                                "safetensors file .*: download it again"):
        convert(str(bert_folder), str(tmp_path / "out"))


def safetensors_of_header(header):
    """A .safetensors file's bytes whose JSON header is ``header`` (text) and that holds no tensor data."""
    return struct.pack("<Q", len(header)) + header.encode()


@pytest.mark.parametrize("header, reason", [
    ("[]", r"its header is a JSON list, not an object of tensors"),
    ('"weights"', r"its header is a JSON str, not an object of tensors"),
])
def test_a_safetensors_header_that_is_no_object_is_named(bert_folder, tmp_path, header, reason):
    (bert_folder / "model.safetensors").write_bytes(safetensors_of_header(header))
    with pytest.raises(HfCheckpointError, match=rf"model.safetensors \(\d+ bytes\) is not a complete "
                                                rf"safetensors file \({reason}\): download it again"):
        convert(str(bert_folder), str(tmp_path / "out"))


def test_a_safetensors_header_nested_past_any_header_is_named(bert_folder, tmp_path):
    (bert_folder / "model.safetensors").write_bytes(safetensors_of_header("[" * 100_000 + "]" * 100_000))
    with pytest.raises(HfCheckpointError, match="header nests values too deep to be a safetensors header"):
        convert(str(bert_folder), str(tmp_path / "out"))


def test_a_config_nested_past_any_config_is_named(bert_folder, tmp_path):
    (bert_folder / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(HfCheckpointError, match=r"config.json nests its values too deep to read"):
        convert(str(bert_folder), str(tmp_path / "out"))


def test_a_fairseq_checkpoint_as_pytorch_model_bin_is_named_as_such(bert_folder, tmp_path):
    (bert_folder / "model.safetensors").unlink()
    shutil.copy(test_data("checkpoints", "tupe_r.pt"), bert_folder / "pytorch_model.bin")
    with pytest.raises(HfCheckpointError, match=r"pytorch_model.bin is a fairseq checkpoint, not a "
                                                "transformers model's weights"):
        convert(str(bert_folder), str(tmp_path / "out"))


def test_a_pytorch_model_bin_holding_other_values_than_tensors_names_one(bert_folder, tmp_path):
    (bert_folder / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(2), "step": 3},
               bert_folder / "pytorch_model.bin")
    with pytest.raises(HfCheckpointError, match="pytorch_model.bin: 'step' holds a value of type int, not a"):
        convert(str(bert_folder), str(tmp_path / "out"))


@pytest.mark.parametrize("missing, message", [
    ("vocab.txt", "has no vocab.txt \\(bert's tokenizer\\) and no tokenizer.json: save the tokenizer"),
    ("model.safetensors", "has neither model.safetensors nor pytorch_model.bin"),
    ("config.json", "has no config.json"),
])
def test_missing_files_are_named(bert_folder, tmp_path, missing, message):
    (bert_folder / missing).unlink()
    with pytest.raises(HfCheckpointError, match=message):
        convert(str(bert_folder), str(tmp_path / "out"))


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_folder_whose_tokenizer_is_only_tokenizer_json_converts_as_with_the_vocabulary_files(
        family, bert, roberta, tmp_path):
    """transformers 5's save_pretrained writes tokenizer.json and neither vocab.txt nor vocab.json."""
    _, root = bert if family == "bert" else roberta
    shutil.copytree(root / "hf", tmp_path / "hf")
    files = ["vocab.txt"] if family == "bert" else ["vocab.json", "merges.txt"]
    tokenizer_class = transformers.BertTokenizer if family == "bert" else transformers.RobertaTokenizer
    tokenizer_class(*(str(tmp_path / "hf" / name) for name in files)).save_pretrained(tmp_path / "hf")
    for name in files:
        (tmp_path / "hf" / name).unlink(missing_ok=True)
    convert(str(tmp_path / "hf"), str(tmp_path / "out"))
    for name in ["dict.txt"] + files:
        assert output_file(tmp_path / "out", name) == output_file(root / "out", name)
    assert output_file(tmp_path / "out", "model.pt") == output_file(root / "out", "model.pt")


def output_file(folder, name):
    """A converted folder's file as compared: JSON parsed, model.pt's HF ids, text otherwise."""
    if name == "model.pt":
        return list(torch.load(folder / name, weights_only=False)["extra_state"]["hf_token_ids"])
    text = (folder / name).read_text(encoding="utf-8")
    return json.loads(text) if name.endswith(".json") else text


def test_arch_of_another_size_is_refused_and_another_encoding_says_how_to_swap(bert_folder, tmp_path, caplog):
    with pytest.raises(HfCheckpointError, match=r"--arch tupe_r_tiny is tiny size \(2, 128, 4, 512\) but "
                                                r"config.json describes \(layers, hidden, heads, FFN\) = "
                                                r"\(2, 32, 4, 64\)"):
        convert(str(bert_folder), str(tmp_path / "out"), arch="tupe_r_tiny")
    with pytest.raises(HfCheckpointError, match="--arch tupe_r_huge is not a plugin architecture"):
        convert(str(bert_folder), str(tmp_path / "out"), arch="tupe_r_huge")
    with caplog.at_level(logging.INFO, logger="convert_hf"):
        convert(str(bert_folder), str(tmp_path / "out"), arch="tupe_r_base")
    assert f"--arch tupe_r_base --init-from-checkpoint {tmp_path / 'out' / 'model.pt'}" in caplog.text
    assert "--encoder-embed-dim 32" in caplog.text  # not a preset size: the flags say it


def test_command_line_ends_with_the_checkpoint_and_the_output_folder(bert, tmp_path, capsys):
    _, root = bert
    assert hf_cli.main(["--hf-model", str(root / "hf"), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "tupe-convert-hf: done",
        f"checkpoint:    {tmp_path / 'out' / 'model.pt'}",
        f"output folder: {tmp_path / 'out'} (model.pt, dict.txt, the tokenizer files)"]


def test_command_line_stops_with_one_line_and_keeps_existing_outputs(bert, tmp_path):
    _, root = bert
    with pytest.raises(SystemExit, match=r"^tupe-convert-hf: error: --out .* already holds model.pt and "
                                         "dict.txt and vocab.txt; nothing is overwritten"):
        hf_cli.main(["--hf-model", str(root / "hf"), "--out", str(root / "out")])
    with pytest.raises(SystemExit, match="is the --hf-model folder"):
        hf_cli.main(["--hf-model", str(root / "hf"), "--out", str(root / "hf"), "--force"])
