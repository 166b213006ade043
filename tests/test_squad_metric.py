"""The official SQuAD EM/F1 (tupe_plugin.squad.metric) and span decoding (tupe_plugin.squad.spans)."""

import json

import numpy as np
import pytest
from conftest import shared_data

from tupe_plugin.squad.metric import evaluate, exact_match, f1, normalize_answer
from tupe_plugin.squad.spans import best_answer


def squad_articles(count):
    with open(shared_data("squad", "dev-v1.1.json"), encoding="utf-8") as f:
        return json.load(f)["data"][:count]


def articles_of(*questions):
    """One article, one paragraph, the given questions: (id, answers, is_impossible)."""
    qas = [{"id": qid, "question": "?", "answers": [{"text": a, "answer_start": 0} for a in answers],
            "is_impossible": impossible} for qid, answers, impossible in questions]
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def test_gold_answers_score_100():
    articles = squad_articles(2)
    for choose in (0, -1):  # the first and the last gold answer of every question
        predictions = {qa["id"]: qa["answers"][choose]["text"]
                       for a in articles for p in a["paragraphs"] for qa in p["qas"]}
        assert evaluate(articles, predictions) == {"exact_match": 100.0, "f1": 100.0,
                                                   "total": len(predictions)}


def test_normalisation_drops_case_punctuation_articles_and_extra_spaces():
    assert normalize_answer("  The Cat's  hat, an APPLE!  a-b ") == "cats hat apple ab"
    assert normalize_answer("theatre anthem") == "theatre anthem"  # articles only as whole words


def test_hand_computed_scores():
    # partial overlap: "denver broncos team" vs "denver broncos": P = 2/3, R = 1
    assert exact_match("the Denver Broncos team", "Denver Broncos") == 0
    assert f1("the Denver Broncos team", "Denver Broncos") == pytest.approx(0.8)
    # articles and punctuation only
    assert exact_match("The Broncos!", "Broncos") == 1 and f1("The Broncos!", "Broncos") == 1
    # repeated tokens count with multiplicity: "b b c" vs "b c": P = 2/3, R = 1
    assert f1("b b c", "b c") == pytest.approx(0.8)
    assert f1("Denver", "Carolina Panthers") == 0


def test_questions_score_their_best_gold_and_missing_predictions_zero():
    articles = articles_of(
        ("q1", ["Santa Clara, California", "Levi's Stadium"], False),  # F1 2/5 R 2/3 -> 1/2; 2/5, 1 -> 4/7
        ("q2", ["Denver Broncos"], False),  # EM
        ("q3", ["the 50th Super Bowl"], False),  # no prediction: 0
        ("q4", [], True),  # v2.0 unanswerable, predicted empty: 1
        ("q5", [], True),  # unanswerable, predicted an answer: 0
        ("q6", ["Peyton Manning"], False),  # answerable, predicted empty: 0
    )
    predictions = {"q1": "Levi's Stadium in Santa Clara", "q2": "the Denver Broncos.", "q4": "",
                   "q5": "Manning", "q6": ""}
    scores = evaluate(articles, predictions)
    assert scores["total"] == 6
    assert scores["exact_match"] == pytest.approx(100 * 2 / 6)
    assert scores["f1"] == pytest.approx(100 * (4 / 7 + 1 + 1) / 6)


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
