"""tupe-export-hf's model card and the weights of a fine-tune's export: the Hugging Face Hub's YAML header
(its pipeline tag the exported head's), the pre-training a fine-tune started from (read from that checkpoint,
"unknown" when it is gone), the fine-tuning's task, updates, data, labels and dev score as the run recorded
them; a classifier's or span head's export holds no masked-LM head, so that transformers loads it without a
report of unused weights, and tupe-convert-hf reads it back with a fresh masked-LM head.

The fine-tune is a checkpoint of fairseq's sentence_prediction task (random weights) given what
tupe-finetune-glue's fairseq-train run records: ``--finetune-from-model`` (an absolute path), the
best-checkpoint metric, the validation score in the extra state, its updates, and run.json beside it."""

import json
import logging
import os
import shutil

import pytest
import torch
import yaml
from fairseq import checkpoint_utils
from test_hf_export import make_checkpoint, transformers_only, whole_data_bin  # noqa: F401  (a fixture)

from tupe_plugin.conversion.hf import convert
from tupe_plugin.conversion.hf_export import export
from tupe_plugin.conversion.hf_import import ExportFolderError
from tupe_plugin.conversion.hf_names import write_safetensors
from tupe_plugin.downstream.run_record import write_record

GLUE_TASK = ["--task", "sentence_prediction", "--criterion", "sentence_prediction", "--num-classes", "2"]
LABELS = ("entailment", "not_entailment")
PRETRAINING_UPDATES, FINE_TUNING_UPDATES, DEV_ACCURACY = 1000, 60, 62.5
# the masked-LM head's names in the remote-code export, RoBERTa's, RoFormer's and DeBERTa-v2's
MASKED_LM_NAMES = ("lm_head.", "cls.predictions.", "lm_predictions.")


def header(card):
    """The YAML header of a card, parsed."""
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def task_bin(root, data_bin):
    """An RTE data folder as tupe-prepare-glue names and lays it out: the dictionaries fairseq's
    sentence_prediction task reads."""
    folder = root / "glue-bin" / "RTE-bin"
    for part, lines in (("input0", (data_bin / "dict.txt").read_text()),
                        ("label", "".join(f"{label} 100\n" for label in LABELS))):
        (folder / part).mkdir(parents=True)
        (folder / part / "dict.txt").write_text(lines, encoding="utf-8")
    return folder


def fine_tune(root, data_bin, pretrained, recorded=None, save_dir="glue/RTE"):
    """``root/SAVE_DIR/checkpoint_best.pt``: an RTE fine-tune of ``pretrained`` as tupe-finetune-glue's run
    records it (``recorded``: the --finetune-from-model it records instead of the absolute path, the
    --save-dir relative to ``root``, where the run ran), and its run.json."""
    folder = root / save_dir
    folder.mkdir(parents=True)
    path = make_checkpoint(task_bin(root, data_bin), folder / "checkpoint_best.pt", "bert_a_tiny", [],
                           heads=False, task=GLUE_TASK)
    state = torch.load(path, weights_only=False)
    state["cfg"]["checkpoint"].update(finetune_from_model=recorded or str(pretrained), save_dir=save_dir,
                                      best_checkpoint_metric="accuracy", maximize_best_checkpoint_metric=True)
    state["optimizer_history"][-1]["num_updates"] = FINE_TUNING_UPDATES
    state["extra_state"].update(val_loss=DEV_ACCURACY, best=DEV_ACCURACY)
    torch.save(state, path)
    write_record(str(folder), {"task": "RTE", "checkpoint": os.path.realpath(pretrained),
                               "metric": "accuracy"})
    return path


@pytest.fixture(scope="module")
def fine_tuned(whole_data_bin, tmp_path_factory):  # noqa: F811
    """(root, the pre-trained checkpoint, the RTE fine-tune of it, the fine-tune's export)."""
    root = tmp_path_factory.mktemp("card")
    pretrained = make_checkpoint(whole_data_bin, root / "pretrained.pt", "bert_a_tiny", [], heads=False)
    state = torch.load(pretrained, weights_only=False)
    state["optimizer_history"][-1]["num_updates"] = PRETRAINING_UPDATES
    torch.save(state, pretrained)
    checkpoint = fine_tune(root, whole_data_bin, pretrained)
    return root, pretrained, checkpoint, export(str(checkpoint), str(whole_data_bin), str(root / "export"))


def card_of(folder):
    with open(os.path.join(folder, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_card_starts_with_the_hubs_yaml_header_naming_library_pipeline_and_tags(fine_tuned):
    *_, folder = fine_tuned
    assert header(card_of(folder)) == {
        "library_name": "transformers", "pipeline_tag": "text-classification",
        "tags": ["fairseq", "tupe-plugin", "absolute", "roberta"]}


def test_the_card_invents_no_license(fine_tuned):
    *_, folder = fine_tuned
    assert "license" not in header(card_of(folder)) and "license" not in card_of(folder).lower()


@pytest.mark.parametrize("heads, tag", [(False, "fill-mask"), (True, "fill-mask"),
                                        (("span",), "question-answering")],
                         ids=["no head", "both heads", "span head"])
def test_the_pipeline_tag_follows_the_exported_head(whole_data_bin, tmp_path, heads, tag):  # noqa: F811
    checkpoint = make_checkpoint(whole_data_bin, tmp_path / "model.pt", "tupe_r_tiny", [], heads=heads)
    folder = export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out"))
    card = card_of(folder)
    assert header(card)["pipeline_tag"] == tag
    assert header(card)["tags"] == ["fairseq", "tupe-plugin", "untied", "t5"]
    loader = {"fill-mask": "AutoModelForMaskedLM", "question-answering": "AutoModelForQuestionAnswering"}[tag]
    assert f"model = {loader}.from_pretrained(FOLDER, trust_remote_code=True)\n" in card


def test_a_fine_tunes_card_gives_the_pre_training_of_the_checkpoint_it_started_from(fine_tuned):
    *_, folder = fine_tuned
    assert (f"- pre-training: {PRETRAINING_UPDATES} updates on `data-bin` (as `pretrained.pt`, the "
            "checkpoint the fine-tuning started from, records them)\n") in card_of(folder)


def test_a_fine_tunes_card_names_its_task_updates_and_data(fine_tuned):
    *_, folder = fine_tuned
    card = card_of(folder)
    assert ("A BERT-style encoder pre-trained with the tupe-plugin for fairseq and fine-tuned on RTE, "
            "exported by `tupe-export-hf`.") in card
    assert (f"- fine-tuning: RTE (fairseq's `sentence_prediction` task), {FINE_TUNING_UPDATES} updates on "
            "`RTE-bin` (as the checkpoint records them)\n") in card


def test_a_fine_tunes_card_names_its_labels(fine_tuned):
    *_, folder = fine_tuned
    assert "- labels: 0 `entailment`, 1 `not_entailment` (`id2label`, from the data's `label/dict.txt`)\n" \
        in card_of(folder)


def test_a_fine_tunes_card_gives_the_dev_score_its_run_recorded_naming_the_metric(fine_tuned):
    *_, folder = fine_tuned
    assert ("- dev accuracy: 62.5 (this checkpoint's, as the fine-tuning's validation recorded it; fairseq's "
            "`--best-checkpoint-metric accuracy`, higher is better)\n") in card_of(folder)


def test_a_fine_tunes_card_loads_it_with_the_classifiers_auto_class(fine_tuned):
    *_, folder = fine_tuned
    assert "model = AutoModelForSequenceClassification.from_pretrained(FOLDER)\n" in card_of(folder)


def test_the_pre_training_is_unknown_when_the_checkpoint_the_fine_tune_started_from_is_gone(
        fine_tuned, whole_data_bin, tmp_path):  # noqa: F811
    _, pretrained, checkpoint, _ = fine_tuned
    shutil.copy(pretrained, tmp_path / "gone.pt")
    copy = fine_tune(tmp_path, whole_data_bin, tmp_path / "gone.pt")
    os.remove(tmp_path / "gone.pt")
    card = card_of(export(str(copy), str(whole_data_bin), str(tmp_path / "out")))
    assert ("- pre-training: unknown (`gone.pt`, the checkpoint the fine-tuning started from, is no longer "
            "at the path the fine-tuning recorded)\n") in card
    assert f"{PRETRAINING_UPDATES} updates" not in card


def test_a_start_recorded_relative_to_the_folder_the_fine_tuning_ran_in_is_read_from_its_save_dir(
        fine_tuned, whole_data_bin, tmp_path):  # noqa: F811
    _, pretrained, _, _ = fine_tuned
    (tmp_path / "checkpoints" / "pretrain").mkdir(parents=True)
    shutil.copy(pretrained, tmp_path / "checkpoints" / "pretrain" / "checkpoint_best.pt")
    copy = fine_tune(tmp_path, whole_data_bin, tmp_path / "checkpoints" / "pretrain" / "checkpoint_best.pt",
                     recorded="checkpoints/pretrain/checkpoint_best.pt", save_dir="checkpoints/RTE")
    card = card_of(export(str(copy), str(whole_data_bin), str(tmp_path / "out")))
    assert (f"- pre-training: {PRETRAINING_UPDATES} updates on `data-bin` (as `checkpoint_best.pt`, the "
            "checkpoint the fine-tuning started from, records them)\n") in card


def test_a_relative_start_is_unknown_once_the_fine_tune_left_its_save_dir(fine_tuned, whole_data_bin,  # noqa: F811
                                                                         tmp_path):
    _, pretrained, _, _ = fine_tuned
    copy = fine_tune(tmp_path, whole_data_bin, pretrained, recorded="pretrained.pt")
    shutil.move(copy, tmp_path / "moved.pt")
    card = card_of(export(str(tmp_path / "moved.pt"), str(whole_data_bin), str(tmp_path / "out")))
    assert ("- pre-training: unknown (`pretrained.pt`, the checkpoint the fine-tuning started from, is "
            "recorded relative to the folder the fine-tuning ran in, which is unknown: the checkpoint does "
            "not lie in a --save-dir recorded relative to it)\n") in card


def test_a_fine_tune_of_a_fine_tune_gives_the_pre_training_of_the_first(fine_tuned, whole_data_bin,  # noqa: F811
                                                                       tmp_path):
    *_, checkpoint, _ = fine_tuned
    second = fine_tune(tmp_path, whole_data_bin, checkpoint)
    card = card_of(export(str(second), str(whole_data_bin), str(tmp_path / "out")))
    assert (f"- pre-training: {PRETRAINING_UPDATES} updates on `data-bin` (as `pretrained.pt`, the "
            "checkpoint the fine-tuning started from, records them)\n") in card


def recorded_start(checkpoint, path, start):
    """A copy of ``checkpoint`` at ``path`` that records ``start`` as its --finetune-from-model."""
    state = torch.load(checkpoint, weights_only=False)
    state["cfg"]["checkpoint"]["finetune_from_model"] = start
    torch.save(state, path)
    return path


@pytest.mark.parametrize("start, unknown", [
    (None, "unknown (the fine-tuning records no checkpoint it started from)"),
    ("{tmp}/not-a-checkpoint.pt", "unknown (`not-a-checkpoint.pt`, the checkpoint the fine-tuning started "
                                  "from, cannot be read)"),
    ("{tmp}/itself.pt", "unknown (`itself.pt`, the checkpoint the fine-tuning started from, is the exported "
                        "checkpoint or one already followed, overwritten since)"),
], ids=["none recorded", "unreadable", "itself"])
def test_the_pre_training_is_unknown_where_the_start_gives_none(fine_tuned, whole_data_bin, tmp_path, start,  # noqa: F811
                                                                unknown):
    *_, checkpoint, _ = fine_tuned
    (tmp_path / "not-a-checkpoint.pt").write_text("notes")
    path = recorded_start(checkpoint, tmp_path / "itself.pt", start and start.format(tmp=tmp_path))
    card = card_of(export(str(path), str(whole_data_bin), str(tmp_path / "out")))
    assert f"- pre-training: {unknown}\n" in card


def test_without_its_run_record_a_fine_tune_is_named_after_its_glue_data_folder(fine_tuned, whole_data_bin,  # noqa: F811
                                                                               tmp_path):
    *_, checkpoint, _ = fine_tuned
    shutil.copy(checkpoint, tmp_path / "rte.pt")
    card = card_of(export(str(tmp_path / "rte.pt"), str(whole_data_bin), str(tmp_path / "out")))
    assert "- fine-tuning: RTE (fairseq's `sentence_prediction` task)" in card


def squad_fine_tune(folder, data_bin, evaluation):
    """``folder/checkpoint_best.pt``, a SQuAD fine-tune (fairseq's squad_span task, a span head) as
    tupe-finetune-squad leaves it, ``evaluation`` written to its eval.log after it (None: no eval.log)."""
    folder.mkdir()
    path = make_checkpoint(data_bin, folder / "checkpoint_best.pt", "bert_a_tiny", [], heads=("span",))
    state = torch.load(path, weights_only=False)
    state["cfg"]["task"]["_name"] = "squad_span"
    torch.save(state, path)
    if evaluation is not None:
        (folder / "eval.log").write_text(evaluation, encoding="utf-8")
    return path


def test_a_squad_fine_tunes_card_gives_the_official_dev_em_and_f1_of_its_evaluation(whole_data_bin,  # noqa: F811
                                                                                     tmp_path):
    evaluation = 'evaluating\n{"exact_match": 10.0, "f1": 20.0}\n{"exact_match": 12.5, "f1": 30.25}\n'
    checkpoint = squad_fine_tune(tmp_path / "squad", whole_data_bin, evaluation)
    card = card_of(export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out")))
    assert ("- dev EM 12.50, F1 30.25 (SQuAD's official evaluation of this checkpoint by "
            "`tupe-finetune-squad`, its `eval.log`)") in card


@pytest.mark.parametrize("evaluation", [None, "no scores\n"], ids=["no eval.log", "no score line"])
def test_a_squad_fine_tune_without_an_evaluation_has_no_official_score_line(whole_data_bin, tmp_path,  # noqa: F811
                                                                           evaluation):
    checkpoint = squad_fine_tune(tmp_path / "squad", whole_data_bin, evaluation)
    assert "- dev EM" not in card_of(export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out")))


def test_an_evaluation_older_than_the_checkpoint_is_not_its_score(whole_data_bin, tmp_path):  # noqa: F811
    checkpoint = squad_fine_tune(tmp_path / "squad", whole_data_bin, '{"exact_match": 12.5, "f1": 30.25}\n')
    os.utime(tmp_path / "squad" / "eval.log", (1, 1))
    assert "- dev EM" not in card_of(export(str(checkpoint), str(whole_data_bin), str(tmp_path / "out")))

# ---------------------------------------------------------------- the weights a head's export holds

LOAD_REPORTS = r"""
import contextlib, io, json, logging, sys
sys.modules["fairseq"] = None
sys.modules["tupe_plugin"] = None
import transformers
captured = io.StringIO()
logging.getLogger("transformers").addHandler(logging.StreamHandler(captured))
results = {}
for name, (folder, auto_class) in json.loads(sys.argv[1]).items():
    captured.seek(0)
    captured.truncate()
    with contextlib.redirect_stdout(captured):
        model, info = getattr(transformers, auto_class).from_pretrained(folder, trust_remote_code=True,
                                                                         output_loading_info=True)
    results[name] = dict(output=captured.getvalue(), unexpected=sorted(info["unexpected_keys"]),
                         model=type(model).__name__)
print(json.dumps(results))
"""
# name -> (arch, flags, task, heads, the Auto class of the export, the class it loads as)
HEAD_EXPORTS = {
    "roberta": ("bert_a_tiny", [], GLUE_TASK, False, "AutoModelForSequenceClassification",
                "RobertaForSequenceClassification"),
    "roformer": ("bert_rope_tiny", ["--pooler-activation-fn", "gelu"], GLUE_TASK, False,
                 "AutoModelForSequenceClassification", "RoFormerForSequenceClassification"),
    "deberta-v2": ("deberta_tiny", [], GLUE_TASK, False, "AutoModelForSequenceClassification",
                   "DebertaV2ForSequenceClassification"),
    "remote code": ("tupe_r_tiny", [], GLUE_TASK, False, "AutoModelForSequenceClassification",
                    "TupeForSequenceClassification"),
    "remote code, span head": ("tupe_r_tiny", [], None, ("span",), "AutoModelForQuestionAnswering",
                               "TupeForQuestionAnswering"),
}

# a masked LM's export loaded as a classifier: the report of unused weights the others must not give
MASKED_LM_AS_CLASSIFIER = "masked LM as a classifier"


@pytest.fixture(scope="module")
def head_exports(whole_data_bin, tmp_path_factory):  # noqa: F811
    """{name: (checkpoint, export)} of :data:`HEAD_EXPORTS` and of a masked LM loaded as a classifier (the
    report the others must not give); the transformers-only child's load reports."""
    root = tmp_path_factory.mktemp("head_exports")
    data = task_bin(root, whole_data_bin)
    exports, request = {}, {}
    control = ("bert_a_tiny", [], None, False, "AutoModelForSequenceClassification", None)
    for name, (arch, flags, task, heads, auto_class, _) in dict(HEAD_EXPORTS,
                                                                **{MASKED_LM_AS_CLASSIFIER: control}).items():
        stem = name.replace(" ", "-").replace(",", "")
        checkpoint = make_checkpoint(data if task else whole_data_bin, root / f"{stem}.pt", arch, flags,
                                     heads=heads, **({"task": task} if task else {}))
        exports[name] = checkpoint, export(str(checkpoint), str(whole_data_bin), str(root / stem))
        request[name] = exports[name][1], auto_class
    output = transformers_only(LOAD_REPORTS, json.dumps(request), modules=root / "modules")
    return exports, json.loads(output.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(HEAD_EXPORTS))
def test_a_classifier_or_span_export_loads_without_a_report_of_unused_masked_lm_weights(head_exports, name):
    _, reports = head_exports
    report = reports[name]
    assert report["model"] == HEAD_EXPORTS[name][-1]
    assert report["unexpected"] == [] and "lm_head" not in report["output"], report["output"]


def test_the_load_reports_are_captured(head_exports):
    _, reports = head_exports
    report = reports[MASKED_LM_AS_CLASSIFIER]
    assert "lm_head" in report["output"] and any(key.startswith("lm_head.") for key in report["unexpected"])


@pytest.mark.parametrize("name", sorted(HEAD_EXPORTS))
def test_a_classifier_or_span_export_holds_no_masked_lm_head(head_exports, name):
    exports, _ = head_exports
    with open(os.path.join(exports[name][1], "model.safetensors"), "rb") as f:
        names = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert not [key for key in names if key.startswith(MASKED_LM_NAMES)]


@pytest.mark.parametrize("name", ["roberta", "remote code"])
def test_convert_hf_on_a_classifier_export_gives_a_fresh_masked_lm_head_and_says_so(
        head_exports, name, tmp_path, caplog):
    exports, _ = head_exports
    checkpoint, folder = exports[name]
    with caplog.at_level(logging.INFO, logger="convert_hf"):
        convert(folder, str(tmp_path / "back"))
    assert ("the export of a classification head holds no masked-LM head: the checkpoint's (encoder.lm_head."
            "{bias, dense.bias, dense.weight, layer_norm.bias, layer_norm.weight}) is freshly initialised, "
            "its weight tied to the word embeddings") in caplog.messages
    original = torch.load(checkpoint, weights_only=False)["model"]
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(tmp_path / "back" / "model.pt")], arg_overrides={"load_checkpoint_heads": True})
    back = models[0].state_dict()
    assert back.keys() == original.keys()
    for key in original:
        if key.startswith("encoder.lm_head.") and key != "encoder.lm_head.weight":
            continue
        assert torch.equal(back[key], original[key]), key


def test_convert_hf_refuses_a_masked_lm_export_without_its_masked_lm_head(head_exports, tmp_path):
    from tupe_plugin.conversion.hf import load_weights

    exports, _ = head_exports
    folder = tmp_path / "export"
    shutil.copytree(exports[MASKED_LM_AS_CLASSIFIER][1], folder)
    weights, _ = load_weights(str(folder))
    write_safetensors(str(folder / "model.safetensors"),
                      {key: value for key, value in weights.items() if not key.startswith("lm_head.")})
    with pytest.raises(ExportFolderError, match=r"has no masked-LM head \(encoder\.lm_head\.\{bias, "
                                                r".*which the export of a masked LM holds: export the "
                                                r"checkpoint again"):
        convert(str(folder), str(tmp_path / "back"))
