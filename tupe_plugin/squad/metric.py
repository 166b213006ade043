"""The official SQuAD metrics (v1.1 and v2.0 evaluation scripts), written from their definition.

An answer is normalised by lower-casing, removing punctuation (``string.punctuation``), removing the
articles a/an/the as words, and collapsing whitespace. Exact match (EM) is 1 when the normalised
prediction equals the normalised gold answer; F1 is the harmonic mean of precision and recall over the
whitespace tokens of the two normalised strings (counted with multiplicity). Each question scores the
maximum over its gold answers; the totals are means over all questions of the data set, in percent, a
question without a prediction scoring 0. SQuAD v2.0: an unanswerable question has the single gold
answer "" — only an empty prediction scores 1, and an empty prediction against an answer scores 0.
"""

import collections
import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text):
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction, gold):
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction, gold):
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def gold_answers(question):
    """The question's gold answer texts; ``[""]`` for a v2.0 question without answer."""
    answers = [a["text"] for a in question.get("answers", []) if normalize_answer(a["text"])]
    return answers or [""]


def evaluate(articles, predictions):
    """EM and F1 in percent, as the official script computes them, plus the question count.

    ``articles`` is the ``"data"`` list of a SQuAD JSON file; ``predictions`` maps question id to text.
    """
    em_sum = f1_sum = total = 0
    for article in articles:
        for paragraph in article["paragraphs"]:
            for question in paragraph["qas"]:
                total += 1
                if question["id"] not in predictions:
                    continue
                prediction, golds = predictions[question["id"]], gold_answers(question)
                em_sum += max(exact_match(prediction, gold) for gold in golds)
                f1_sum += max(f1(prediction, gold) for gold in golds)
    return {"exact_match": 100.0 * em_sum / max(total, 1), "f1": 100.0 * f1_sum / max(total, 1),
            "total": total}
