"""tupe-export-hf writes the families transformers has the architecture of as transformers' own class:
BERT-A, no position encoding and the two sinusoid APEs as RoBERTa. Loaded in a process that can import
torch and transformers only, without trust_remote_code: the masked-LM logits, the features, a GLUE
fine-tune's classifier and a SQuAD fine-tune's span head equal the plugin's on a padded batch of real text,
and the fill-mask and text-classification pipelines give the plugin's predictions. A model that differs
from the class in anything that changes outputs is the remote-code export, and the warning names the
difference; --remote-code asks for it; tupe-convert-hf reads a native export back."""

import json
import logging
import pathlib
import shutil

import pytest
import torch
from conftest import PRESETS, native_type, test_data
from fairseq import checkpoint_utils
from test_hf_export import (TEXTS, make_checkpoint, plugin_batch, transformers_only,  # noqa: F401
                            whole_data_bin)
from test_hf_pipelines import GLUE_POSITIONS, hub_of, masked_texts, plugin_fill_mask

from tupe_plugin.conversion import hf_export
from tupe_plugin.conversion.hf import convert
from tupe_plugin.conversion.hf_export import export
from tupe_plugin.conversion.hf_import import ExportFolderError
from tupe_plugin.glue import prepare as prepare_glue

CLASSES = dict(roberta={"RobertaForMaskedLM", "RobertaModel", "RobertaForSequenceClassification"},
               roformer={"RoFormerForMaskedLM", "RoFormerModel", "RoFormerForSequenceClassification"})
# the GLUE fine-tune's flags of each class: RoFormer's classification head applies the layers' activation
GLUE_FLAGS = dict(roberta=[], roformer=["--pooler-activation-fn", "gelu"])
# family -> (arch, transformers model type, the GLUE fine-tune's flags): every preset its encodings' hf_native
# export as RoBERTa or RoFormer (DeBERTa-v2: tests/test_hf_deberta_export.py)
NATIVE = {preset: (f"{preset}_tiny", native_type(preset), GLUE_FLAGS[native_type(preset)])
          for preset in PRESETS if native_type(preset) in CLASSES}
GLUE_TASK = ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2"]
CHILD = r"""
import sys, json, torch
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
from transformers import (AutoModel, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
                          AutoModelForSequenceClassification, pipeline)
request = json.load(open(sys.argv[1]))
batch = torch.load(request["batch"])
ids, mask = batch["input_ids"], batch["attention_mask"]
results = {}
with torch.no_grad():
    for name, folders in request["exports"].items():
        mlm = AutoModelForMaskedLM.from_pretrained(folders["pretrained"]).eval()
        base = AutoModel.from_pretrained(folders["pretrained"]).eval()
        classifier = AutoModelForSequenceClassification.from_pretrained(folders["glue"]).eval()
        span = AutoModelForQuestionAnswering.from_pretrained(folders["squad"]).eval()(input_ids=ids,
                                                                                     attention_mask=mask)
        fill_mask = pipeline("fill-mask", model=folders["pretrained"], device="cpu")
        classify = pipeline("text-classification", model=folders["glue"], device="cpu")
        results[name] = dict(
            classes={type(model).__name__ for model in (mlm, base, classifier)},
            logits=mlm(input_ids=ids, attention_mask=mask).logits,
            features=base(input_ids=ids, attention_mask=mask).last_hidden_state,
            glue=classifier(input_ids=ids, attention_mask=mask).logits,
            start=span.start_logits, end=span.end_logits,
            fill_mask=[fill_mask(text, top_k=1)[0] for text in request["masked"]],
            labels=[classify(text)[0] for text in request["sentences"]],
        )
torch.save(results, request["out"])
"""


@pytest.fixture(scope="module")
def glue_bin(whole_data_bin, tmp_path_factory):  # noqa: F811
    """SST-2 of tests/data prepared with the pre-training dictionary."""
    out = tmp_path_factory.mktemp("glue") / "SST-2-bin"
    prepare_glue.main(["--task", "SST-2", "--glue-dir", test_data("glue"),
                       "--sentencepiece-model", str(whole_data_bin / "sentencepiece.bpe.model"),
                       "--dict", str(whole_data_bin / "dict.txt"), "--out", str(out)])
    return out


def sst2_sentences():
    with open(test_data("glue", "SST-2", "dev.tsv"), encoding="utf-8") as f:
        return [line.split("\t")[0].strip() for line in f][1:]


@pytest.fixture(scope="module")
def native(whole_data_bin, glue_bin, tmp_path_factory):  # noqa: F811
    """Every native family pre-trained, GLUE-fine-tuned and SQuAD-fine-tuned, exported; the
    transformers-only child's outputs."""
    root = tmp_path_factory.mktemp("native")
    exports = {}
    for name, (arch, _, glue_flags) in NATIVE.items():
        checkpoints = dict(
            pretrained=make_checkpoint(whole_data_bin, root / f"{name}.pt", arch, [], heads=False),
            glue=make_checkpoint(glue_bin, root / f"{name}-glue.pt", arch, glue_flags, heads=False,
                                 task=GLUE_TASK, max_positions=GLUE_POSITIONS),
            squad=make_checkpoint(whole_data_bin, root / f"{name}-squad.pt", arch, [], heads=("span",)),
        )
        exports[name] = {kind: export(str(path), str(whole_data_bin), str(root / f"{name}-{kind}"))
                         for kind, path in checkpoints.items()}
    batch, _, _ = plugin_batch(whole_data_bin, root / "bert_a.pt")
    batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"].eq(0), 1)  # <pad>
    torch.save(batch, root / "batch.pt")
    request = dict(exports=exports, batch=str(root / "batch.pt"), out=str(root / "results.pt"),
                   masked=masked_texts(), sentences=sst2_sentences())
    (root / "request.json").write_text(json.dumps(request))
    transformers_only(CHILD, root / "request.json", modules=root / "modules")
    return root, torch.load(root / "results.pt", weights_only=False), batch, exports


def plugin_model(path, data):
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data), "load_checkpoint_heads": True})
    return models[0].eval()


def assert_real_positions_close(ours, expected, mask, what):
    real = mask.bool()
    torch.testing.assert_close(ours[real], expected[real], atol=1e-5, rtol=1e-5, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("family", sorted(NATIVE))
def test_a_native_export_is_transformers_own_class_without_code(native, family):
    _, results, _, exports = native
    model_type = NATIVE[family][1]
    for folder in map(pathlib.Path, exports[family].values()):
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == model_type and "auto_map" not in config
        assert not list(folder.glob("*.py"))
    assert results[family]["classes"] == CLASSES[model_type]


@pytest.mark.parametrize("family", sorted(NATIVE))
def test_a_native_export_gives_the_plugins_masked_lm_logits_and_features(native, whole_data_bin, family):  # noqa: F811
    root, results, batch, _ = native
    model = plugin_model(root / f"{family}.pt", whole_data_bin)
    with torch.no_grad():
        logits = model(batch["input_ids"])[0]
        features = model(batch["input_ids"], features_only=True)[0]
    assert_real_positions_close(results[family]["logits"], logits, batch["attention_mask"], "logits")
    assert_real_positions_close(results[family]["features"], features, batch["attention_mask"], "features")


@pytest.mark.parametrize("family", sorted(NATIVE))
def test_a_native_export_of_a_glue_fine_tune_gives_the_plugins_classes(native, glue_bin, family):
    root, results, batch, _ = native
    model = plugin_model(root / f"{family}-glue.pt", glue_bin)
    with torch.no_grad():
        expected = model(batch["input_ids"], features_only=True,
                         classification_head_name="sentence_classification_head")[0]
    torch.testing.assert_close(results[family]["glue"], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", sorted(NATIVE))
def test_a_native_export_of_a_squad_fine_tune_gives_the_plugins_spans(native, whole_data_bin, family):  # noqa: F811
    root, results, batch, _ = native
    model = plugin_model(root / f"{family}-squad.pt", whole_data_bin)
    with torch.no_grad():
        start, end = model(batch["input_ids"], span_head_name="squad")[0]
    assert_real_positions_close(results[family]["start"], start, batch["attention_mask"], "start")
    assert_real_positions_close(results[family]["end"], end, batch["attention_mask"], "end")


@pytest.mark.parametrize("family", sorted(NATIVE))
def test_fill_mask_on_a_native_export_predicts_the_plugins_word(native, whole_data_bin, family):  # noqa: F811
    root, results, _, _ = native
    hub = hub_of(root / f"{family}.pt", whole_data_bin, whole_data_bin / "sentencepiece.bpe.model")
    for text, result in zip(masked_texts(), results[family]["fill_mask"]):
        token, probability = plugin_fill_mask(hub, text)
        assert result["token"] == token, text
        assert result["score"] == pytest.approx(probability, abs=1e-5)


@pytest.mark.parametrize("family", sorted(NATIVE))
def test_text_classification_on_a_native_export_gives_the_plugins_labels(native, whole_data_bin, glue_bin,  # noqa: F811
                                                                          family):
    root, results, _, _ = native
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


def test_the_model_card_says_the_export_is_roberta_and_loads_without_remote_code(native):
    _, _, _, exports = native
    card = (pathlib.Path(exports["bert_a"]["glue"]) / "README.md").read_text()
    assert "- export: transformers' own RoBERTa (`RobertaForSequenceClassification`, model type `roberta`)" \
        in card
    assert "model = AutoModelForSequenceClassification.from_pretrained(FOLDER)\n" in card


# ---------------------------------------------------------------- the remote-code form where outputs differ

@pytest.mark.parametrize("family, flags, heads, difference", [
    ("bert_a_tiny", ["--encoder-normalize-before"], False,
     "the model is pre-LN (--encoder-normalize-before) and RoBERTa post-LN"),
    ("bert_nope_tiny", ["--no-layernorm-embedding"], False,
     "the model has no embedding LayerNorm (--no-layernorm-embedding) and RoBERTa normalises the embeddings"),
    ("bert_sin_ape_tiny", ["--activation-fn", "relu"], False,
     "--activation-fn relu: RoBERTa's masked-LM head applies GELU"),
    ("bert_lsin_ape_tiny", ["--pooler-activation-fn", "relu"], ("classification",),
     "--pooler-activation-fn relu: RoBERTa's classification head applies tanh"),
    ("bert_a_tiny", [], True, "the classification head has 3 classes and a span head is exported too: "
                              "RobertaForQuestionAnswering reads num_labels as its 2 outputs"),
    ("bert_lrope_tiny", [], False, "--rotary learnable: RoFormer's frequencies are fixed"),
    ("bert_rope_tiny", ["--rotary-scaling", "linear", "--rotary-scaling-factor", "2"], False,
     "--rotary-scaling linear: RoFormer does not scale its angles"),
    ("bert_rope_tiny", ["--rotary-base", "500"], False, "--rotary-base 500: RoFormer's base is 10000"),
    ("bert_rope_tiny", [], ("classification",), "--pooler-activation-fn tanh: RoFormer's classification head "
                                                "applies the layers' activation (--activation-fn gelu)"),
    ("bert_rope_tiny", ["--encoder-normalize-before"], False,
     "the model is pre-LN (--encoder-normalize-before) and RoFormer post-LN"),
    ("bert_a_tiny", ["--rotary", "fixed"], False, "the model combines encodings of several transformers "
                                                  "classes: the absolute position embedding (roberta), RoPE "
                                                  "(roformer)"),
], ids=["pre-LN", "no embedding LayerNorm", "activation", "pooler activation", "3 classes and a span head",
        "RoPE learnable", "RoPE scaled", "RoPE base", "RoPE tanh classifier", "RoPE pre-LN", "APE and RoPE"])
def test_a_model_that_differs_from_the_transformers_class_is_the_remote_code_export_naming_the_difference(
        whole_data_bin, tmp_path, caplog, family, flags, heads, difference):  # noqa: F811
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", family, flags, heads=heads)
    with caplog.at_level(logging.WARNING, logger="export_hf"):
        export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "tupe" and "auto_map" in config
    warning = next(record.getMessage() for record in caplog.records if record.levelno == logging.WARNING)
    assert warning.startswith("exported as the remote-code model (load it with trust_remote_code=True), not "
                              "as a transformers class: ") and difference in warning
    assert f"- export: the plugin's remote-code model (`modeling_tupe.py`): {difference}" in \
        (tmp_path / "out" / "README.md").read_text()


def test_remote_code_writes_the_remote_code_model_for_a_family_roberta_computes(whole_data_bin, tmp_path,  # noqa: F811
                                                                                 capsys):
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", "bert_a_tiny", [], heads=False)
    out = tmp_path / "out"
    assert hf_export.main([str(checkpoint), str(whole_data_bin), "--out", str(out), "--remote-code"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "tupe" and (out / "modeling_tupe.py").is_file()
    assert "- export: the plugin's remote-code model (`modeling_tupe.py`): asked for with --remote-code" in \
        (out / "README.md").read_text()
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"load it with:  AutoModelForMaskedLM.from_pretrained({str(out)!r}, trust_remote_code=True)"


def test_the_command_line_of_a_native_export_loads_it_without_remote_code(whole_data_bin, tmp_path, capsys):  # noqa: F811
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", "bert_a_tiny", [], heads=("span",))
    out = tmp_path / "out"
    assert hf_export.main([str(checkpoint), str(whole_data_bin), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"load it with:  AutoModelForQuestionAnswering.from_pretrained({str(out)!r})"


def test_force_replaces_a_previous_native_export(whole_data_bin, tmp_path):  # noqa: F811
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", "bert_a_tiny", [], heads=False)
    export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out"))
    export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out"), force=True, remote_code=True)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "tupe"


# ---------------------------------------------------------------- the way back

@pytest.mark.parametrize("family", sorted(NATIVE))
@pytest.mark.parametrize("kind", ["pretrained", "glue", "squad"])
def test_convert_hf_on_a_native_export_gives_the_checkpoint_back(native, family, kind, tmp_path):
    root, _, _, exports = native
    convert(exports[family][kind], str(tmp_path / "back"))
    original = torch.load(root / (f"{family}.pt" if kind == "pretrained" else f"{family}-{kind}.pt"),
                          weights_only=False)
    back = torch.load(tmp_path / "back" / "model.pt", weights_only=False)
    assert_same_tensors(back["model"], original["model"], kind)
    assert back["cfg"]["model"].arch == original["cfg"]["model"].arch


def assert_same_tensors(back, original, kind):
    """``back``'s tensors are ``original``'s, but for the masked-LM head of a fine-tune's export (``kind``
    glue or squad), which holds none: freshly initialised, its weight the word embeddings."""
    assert back.keys() == original.keys()
    for key in original:
        fresh = key.startswith("encoder.lm_head.") and key != "encoder.lm_head.weight"
        assert (fresh and kind != "pretrained") or torch.equal(back[key], original[key]), key


def test_convert_hf_refuses_a_native_export_whose_transformers_fields_were_edited(native, tmp_path):
    """RoFormer's rotary_value turned on: transformers then rotates the values too, the plugin model not."""
    family = next(name for name, (_, model_type, _) in NATIVE.items() if model_type == "roformer")
    _, _, _, exports = native
    shutil.copytree(exports[family]["pretrained"], tmp_path / "edited")
    config = json.loads((tmp_path / "edited" / "config.json").read_text())
    (tmp_path / "edited" / "config.json").write_text(json.dumps(dict(config, rotary_value=True)))
    with pytest.raises(ExportFolderError, match="config.json: rotary_value = true, but the model recorded "
                                                "in its fairseq_model_args, which the checkpoint is rebuilt "
                                                "from, has false"):
        convert(str(tmp_path / "edited"), str(tmp_path / "back"))


@pytest.mark.slow
def test_a_checkpoint_converted_back_from_a_native_export_validates_to_the_original_loss(
        native, whole_data_bin, tmp_path):  # noqa: F811
    import sentencepiece as spm
    from cli import logged_losses, run_fairseq_steps

    root, _, _, exports = native
    convert(exports["bert_lsin_ape"]["pretrained"], str(tmp_path / "back"))
    processor = spm.SentencePieceProcessor(model_file=str(whole_data_bin / "sentencepiece.bpe.model"))
    with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
        lines = [" ".join(processor.encode(line.strip(), out_type=str)) for line in f if line.strip()][:200]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    validate = ["--user-dir", "tupe_plugin", "--task", "masked_lm", "--tokens-per-sample", 96,
                "--batch-size", 8, "--cpu", "--seed", 1, "--num-workers", 0]
    outputs = run_fairseq_steps(
        ("preprocess", ["--only-source", "--trainpref", tmp_path / "text.txt", "--validpref",
                        tmp_path / "text.txt", "--srcdict", whole_data_bin / "dict.txt", "--destdir",
                        tmp_path / "bin", "--workers", 1]),
        ("validate", [tmp_path / "bin", "--path", root / "bert_lsin_ape.pt", *validate]),
        ("validate", [tmp_path / "bin", "--path", tmp_path / "back" / "model.pt", *validate]),
    )
    (original,), (back,) = (logged_losses(output, "valid") for output in outputs[1:])
    assert back == original and 0 < original < 100


def test_an_export_and_its_conversion_back_get_the_permissions_of_the_users_umask(whole_data_bin, tmp_path):  # noqa: F811
    import os
    import stat

    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", "bert_a_tiny", [], heads=False)
    before = os.umask(0o022)
    try:
        export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out"))
        convert(str(tmp_path / "out"), str(tmp_path / "back"))
    finally:
        os.umask(before)
    for folder in ("out", "back"):
        assert stat.S_IMODE((tmp_path / folder).stat().st_mode) == 0o755, folder
