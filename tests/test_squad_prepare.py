"""scripts/prepare_squad.py on slices of the real SQuAD dev-v1.1.json: windows, labels, character offsets,
and the errors and counted skips of bad input."""

import copy
import json
import logging

import pytest
import sentencepiece as spm
from conftest import test_data
from fairseq.data import Dictionary

from tupe_plugin.squad import prepare as prepare_squad
from tupe_plugin.squad.features import NO_ANSWER, load_features, load_spans


def dev_articles(count):
    with open(test_data("squad", "dev-v1.1.head.json"), encoding="utf-8") as f:
        return json.load(f)["data"][:count]


def write_squad(path, articles):
    path.write_text(json.dumps({"version": "1.1", "data": articles}), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    """A sentencepiece model of the first dev articles' passages and its pieces as a fairseq dict.txt."""
    root = tmp_path_factory.mktemp("squad_vocabulary")
    contexts = [p["context"] for a in dev_articles(3) for p in a["paragraphs"]]
    (root / "contexts.txt").write_text("\n".join(contexts), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(root / "contexts.txt"), model_prefix=str(root / "spm"),
                                   vocab_size=500, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
    dictionary = Dictionary()
    for i in range(3, processor.get_piece_size()):
        dictionary.add_symbol(processor.id_to_piece(i))
    dictionary.save(str(root / "dict.txt"))
    return str(root / "spm.model"), str(root / "dict.txt")


def prepare(vocabulary, out, articles_or_path, tmp_path, **options):
    path = articles_or_path if isinstance(articles_or_path, str) else \
        write_squad(tmp_path / "squad.json", articles_or_path)
    summary, _ = prepare_squad.prepare({"valid": path}, *vocabulary, str(out), **options)
    return summary["valid"], load_features(str(out), "valid"), load_spans(str(out), "valid")


def labelled_text(feature, span, context):
    first, offsets = feature["context_start"], feature["offsets"]
    return context[offsets[span[0] - first][0]:offsets[span[1] - first][1]]


def test_labelled_spans_recover_the_gold_answer_text(vocabulary, tmp_path):
    articles = [dict(a, paragraphs=a["paragraphs"][:12]) for a in dev_articles(3)]
    contexts = {qa["id"]: (p["context"], qa["answers"][0]["text"])
                for a in articles for p in a["paragraphs"] for qa in p["qas"]}
    counts, features, spans = prepare(vocabulary, tmp_path / "out", articles, tmp_path, max_query_length=100)
    assert counts["questions"] == len(contexts) and counts["long_questions_skipped"] == 0
    recovered, exceptions = set(), []
    for feature, span in zip(features, spans):
        if span[0] == NO_ANSWER:
            continue
        context, gold = contexts[feature["id"]]
        text = labelled_text(feature, span, context)
        recovered.add(feature["id"])
        if text != gold:
            exceptions.append((gold, text))
    assert recovered == set(contexts)  # every question has a window holding its answer
    # the exceptions are answers that end or start inside a sentencepiece piece ("39" of "739")
    assert all(gold in text for gold, text in exceptions), exceptions
    assert len(exceptions) <= 0.02 * len(spans[spans[:, 0] != NO_ANSWER])


def test_long_passage_gets_several_windows_and_the_answer_lands_in_the_right_ones(vocabulary, tmp_path):
    article = copy.deepcopy(dev_articles(1)[0])
    paragraph = article["paragraphs"][0]
    paragraph["qas"] = [qa for qa in paragraph["qas"] if qa["answers"][0]["answer_start"] > 200][:1]
    answer = paragraph["qas"][0]["answers"][0]
    begin, end = answer["answer_start"], answer["answer_start"] + len(answer["text"])
    article["paragraphs"] = [paragraph]
    counts, features, spans = prepare(vocabulary, tmp_path / "out", [article], tmp_path,
                                      max_seq_length=48, doc_stride=10, max_query_length=30)
    assert counts["long_passages"] == 1 and len(features) >= 4
    pieces, offsets = prepare_squad.encode_context(
        spm.SentencePieceProcessor(model_file=vocabulary[0]), paragraph["context"])
    covered = {tuple(o) for f in features for o in f["offsets"]}
    assert covered == {tuple(o) for o in offsets}  # the windows cover the whole passage
    for feature, span in zip(features, spans):
        holds_answer = feature["offsets"][0][0] <= begin and feature["offsets"][-1][1] >= end
        assert (span[0] != NO_ANSWER) == holds_answer
        if holds_answer:
            assert labelled_text(feature, span, paragraph["context"]) == answer["text"]


def test_default_stride_and_question_length_are_the_papers_for_long_windows():
    assert prepare_squad.window_defaults(384) == (128, 64)
    assert prepare_squad.window_defaults(512) == (128, 64)
    assert prepare_squad.window_defaults(64, doc_stride=16, max_query_length=40) == (16, 40)


def test_short_window_gets_overlapping_windows_with_room_for_the_passage(vocabulary, tmp_path):
    articles = [dict(a, paragraphs=a["paragraphs"][:2]) for a in dev_articles(1)]
    counts, features, _ = prepare(vocabulary, tmp_path / "out", articles, tmp_path, max_seq_length=64)
    assert prepare_squad.window_defaults(64) == (21, 32)
    assert counts["features"] > counts["questions"] - counts["long_questions_skipped"] > 0
    windows = [f for f in features if f["id"] == features[0]["id"]]
    assert all(f["context_start"] + len(f["offsets"]) + 1 <= 64 for f in features)
    assert len(windows) > 1 and windows[1]["offsets"][0] in windows[0]["offsets"]  # they overlap


def test_unanswerable_question_is_labelled_with_the_first_token(vocabulary, tmp_path):
    article = copy.deepcopy(dev_articles(1)[0])
    article["paragraphs"] = article["paragraphs"][:1]
    for qa in article["paragraphs"][0]["qas"]:
        qa["answers"], qa["is_impossible"] = [], True
    counts, features, spans = prepare(vocabulary, tmp_path / "out", [article], tmp_path)
    assert counts["questions"] == len(article["paragraphs"][0]["qas"])
    assert (spans == NO_ANSWER).all() and len(features) == len(spans) >= counts["questions"]


def test_unanswerable_questions_of_a_v2_file_get_no_answer_span_and_the_others_do(vocabulary, tmp_path):
    path = test_data("squad", "dev-v2.0-style.head.json")
    with open(path, encoding="utf-8") as f:
        qas = [qa for a in json.load(f)["data"] for p in a["paragraphs"] for qa in p["qas"]]
    unanswerable = {qa["id"] for qa in qas if qa["is_impossible"]}
    counts, features, spans = prepare(vocabulary, tmp_path / "out", path, tmp_path, max_query_length=100)
    assert counts["questions"] == len(qas) and counts["long_questions_skipped"] == 0
    assert {f["id"] for f in features} == {qa["id"] for qa in qas}
    answered = {f["id"] for f, span in zip(features, spans) if span[0] != NO_ANSWER}
    assert unanswerable and answered == {qa["id"] for qa in qas} - unanswerable


def test_file_that_is_not_json_names_the_file(vocabulary, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"version": "1.1", "data": [', encoding="utf-8")
    with pytest.raises(prepare_squad.SquadFormatError, match=rf"{path}: not valid JSON"):
        prepare(vocabulary, tmp_path / "out", str(path), tmp_path)


def test_entry_without_a_field_names_the_entry(vocabulary, tmp_path):
    articles = copy.deepcopy(dev_articles(1))
    qa = articles[0]["paragraphs"][1]["qas"][2]
    del qa["question"]
    with pytest.raises(prepare_squad.SquadFormatError,
                       match=rf"data\[0\]\.paragraphs\[1\]\.qas\[2\] \(id {qa['id']}\): missing 'question'"):
        prepare(vocabulary, tmp_path / "out", articles, tmp_path)
    del articles[0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"]
    with pytest.raises(prepare_squad.SquadFormatError,
                       match=r"qas\[0\] .*answers\[0\]: missing 'answer_start'"):
        prepare(vocabulary, tmp_path / "out", articles, tmp_path)


def test_command_line_stops_with_the_error(vocabulary, tmp_path):
    path = write_squad(tmp_path / "squad.json", [{"title": "no paragraphs"}])
    with pytest.raises(SystemExit,
                       match=r"tupe-prepare-squad: error: .*squad.json: data\[0\]: missing 'paragraphs'"):
        prepare_squad.main(["--valid-file", path, "--sentencepiece-model", vocabulary[0],
                            "--dict", vocabulary[1], "--out", str(tmp_path / "out")])


def test_question_longer_than_the_limit_is_skipped_logged_and_counted(vocabulary, tmp_path, caplog):
    articles = copy.deepcopy(dev_articles(1))
    articles[0]["paragraphs"] = articles[0]["paragraphs"][:1]
    qas = articles[0]["paragraphs"][0]["qas"]
    qas[1]["question"] = " ".join([qas[1]["question"]] * 20)
    with caplog.at_level(logging.WARNING, logger="prepare_squad"):
        counts, features, _ = prepare(vocabulary, tmp_path / "out", articles, tmp_path)
    assert counts["long_questions_skipped"] == 1 and counts["questions"] == len(qas)
    assert f"question {qas[1]['id']}: " in caplog.text and "> --max-query-length 64, skipped" in caplog.text
    assert qas[1]["id"] not in {f["id"] for f in features}


def test_answer_not_matching_the_context_is_counted_logged_and_skipped_in_train(vocabulary, tmp_path,
                                                                               caplog):
    articles = copy.deepcopy(dev_articles(1))
    articles[0]["paragraphs"] = articles[0]["paragraphs"][:1]
    qas = articles[0]["paragraphs"][0]["qas"]
    qas[0]["answers"][0]["answer_start"] += 3
    path = write_squad(tmp_path / "squad.json", articles)
    with caplog.at_level(logging.WARNING, logger="prepare_squad"):
        summary, _ = prepare_squad.prepare({"train": path, "valid": path}, *vocabulary, str(tmp_path / "out"))
    assert summary["train"]["mismatched_answers"] == summary["valid"]["mismatched_answers"] == 1
    assert f"question {qas[0]['id']}: answer {qas[0]['answers'][0]['text']!r} differs" in caplog.text
    assert qas[0]["id"] not in {f["id"] for f in load_features(str(tmp_path / "out"), "train")}
    assert qas[0]["id"] in {f["id"] for f in load_features(str(tmp_path / "out"), "valid")}
