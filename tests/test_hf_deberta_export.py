"""tupe-export-hf writes the plugin's DeBERTa without the Enhanced Mask Decoder as transformers' DeBERTa-v2
(the inverse of tupe-convert-hf's DeBERTa-v2 import): the released form with v1's query-only projection
biases (zeros where v2 has a bias), v2's biases on both sides, share_att_key, log buckets, the table's
LayerNorm, an absolute table at the input or none. Loaded in a process that can import torch and
transformers only, without trust_remote_code: the masked-LM logits, the features, a GLUE fine-tune's
classifier (DeBERTa-v2's pooler) and a SQuAD fine-tune's span head equal the plugin's on a padded batch of
real text, and the pipelines give the plugin's predictions; with log buckets, rows shorter than K only
(beyond K the plugin clips as Microsoft's code and transformers does not: the card says so). A setting
transformers does not compute is the remote-code export naming it; tupe-convert-hf reads the export back."""
# the fixtures imported from the other test modules are the tests' arguments
# ruff: noqa: F811

import json
import logging
import pathlib

import pytest
import torch
from test_hf_export import make_checkpoint, plugin_batch, transformers_only, whole_data_bin  # noqa: F401
from test_hf_native_export import (CHILD, GLUE_TASK, assert_real_positions_close, assert_same_tensors,  # noqa: F401
                                   glue_bin, plugin_model, sst2_sentences)
from test_hf_pipelines import GLUE_POSITIONS, hub_of, masked_texts, plugin_fill_mask

from tupe_plugin.conversion.hf import convert
from tupe_plugin.conversion.hf_export import export

# family -> (arch, flags); every one is DeBERTa-v2 without remote code
DEBERTA = {
    # v1's released settings: W^{q,r} with a bias, W^{k,r} without; distances clipped to k = 512
    "deberta": ("deberta_tiny", []),
    # v2/v3's: log buckets, share_att_key, the table's LayerNorm
    "deberta_v2": ("deberta_tiny", ["--deberta-buckets", "8", "--deberta-max-distance", "128",
                                    "--deberta-share-att-key", "--deberta-table-norm"]),
    # both biases, a learned absolute table at the input, clipped at k = 16 (transformers clips alike)
    "deberta_both_ape": ("deberta_tiny", ["--deberta-rel-proj-bias", "both", "--abs-pos", "learned",
                                          "--deberta-max-distance", "16"]),
    # no biases, the learnable sinusoids written out as DeBERTa-v2's absolute table
    "deberta_none_lsin": ("deberta_tiny", ["--deberta-rel-proj-bias", "none", "--abs-pos",
                                           "learnable-sinusoidal", "--deberta-buckets", "8",
                                           "--deberta-max-distance", "160"]),
}
# log buckets reaching K = 12 only: equal for rows shorter than K
SHORT_K = 14
SHORT = ("deberta_tiny", ["--deberta-buckets", "8", "--deberta-max-distance", str(SHORT_K)])
CLASSES = {"DebertaV2ForMaskedLM", "DebertaV2Model", "DebertaV2ForSequenceClassification"}


@pytest.fixture(scope="module")
def deberta(whole_data_bin, glue_bin, tmp_path_factory):
    """Every DeBERTa family pre-trained, GLUE-fine-tuned and SQuAD-fine-tuned, exported; the
    transformers-only child's outputs."""
    root = tmp_path_factory.mktemp("deberta")
    exports = {}
    for name, (arch, flags) in dict(DEBERTA, short=SHORT).items():
        checkpoints = dict(
            pretrained=make_checkpoint(whole_data_bin, root / f"{name}.pt", arch, flags, heads=False),
            glue=make_checkpoint(glue_bin, root / f"{name}-glue.pt", arch, flags, heads=False,
                                 task=GLUE_TASK, max_positions=GLUE_POSITIONS),
            squad=make_checkpoint(whole_data_bin, root / f"{name}-squad.pt", arch, flags, heads=("span",)),
        )
        exports[name] = {kind: export(str(path), str(whole_data_bin), str(root / f"{name}-{kind}"))
                         for kind, path in checkpoints.items()}
    batch, _, _ = plugin_batch(whole_data_bin, root / "deberta.pt")
    batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"].eq(0), 1)  # <pad>
    torch.save(batch, root / "batch.pt")
    request = dict(exports=exports, batch=str(root / "batch.pt"), out=str(root / "results.pt"),
                   masked=masked_texts(), sentences=sst2_sentences())
    (root / "request.json").write_text(json.dumps(request))
    transformers_only(CHILD, root / "request.json", modules=root / "modules")
    return root, torch.load(root / "results.pt", weights_only=False), batch, exports


def test_the_inputs_stay_within_the_distances_transformers_buckets_as_the_plugin(deberta, whole_data_bin):
    _, _, batch, _ = deberta
    hub = hub_of(pathlib.Path(deberta[0]) / "deberta.pt", whole_data_bin,
                 whole_data_bin / "sentencepiece.bpe.model")
    longest = max(len(hub.encode(sentence)) for sentence in sst2_sentences() + masked_texts())
    assert max(longest, batch["attention_mask"].size(1)) <= 128
    assert batch["attention_mask"].sum(1).min() <= SHORT_K < batch["attention_mask"].sum(1).max()


@pytest.mark.parametrize("family", sorted(DEBERTA))
def test_a_deberta_export_is_deberta_v2_without_code(deberta, family):
    _, results, _, exports = deberta
    for folder in map(pathlib.Path, exports[family].values()):
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == "deberta-v2" and "auto_map" not in config
        assert not list(folder.glob("*.py"))
    assert results[family]["classes"] == CLASSES


@pytest.mark.parametrize("family", sorted(DEBERTA))
def test_a_deberta_export_gives_the_plugins_masked_lm_logits_and_features(deberta, whole_data_bin, family):
    root, results, batch, _ = deberta
    model = plugin_model(root / f"{family}.pt", whole_data_bin)
    with torch.no_grad():
        logits = model(batch["input_ids"])[0]
        features = model(batch["input_ids"], features_only=True)[0]
    assert_real_positions_close(results[family]["logits"], logits, batch["attention_mask"], "logits")
    assert_real_positions_close(results[family]["features"], features, batch["attention_mask"], "features")


@pytest.mark.parametrize("family", sorted(DEBERTA))
def test_a_deberta_export_of_a_glue_fine_tune_gives_the_plugins_classes(deberta, glue_bin, family):
    root, results, batch, _ = deberta
    model = plugin_model(root / f"{family}-glue.pt", glue_bin)
    with torch.no_grad():
        expected = model(batch["input_ids"], features_only=True,
                         classification_head_name="sentence_classification_head")[0]
    torch.testing.assert_close(results[family]["glue"], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", sorted(DEBERTA))
def test_a_deberta_export_of_a_squad_fine_tune_gives_the_plugins_spans(deberta, whole_data_bin, family):
    root, results, batch, _ = deberta
    model = plugin_model(root / f"{family}-squad.pt", whole_data_bin)
    with torch.no_grad():
        start, end = model(batch["input_ids"], span_head_name="squad")[0]
    assert_real_positions_close(results[family]["start"], start, batch["attention_mask"], "start")
    assert_real_positions_close(results[family]["end"], end, batch["attention_mask"], "end")


@pytest.mark.parametrize("family", sorted(DEBERTA))
def test_fill_mask_on_a_deberta_export_predicts_the_plugins_word(deberta, whole_data_bin, family):
    root, results, _, _ = deberta
    hub = hub_of(root / f"{family}.pt", whole_data_bin, whole_data_bin / "sentencepiece.bpe.model")
    for text, result in zip(masked_texts(), results[family]["fill_mask"]):
        token, probability = plugin_fill_mask(hub, text)
        assert result["token"] == token, text
        assert result["score"] == pytest.approx(probability, abs=1e-5)


@pytest.mark.parametrize("family", sorted(DEBERTA))
def test_text_classification_on_a_deberta_export_gives_the_plugins_labels(deberta, whole_data_bin,
                                                                           glue_bin, family):
    root, results, _, _ = deberta
    hub = hub_of(root / f"{family}-glue.pt", glue_bin, whole_data_bin / "sentencepiece.bpe.model")
    labels = hub.task.label_dictionary
    expected, scores = [], []
    with torch.no_grad():
        for sentence in sst2_sentences():
            probabilities = hub.predict("sentence_classification_head", hub.encode(sentence)).exp()[0]
            expected.append(labels.string([int(probabilities.argmax()) + labels.nspecial]))
            scores.append(float(probabilities.max()))
    assert [result["label"] for result in results[family]["labels"]] == expected
    assert [result["score"] for result in results[family]["labels"]] == pytest.approx(scores, abs=1e-5)


def test_log_buckets_beyond_k_differ_from_the_plugin_and_the_card_says_so(deberta, whole_data_bin):
    root, results, batch, exports = deberta
    model = plugin_model(root / "short.pt", whole_data_bin)
    with torch.no_grad():
        logits = model(batch["input_ids"])[0]
    lengths = batch["attention_mask"].sum(1)
    for row, length in enumerate(lengths.tolist()):
        ours, theirs = results["short"]["logits"][row, :length], logits[row, :length]
        if length <= SHORT_K:
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        else:
            assert not torch.allclose(ours, theirs, atol=1e-3)
    card = (pathlib.Path(exports["short"]["pretrained"]) / "README.md").read_text()
    assert f"equal to the plugin for distances |i - j| < {SHORT_K} (max_relative_positions); beyond, " \
           "Microsoft's DeBERTa code, which the plugin follows, clips the distance" in card
    assert "equal to the plugin for distances" not in \
        (pathlib.Path(exports["deberta"]["pretrained"]) / "README.md").read_text()


def test_the_model_card_says_the_export_is_deberta_v2_and_loads_without_remote_code(deberta):
    _, _, _, exports = deberta
    card = (pathlib.Path(exports["deberta"]["glue"]) / "README.md").read_text()
    assert "- export: transformers' own DeBERTa-v2 (`DebertaV2ForSequenceClassification`, model type " \
           "`deberta-v2`)" in card
    assert "model = AutoModelForSequenceClassification.from_pretrained(FOLDER)\n" in card


# ---------------------------------------------------------------- the remote-code form where outputs differ

@pytest.mark.parametrize("arch, flags, heads, difference", [
    ("deberta_emd_tiny", [], False,
     "--deberta-emd: DeBERTa-v2 has no Enhanced Mask Decoder before its masked-LM head"),
    ("deberta_tiny", ["--deberta-p2c", "paper"], False,
     "--deberta-p2c paper: DeBERTa-v2's p2c term reads delta(i, j), the released form"),
    ("deberta_tiny", ["--deberta-buckets", "18", "--deberta-max-distance", "26"], False,
     "--deberta-buckets 18 with --deberta-max-distance 26: DeBERTa-v2's log buckets, computed in float32, "
     "put the distance "),
    ("deberta_tiny", ["--encoder-normalize-before"], False,
     "the model is pre-LN (--encoder-normalize-before) and DeBERTa-v2 post-LN"),
    ("deberta_tiny", ["--no-layernorm-embedding"], False,
     "the model has no embedding LayerNorm (--no-layernorm-embedding) and DeBERTa-v2 normalises the "
     "embeddings"),
    ("deberta_tiny", ["--pooler-activation-fn", "gelu_accurate"], ("classification",),
     "--pooler-activation-fn gelu_accurate: DeBERTa-v2's pooler has no such activation"),
    ("deberta_tiny", [], True, "the classification head has 3 classes and a span head is exported too: "
                               "DebertaV2ForQuestionAnswering reads num_labels as its 2 outputs"),
], ids=["EMD", "p2c paper", "float32 buckets", "pre-LN", "no embedding LayerNorm", "pooler activation",
        "3 classes and a span head"])
def test_a_deberta_that_differs_from_deberta_v2_is_the_remote_code_export_naming_the_difference(
        whole_data_bin, tmp_path, caplog, arch, flags, heads, difference):
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", arch, flags, heads=heads)
    with caplog.at_level(logging.WARNING, logger="export_hf"):
        export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "tupe" and "auto_map" in config
    warning = next(record.getMessage() for record in caplog.records if record.levelno == logging.WARNING)
    assert warning.startswith("exported as the remote-code model (load it with trust_remote_code=True), not "
                              "as a transformers class: ") and difference in warning
    assert f"- export: the plugin's remote-code model (`modeling_tupe.py`): {difference}" in \
        (tmp_path / "out" / "README.md").read_text()


# ---------------------------------------------------------------- the way back

@pytest.mark.parametrize("family", sorted(DEBERTA))
@pytest.mark.parametrize("kind", ["pretrained", "glue", "squad"])
def test_convert_hf_on_a_deberta_export_gives_the_checkpoint_back(deberta, family, kind, tmp_path):
    root, _, _, exports = deberta
    convert(exports[family][kind], str(tmp_path / "back"))
    original = torch.load(root / (f"{family}.pt" if kind == "pretrained" else f"{family}-{kind}.pt"),
                          weights_only=False)
    back = torch.load(tmp_path / "back" / "model.pt", weights_only=False)
    assert_same_tensors(back["model"], original["model"], kind)
    assert back["cfg"]["model"].arch == original["cfg"]["model"].arch
