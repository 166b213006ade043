"""The official SQuAD EM/F1 (tupe_plugin.squad.metric) and span decoding (tupe_plugin.squad.spans)."""

import json

import numpy as np
import pytest
from conftest import test_data

from tupe_plugin.squad.metric import evaluate, exact_match, f1, gold_answers, normalize_answer
from tupe_plugin.squad.spans import best_answer


def articles_of(*questions):
    """One article, one paragraph, the given questions: (id, answers, is_impossible)."""
    qas = [{"id": qid, "question": "?", "answers": [{"text": a, "answer_start": 0} for a in answers],
            "is_impossible": impossible} for qid, answers, impossible in questions]
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def dev_set():
    """The first 3 articles of the v1.1 dev set (1169 questions) and the paragraph holding question
    57340d124776f419006617bf (5 questions)."""
    articles = []
    for name in ("dev-v1.1.head.json", "dev-v1.1.lone-period.json"):
        with open(test_data("squad", name), encoding="utf-8") as f:
            articles += json.load(f)["data"]
    return articles


def gold_predictions(articles, choose):
    return {qa["id"]: qa["answers"][choose]["text"] for a in articles for p in a["paragraphs"]
            for qa in p["qas"]}


def test_v11_first_gold_answers_of_the_dev_articles_score_100():
    articles = dev_set()
    scores = evaluate(articles, gold_predictions(articles, 0), "1.1")
    assert (scores["exact_match"], scores["f1"], scores["total"]) == (100.0, 100.0, 1174)


def test_v11_every_listed_gold_answer_is_an_exact_match_also_a_lone_period():
    # The last listed answer of question 57340d124776f419006617bf is ".": the v1.1 script keeps it, so
    # predicting it is an exact match (both normalise to ""), with F1 0 (no common token).
    articles = dev_set()
    scores = evaluate(articles, gold_predictions(articles, -1), "1.1")
    assert scores["exact_match"] == 100.0
    assert scores["f1"] == 100.0 * 1173 / 1174


def test_v20_rules_drop_the_lone_period_gold_answer():
    articles = dev_set()
    scores = evaluate(articles, gold_predictions(articles, -1), "2.0")
    assert scores["exact"] == scores["f1"] == 100.0 * 1173 / 1174
    assert scores["total"] == scores["HasAns_total"] == 1174 and "NoAns_total" not in scores


def test_normalisation_drops_case_punctuation_articles_and_extra_spaces():
    assert normalize_answer("  The Cat's  hat, an APPLE!  a-b ") == "cats hat apple ab"
    assert normalize_answer("theatre anthem") == "theatre anthem"  # articles only as whole words


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_hand_computed_token_scores(version):
    # partial overlap: "denver broncos team" vs "denver broncos": P = 2/3, R = 1
    assert exact_match("the Denver Broncos team", "Denver Broncos") == 0
    assert f1("the Denver Broncos team", "Denver Broncos", version) == pytest.approx(0.8)
    # articles and punctuation only
    assert exact_match("The Broncos!", "Broncos") == 1 and f1("The Broncos!", "Broncos", version) == 1
    # repeated tokens count with multiplicity: "b b c" vs "b c": P = 2/3, R = 1
    assert f1("b b c", "b c", version) == pytest.approx(0.8)
    assert f1("Denver", "Carolina Panthers", version) == 0


@pytest.mark.parametrize("prediction, gold, v11, v20", [
    ("", "", 0.0, 1.0),        # both without tokens: v1.1 finds no common token, v2.0 calls it agreement
    (".", "the", 0.0, 1.0),    # both normalise to ""
    ("", "Broncos", 0.0, 0.0),
    ("Broncos", ".", 0.0, 0.0),
])
def test_f1_of_answers_without_tokens_per_version(prediction, gold, v11, v20):
    assert (f1(prediction, gold, "1.1"), f1(prediction, gold, "2.0")) == (v11, v20)


def test_v11_keeps_gold_answers_normalising_to_empty_and_v20_drops_them():
    articles = articles_of(("q", [".", "Broncos"], False))
    assert gold_answers(articles[0]["paragraphs"][0]["qas"][0], "1.1") == [".", "Broncos"]
    assert gold_answers(articles[0]["paragraphs"][0]["qas"][0], "2.0") == ["Broncos"]
    v11, v20 = evaluate(articles, {"q": "!"}, "1.1"), evaluate(articles, {"q": "!"}, "2.0")
    assert (v11["exact_match"], v11["f1"]) == (100.0, 0.0)
    assert (v20["exact"], v20["f1"]) == (0.0, 0.0)


def test_v11_averages_over_every_question_missing_predictions_score_zero():
    articles = articles_of(
        ("q1", ["Santa Clara, California", "Levi's Stadium"], False),  # F1 2/5 R 2/3 -> 1/2; 2/5, 1 -> 4/7
        ("q2", ["Denver Broncos"], False),  # EM
        ("q3", ["the 50th Super Bowl"], False),  # no prediction: 0
        ("q4", ["Peyton Manning"], False),  # predicted empty: 0
    )
    predictions = {"q1": "Levi's Stadium in Santa Clara", "q2": "the Denver Broncos.", "q4": ""}
    scores = evaluate(articles, predictions, "1.1")
    assert scores["total"] == 4 and scores["missing"] == ["q3"]
    assert scores["exact_match"] == pytest.approx(100 * 1 / 4)
    assert scores["f1"] == pytest.approx(100 * (4 / 7 + 1) / 4)


def test_v20_averages_over_predicted_questions_split_by_answerability():
    articles = articles_of(
        ("q1", ["Santa Clara, California", "Levi's Stadium"], False),  # 4/7 as above
        ("q2", ["Denver Broncos"], False),  # EM
        ("q3", ["the 50th Super Bowl"], False),  # no prediction: left out of every total
        ("q4", [], True),  # unanswerable, predicted empty: 1
        ("q5", [], True),  # unanswerable, predicted an answer: 0
        ("q6", ["Peyton Manning"], False),  # answerable, predicted empty: 0
    )
    predictions = {"q1": "Levi's Stadium in Santa Clara", "q2": "the Denver Broncos.", "q4": "",
                   "q5": "Manning", "q6": ""}
    scores = evaluate(articles, predictions, "2.0")
    assert scores["total"] == 5 and scores["missing"] == ["q3"]
    assert scores["exact"] == pytest.approx(100 * 2 / 5)
    assert scores["f1"] == pytest.approx(100 * (4 / 7 + 1 + 1) / 5)
    assert (scores["HasAns_total"], scores["NoAns_total"]) == (3, 2)
    assert scores["HasAns_exact"] == pytest.approx(100 / 3)
    assert scores["HasAns_f1"] == pytest.approx(100 * (4 / 7 + 1) / 3)
    assert (scores["NoAns_exact"], scores["NoAns_f1"]) == (50.0, 50.0)


def test_unknown_version_is_refused():
    with pytest.raises(ValueError, match="version must be one of 1.1, 2.0"):
        evaluate(articles_of(("q", ["a"], False)), {}, "3")


def window(start, end, context_start, offsets):
    return np.asarray(start, dtype=float), np.asarray(end, dtype=float), \
        {"id": "q", "context_start": context_start, "offsets": offsets}


CONTEXT = "Denver Broncos beat the Carolina Panthers"
#          0     6 7     14 15 19 23 24     32 33      41
OFFSETS = [[0, 6], [7, 14], [15, 19], [20, 23], [24, 32], [33, 41]]


def test_best_span_ends_after_it_starts_and_respects_the_length_limit():
    # tokens: <s> q </s> then six passage tokens from position 3
    start = [0, 9, 9, 1, 0, 0, 0, 5, 0, 0]
    end = [0, 9, 9, 6, 0, 0, 0, 0, 4, 0]
    # best start 7 (Carolina) > best end 3: invalid; next: start 7 with end 8 (5 + 4 = 9) vs 3..3 (1 + 6 = 7)
    answer = best_answer(CONTEXT, [window(start, end, 3, OFFSETS)], n_best=5, max_answer_length=30)
    assert answer.text == "Carolina Panthers"
    answer = best_answer(CONTEXT, [window(start, end, 3, OFFSETS)], n_best=6, max_answer_length=1)
    assert [text for text, _ in answer.nbest][:3] == ["Denver", "Carolina", "Panthers"]


def test_answers_compete_across_windows():
    first = window([0, 0, 0, 2, 0], [0, 0, 0, 0, 2], 3, OFFSETS[:2])  # "Denver Broncos", score 4
    second = window([0, 0, 0, 0, 3, 0], [0, 0, 0, 0, 0, 3], 3, OFFSETS[3:6])  # "Carolina Panthers", 6
    assert best_answer(CONTEXT, [first, second]).text == "Carolina Panthers"
    assert best_answer(CONTEXT, [first]).text == "Denver Broncos"


def test_no_answer_when_the_null_score_beats_the_best_span_by_the_threshold():
    windows = [window([3, 0, 0, 2, 0], [3, 0, 0, 0, 2], 3, OFFSETS[:2])]  # null 6, best span 4
    assert best_answer(CONTEXT, windows).text == "Denver Broncos"  # v1.1: always a span
    answer = best_answer(CONTEXT, windows, allow_no_answer=True, null_threshold=1.0)
    assert answer.text == "" and answer.null_score_diff == pytest.approx(2.0)
    assert best_answer(CONTEXT, windows, allow_no_answer=True, null_threshold=2.5).text == "Denver Broncos"
