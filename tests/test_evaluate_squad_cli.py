"""scripts/evaluate_squad.py without a model: the official evaluation script's interface and output, and
the warning when most questions of --gold-file have no prediction."""

import json
from pathlib import Path

import pytest
from conftest import test_data

from tupe_plugin.squad import evaluate as evaluate_squad

DEV = test_data("squad", "dev-v1.1.head.json")
QUESTIONS = 1169  # of its 3 articles: 810, 247 and 112
DEV_V2 = test_data("squad", "dev-v2.0-style.head.json")


def write_predictions(tmp_path, articles=slice(None), gold_file=DEV):
    """The first gold answer of every question of ``articles``, "" for the unanswerable ones."""
    with open(gold_file, encoding="utf-8") as f:
        data = json.load(f)["data"]
    predictions = {qa["id"]: qa["answers"][0]["text"] if qa["answers"] else ""
                   for a in data[articles] for p in a["paragraphs"] for qa in p["qas"]}
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(predictions), encoding="utf-8")
    return str(path)


def test_gold_predictions_print_the_official_v11_output(tmp_path, capsys):
    evaluate_squad.main(["--gold-file", DEV, "--predictions", write_predictions(tmp_path)])
    captured = capsys.readouterr()
    assert captured.out == '{"exact_match": 100.0, "f1": 100.0}\n'
    assert captured.err == ""


def test_v2_rules_print_the_official_v20_keys(tmp_path, capsys):
    evaluate_squad.main(["--gold-file", DEV, "--predictions", write_predictions(tmp_path),
                         "--version-2-with-negative"])
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert list(printed) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"]
    assert printed["total"] == QUESTIONS and printed["exact"] == 100.0
    assert "is version 1.1, scored with the v2.0 rules" in captured.err


def test_v2_file_with_unanswerable_questions_prints_the_no_answer_keys(tmp_path, capsys):
    with open(DEV_V2, encoding="utf-8") as f:
        qas = [qa for a in json.load(f)["data"] for p in a["paragraphs"] for qa in p["qas"]]
    unanswerable = sum(qa["is_impossible"] for qa in qas)
    predictions = write_predictions(tmp_path, gold_file=DEV_V2)
    evaluate_squad.main(["--gold-file", DEV_V2, "--predictions", predictions, "--version-2-with-negative"])
    captured = capsys.readouterr()
    assert captured.err == ""  # the file's "v2.0" is the version of the rules
    printed = json.loads(captured.out)
    assert list(printed) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                             "NoAns_exact", "NoAns_f1", "NoAns_total"]
    assert (printed["total"], printed["NoAns_total"]) == (len(qas), unanswerable) and unanswerable > 0
    assert printed["exact"] == printed["NoAns_exact"] == printed["HasAns_f1"] == 100.0


def test_predictions_of_a_few_articles_warn_loudly_and_score_the_whole_file(tmp_path, capsys):
    predictions = write_predictions(tmp_path, slice(2, 3))  # the last article: 112 questions
    evaluate_squad.main(["--gold-file", DEV, "--predictions", predictions])
    captured = capsys.readouterr()
    assert f"WARNING: {QUESTIONS - 112} of the {QUESTIONS} questions" in captured.err
    assert "--max-articles" in captured.err
    # the official v1.1 rule, but said out loud
    assert json.loads(captured.out)["exact_match"] == 100.0 * 112 / QUESTIONS


def test_a_few_missing_predictions_warn_quietly(tmp_path, capsys):
    path = write_predictions(tmp_path)
    predictions = json.loads(Path(path).read_text())
    first = next(iter(predictions))
    del predictions[first]
    Path(path).write_text(json.dumps(predictions))
    evaluate_squad.main(["--gold-file", DEV, "--predictions", path])
    err = capsys.readouterr().err
    assert f"warning: 1 of the {QUESTIONS} questions" in err and first in err and "WARNING" not in err


@pytest.mark.parametrize("argv, message", [
    (["--path", "x.pt", "--predictions", "p.json"], "either --predictions"),
    ([], "give --path and --data"),
    (["--path", "x.pt"], "give --path and --data"),
])
def test_modes_are_exclusive_and_complete(argv, message, capsys):
    with pytest.raises(SystemExit):
        evaluate_squad.main(["--gold-file", DEV, *argv])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("content, flag, message", [
    (None, "--predictions", "no such file"),
    ("{not json", "--predictions", "is not a predictions JSON file"),
    ('["a list"]', "--predictions", "must map question ids"),
])
def test_bad_predictions_file_is_one_error_line_naming_it(tmp_path, content, flag, message):
    path = tmp_path / "predictions.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as error:
        evaluate_squad.main(["--gold-file", DEV, "--predictions", str(path)])
    assert str(error.value).startswith(f"tupe-evaluate-squad: error: {flag} {path}")
    assert message in str(error.value)


@pytest.mark.parametrize("answer", [42, None, ["Paris"]])
def test_a_predicted_answer_that_is_not_a_string_is_named_by_its_question_id(tmp_path, answer):
    path = Path(write_predictions(tmp_path))
    predictions = json.loads(path.read_text())
    first = next(iter(predictions))
    path.write_text(json.dumps({**predictions, first: answer}))
    with pytest.raises(SystemExit) as error:
        evaluate_squad.main(["--gold-file", DEV, "--predictions", str(path)])
    assert str(error.value).startswith(f"tupe-evaluate-squad: error: --predictions {path}: the answer of "
                                       f"{first} is {json.dumps(answer)}, not a text")


@pytest.mark.parametrize("output", ["gold", "gold-by-another-path", "checkpoint", "data-file"])
def test_an_output_that_is_an_input_is_refused_and_the_input_left_as_it_was(tmp_path, output):
    gold = tmp_path / "dev.json"
    gold.write_text(Path(DEV).read_text(encoding="utf-8"), encoding="utf-8")
    checkpoint, data = tmp_path / "model.pt", tmp_path / "bin"
    checkpoint.write_bytes(b"weights")
    data.mkdir()
    (data / "valid.features.pt").write_bytes(b"features")
    target = {"gold": gold, "gold-by-another-path": data / ".." / "dev.json", "checkpoint": checkpoint,
              "data-file": data / "valid.features.pt"}[output]
    before = Path(target).read_bytes()
    with pytest.raises(SystemExit) as error:
        evaluate_squad.main(["--gold-file", str(gold), "--path", str(checkpoint), "--data", str(data),
                             "--output", str(target)])
    assert str(error.value).startswith(f"tupe-evaluate-squad: error: --output {target} is ")
    assert "which the predictions would overwrite" in str(error.value)
    assert Path(target).read_bytes() == before


def test_a_v2_file_scored_without_the_v2_flag_names_the_flag(tmp_path):
    predictions = write_predictions(tmp_path, gold_file=DEV_V2)
    with pytest.raises(SystemExit, match=r"questions without an answer \(SQuAD v2\.0, e\.g\. \w+\): score it "
                                         "with --version-2-with-negative"):
        evaluate_squad.main(["--gold-file", DEV_V2, "--predictions", predictions])


def test_predicted_ids_not_in_the_gold_file_are_counted_apart(tmp_path, capsys):
    path = write_predictions(tmp_path, slice(2, 3))  # the last article: 112 questions
    predictions = json.loads(Path(path).read_text())
    predictions.update({"not-a-dev-id-1": "x", "not-a-dev-id-2": "y"})
    Path(path).write_text(json.dumps(predictions))
    evaluate_squad.main(["--gold-file", DEV, "--predictions", path])
    err = capsys.readouterr().err
    assert f"warning: 2 of the 114 predicted question ids are not in {DEV} (e.g. not-a-dev-id-1)" in err
    assert f"WARNING: {QUESTIONS - 112} of the {QUESTIONS} questions of {DEV} have no prediction (112 " \
           "predicted)" in err


def test_predictions_of_which_no_id_is_in_the_gold_file_stop_in_one_line(tmp_path):
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps({"q1": "Paris", "q2": "1999"}))
    with pytest.raises(SystemExit) as error:
        evaluate_squad.main(["--gold-file", DEV, "--predictions", str(path)])
    assert str(error.value) == (
        f"tupe-evaluate-squad: error: none of the 2 question ids of --predictions {path} (e.g. q1) is in "
        f"--gold-file {DEV}: score the predictions against the SQuAD JSON they were made from (and its "
        "--max-articles)")


@pytest.mark.parametrize("text", [5, ["Paris"], None])
@pytest.mark.parametrize("mode", [["--predictions", "predictions.json"], ["--path", "x.pt", "--data", "bin"]])
def test_a_gold_answer_that_is_not_a_string_is_named_with_its_question(tmp_path, monkeypatch, text, mode):
    monkeypatch.chdir(tmp_path)
    gold = tmp_path / "gold.json"
    qas = [{"id": "q1", "question": "Where?", "answers": [{"text": "Paris", "answer_start": 0}]},
           {"id": "q2", "question": "When?", "answers": [{"text": text, "answer_start": 6}]}]
    gold.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": "Paris 1999", "qas": qas}]}]}))
    (tmp_path / "predictions.json").write_text(json.dumps({"q1": "Paris", "q2": "1999"}))
    with pytest.raises(SystemExit) as error:
        evaluate_squad.main(["--gold-file", str(gold), *mode])
    assert str(error.value) == (
        f"tupe-evaluate-squad: error: --gold-file {gold}: data[0].paragraphs[0].qas[1] (id q2): "
        f"answers[0].text is {json.dumps(text)}: gold answers are "
        '[{"text": "a string", "answer_start": N}, ...]; correct the file')
