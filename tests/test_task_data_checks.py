"""Bad GLUE / SQuAD task data is refused, naming the file and line or entry, before a model sees it."""

import json
import logging

import numpy as np
import pytest
from conftest import _Task, build_model, test_data
from fairseq.data import Dictionary

from tupe_plugin.checkpoints.vocabulary import (DictionaryFitError, check_dictionary_symbols,
                                                check_unknown_pieces, word_indices)
from tupe_plugin.glue import prepare as prepare_glue
from tupe_plugin.glue.tasks import GLUE_TASKS
from tupe_plugin.models import TupeRobertaModel
from tupe_plugin.models.task_checks import LabelCountError
from tupe_plugin.squad import evaluate as evaluate_squad
from tupe_plugin.squad import prepare as prepare_squad


def glue_file(tmp_path, task, rows, header=True, extra_lines=()):
    """The first ``rows`` examples of a real GLUE train file, with or without its header line."""
    with open(test_data("glue", task, "train.tsv"), encoding="utf-8") as f:
        lines = [next(f) for _ in range(rows + 1)]
    path = tmp_path / task / "train.tsv"
    path.parent.mkdir(exist_ok=True)
    path.write_text("".join(lines[0 if header else 1:]) + "".join(f"{line}\n" for line in extra_lines),
                    encoding="utf-8")
    return str(path)


# -- GLUE ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("score", ["5.5", "-0.2", "nan", "inf"])
def test_sts_b_score_outside_zero_to_five_is_refused_naming_the_line(score, tmp_path):
    path = glue_file(tmp_path, "STS-B", 3)
    rows, _ = prepare_glue.read_tsv(path, GLUE_TASKS["STS-B"])
    rows[1] = (rows[1][0], rows[1][1], score)
    with pytest.raises(prepare_glue.GlueFormatError,
                       match=rf"{path}:3: score '{score}' is outside STS-B's range \[0, 5\]"):
        prepare_glue.regression_targets(path, rows)


@pytest.mark.parametrize("task", ["SST-2", "RTE", "STS-B", "MRPC"])
def test_a_file_without_its_header_line_is_refused(task, tmp_path):
    path = glue_file(tmp_path, task, 12, header=False)
    with pytest.raises(prepare_glue.GlueFormatError, match=rf"{path}:1: expected the header line of {task}"):
        prepare_glue.read_tsv(path, GLUE_TASKS[task])


@pytest.mark.parametrize("task, column, columns", [("SST-2", 2, 2), ("RTE", 4, 4), ("MRPC", 1, 5),
                                                    ("STS-B", 10, 10)])
def test_a_file_without_the_label_column_is_refused_naming_the_column(task, column, columns, tmp_path):
    path = glue_file(tmp_path, task, 5)
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    for fields in rows:
        del fields[column - 1]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines("\t".join(fields) + "\n" for fields in rows)
    with pytest.raises(prepare_glue.GlueFormatError) as error:
        prepare_glue.read_tsv(path, GLUE_TASKS[task])
    assert str(error.value) == (
        f"{path}:1: the header names {columns - 1} columns ({', '.join(rows[0])}) where {task} needs "
        f"{columns}, its label in column {column}: the file has no label column (GLUE's test.tsv files have "
        f"none); give {task}'s train or dev file, with its labels")


@pytest.mark.parametrize("task, stray", [("SST-2", "2"), ("RTE", "neutral"), ("SST-2", "1 ")])
def test_more_labels_than_the_task_has_classes_is_refused(task, stray, tmp_path):
    path = glue_file(tmp_path, task, 20)
    rows, _ = prepare_glue.read_tsv(path, GLUE_TASKS[task])
    labels = [label for _, _, label in rows] + [stray + "x" if stray.endswith(" ") else stray]
    with pytest.raises(prepare_glue.GlueFormatError,
                       match=f"{path}: 3 distinct labels .* where {task} has 2"):
        prepare_glue.check_label_count(task, path, labels)


@pytest.mark.parametrize("unknown, total", [(31, 100), (21, 100), (1, 1)])
def test_a_dict_that_misses_many_pieces_is_refused_with_the_rate(unknown, total):
    with pytest.raises(DictionaryFitError,
                       match=rf"{unknown} of {total} pieces \({100 * unknown / total:.1f}%\) "
                             "of --sentencepiece-model spm.model are not in --dict dict.txt"):
        check_unknown_pieces(unknown, total, "dict.txt", "spm.model")


def test_a_few_unknown_pieces_are_only_logged(caplog):
    check_unknown_pieces(57, 1000, "dict.txt", "spm.model")
    assert "57 of 1000 pieces (5.7%)" in caplog.text and caplog.records[0].levelname == "WARNING"


def test_rare_unknown_characters_are_no_warning(caplog):
    caplog.set_level(logging.INFO)
    check_unknown_pieces(3, 10000, "dict.txt", "spm.model", ["—", "€"])
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "3 of 10000 pieces (0.0%) of --sentencepiece-model spm.model are not in --dict dict.txt and "
                 "become <unk> (e.g. '—', '€'): characters the pre-training text does not have")]


def test_glue_pieces_are_counted_against_the_dict(tmp_path):
    dictionary = Dictionary()
    for symbol in ("▁the", "▁film"):
        dictionary.add_symbol(symbol)
    dictionary.save(str(tmp_path / "dict.txt"))
    with pytest.raises(DictionaryFitError, match=r"3 of 5 pieces \(60.0%\)"):
        prepare_glue.check_pieces_in_dictionary([["▁the", "▁mov", "ie"], ["▁film", "▁x"]],
                                                str(tmp_path / "dict.txt"), "spm.model")


class Pieces:
    """A sentencepiece processor's piece_to_id over a fixed vocabulary."""

    def __init__(self, pieces):
        self.pieces = {piece: i for i, piece in enumerate(["<unk>", *pieces])}

    def unk_id(self):
        return 0

    def piece_to_id(self, piece):
        return self.pieces.get(piece, 0)


@pytest.mark.parametrize("symbols, foreign", [(["▁the", "▁cat", "s", "▁dog"], 2),
                                              ([f"w{i}" for i in range(10)], 10)])
def test_a_dict_of_another_sentencepiece_model_is_refused(symbols, foreign):
    dictionary = Dictionary()
    for symbol in symbols:
        dictionary.add_symbol(symbol)
    dictionary.add_symbol("<mask>")
    dictionary.pad_to_multiple_(8)
    with pytest.raises(DictionaryFitError,
                       match=f"{foreign} of the {len(symbols)} symbols of --dict dict.txt"):
        check_dictionary_symbols(dictionary, Pieces(["▁the", "s", "▁a"]), "dict.txt", "spm.model")


def test_words_of_a_dictionary_leave_out_special_symbols_mask_and_padding():
    dictionary = Dictionary()
    for symbol in ["▁the", "s", "<url>", "▁a"]:
        dictionary.add_symbol(symbol)
    dictionary.add_symbol("<mask>")
    dictionary.pad_to_multiple_(8)
    assert any(symbol.startswith("madeupword") for symbol in dictionary.symbols)
    assert [dictionary[index] for index in word_indices(dictionary)] == ["▁the", "s", "▁a"]


def test_a_dict_built_from_the_models_pieces_is_accepted():
    dictionary = Dictionary()
    for symbol in ["▁the", "s"]:
        dictionary.add_symbol(symbol)
    check_dictionary_symbols(dictionary, Pieces(["▁the", "s", "▁a"]), "dict.txt", "spm.model")


class LabelledTask(_Task):
    def __init__(self, dictionary, labels, num_classes, regression=False):
        super().__init__(dictionary, 32)
        self.label_dictionary = Dictionary()
        for label in labels:
            self.label_dictionary.add_symbol(label)
        self.cfg = type("Cfg", (), dict(num_classes=num_classes, regression_target=regression,
                                        data="GLUE-BIN"))


@pytest.mark.parametrize("labels, num_classes", [(["0", "1", "2"], 2), (["a", "b", "c", "d"], 3)])
def test_fine_tuning_with_more_labels_than_num_classes_is_refused(labels, num_classes, dictionary):
    args = build_model("tupe_r_tiny", dictionary).args
    with pytest.raises(LabelCountError,
                       match=f"GLUE-BIN/label/dict.txt\\) holds {len(labels)} labels .* but "
                             f"--num-classes is {num_classes}: pass --num-classes {len(labels)}"):
        TupeRobertaModel.build_model(args, LabelledTask(dictionary, labels, num_classes))


def test_as_many_labels_as_num_classes_build(dictionary):
    args = build_model("tupe_r_tiny", dictionary).args
    TupeRobertaModel.build_model(args, LabelledTask(dictionary, ["0", "1"], 2))


# -- SQuAD: preparation --------------------------------------------------------------------------------


def squad_file(tmp_path, paragraphs_per_article):
    """A small SQuAD v2.0 file: articles of paragraphs, each with its list of qas."""
    data = [{"title": f"a{i}", "paragraphs": [{"context": "The cat sat on the mat.", "qas": qas}
                                              for qas in article]}
            for i, article in enumerate(paragraphs_per_article)]
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "v2.0", "data": data}), encoding="utf-8")
    return str(path)


def qa(qid, impossible=False):
    answers = [] if impossible is True else [{"text": "cat", "answer_start": 4}]
    return {"id": qid, "question": "Who sat?", "answers": answers, "is_impossible": impossible}


@pytest.mark.parametrize("value", ["False", "true", 0, None])
def test_is_impossible_that_is_not_a_json_boolean_is_refused(value, tmp_path):
    path = squad_file(tmp_path, [[[qa("q1"), qa("q2", value)]]])
    with pytest.raises(prepare_squad.SquadFormatError,
                       match=rf"data\[0\].paragraphs\[0\].qas\[1\] \(id q2\): 'is_impossible' is "
                             rf"{type(value).__name__} {value!r}, expected true or false"):
        prepare_squad.read_squad(path)


def test_is_impossible_booleans_are_read(tmp_path):
    path = squad_file(tmp_path, [[[qa("q1", False), qa("q2", True)]]])
    assert [example.is_impossible for example in prepare_squad.read_squad(path)] == [False, True]


@pytest.mark.parametrize("articles, second", [
    ([[[qa("q1")], [qa("q1")]]], r"data\[0\].paragraphs\[1\].qas\[0\]"),
    ([[[qa("q1"), qa("q2")]], [[qa("q3"), qa("q2")]]], r"data\[1\].paragraphs\[0\].qas\[1\]"),
    ([[[qa("q1"), qa("q1")]]], r"data\[0\].paragraphs\[0\].qas\[1\]"),
])
def test_a_question_id_used_twice_is_refused_naming_both_entries(articles, second, tmp_path):
    path = squad_file(tmp_path, articles)
    with pytest.raises(prepare_squad.SquadFormatError, match=f"{second} .*: question id 'q.' is also used at "
                                                             r".*data\[\d\].paragraphs\[\d\].qas\[\d\]"):
        prepare_squad.read_squad(path)


# -- SQuAD: evaluation ---------------------------------------------------------------------------------


def feature(qid, first_offset, pieces=4, context_start=5):
    return {"id": qid, "context_start": context_start,
            "offsets": [[first_offset + 2 * i, first_offset + 2 * i + 1] for i in range(pieces)]}


def logits_for(features):
    return [(np.zeros(f["context_start"] + len(f["offsets"]) + 1),) * 2 for f in features]


GOOD = [feature("q1", 0), feature("q1", 4), feature("q2", 0, pieces=6)]


def test_features_matching_the_tokens_are_accepted():
    evaluate_squad.check_features(GOOD, logits_for(GOOD), "valid.features.jsonl")


@pytest.mark.parametrize("features, logits, message", [
    (GOOD[:2], logits_for(GOOD), " lists 2 features but the prepared tokens hold 3"),
    (GOOD + [feature("q3", 0)], logits_for(GOOD), " lists 4 features but the prepared tokens hold 3"),
    (GOOD[1:] + GOOD[:1], logits_for(GOOD), r":2: question q2 describes 12 tokens but feature 2 .* has 10"),
    ([*GOOD, feature("q1", 0)], logits_for([*GOOD, feature("q1", 0)]),
     ":4: question id q1 also names the question at line 1"),
    ([feature("q1", 0), feature("q1", 0, context_start=7)],
     logits_for([feature("q1", 0), feature("q1", 0, context_start=7)]),
     ":2: question id q1 also names the question at line 1"),
])
def test_features_that_do_not_match_the_tokens_are_refused(features, logits, message):
    with pytest.raises(evaluate_squad.FeatureMismatchError, match=f"valid.features.jsonl{message}"):
        evaluate_squad.check_features(features, logits, "valid.features.jsonl")


@pytest.mark.parametrize("flag, value", [("--n-best", 0), ("--max-answer-length", 0),
                                         ("--max-answer-length", -5), ("--n-best", -1)])
def test_decoding_limits_below_one_are_refused(flag, value, capsys):
    with pytest.raises(SystemExit):
        evaluate_squad.main(["--path", "unused.pt", "--data", "unused", "--gold-file", "unused.json",
                             flag, str(value)])
    assert f"{flag} must be at least 1, got {value}" in capsys.readouterr().err
