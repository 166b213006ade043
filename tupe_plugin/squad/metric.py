"""The official SQuAD metrics, each version's evaluation script's rules, written from their definition.

Both versions normalise an answer the same way: lower-case, remove punctuation (``string.punctuation``),
remove the articles a/an/the as whole words, collapse whitespace. Exact match (EM) is 1 when the
normalised prediction equals the normalised gold answer; F1 is the harmonic mean of precision and recall
over the whitespace tokens of the two normalised strings (counted with multiplicity). A question scores
the maximum over its gold answers. The versions differ in the details:

SQuAD v1.1 (``evaluate-v1.1.py``)
    every listed gold answer counts, also one that normalises to the empty string (the v1.1 dev set
    has a few lone "." answers): a prediction normalising to "" is an exact match of such a gold
    answer, but its F1 is 0 (no common token). The totals are means over **all** questions of the
    data set; a question without a prediction scores 0. Output: ``{"exact_match": ..., "f1": ...}``.

SQuAD v2.0 (``evaluate-v2.0.py``)
    gold answers normalising to "" are dropped; a question left without gold answers (unanswerable)
    has the single gold answer "". When either side normalises to no token, F1 is 1 if both do and 0
    otherwise. The totals are means over the questions **with a prediction** (the official script
    prints "Missing prediction for ID" and leaves them out), also split into ``HasAns_*`` (questions
    with a gold answer) and ``NoAns_*``. Output keys: ``exact``, ``f1``, ``total``, ``HasAns_exact``,
    ``HasAns_f1``, ``HasAns_total``, ``NoAns_exact``, ``NoAns_f1``, ``NoAns_total``. Without a
    no-answer probability file, which the plugin does not write, no threshold is applied.
"""

import collections
import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
VERSIONS = ("1.1", "2.0")


def normalize_answer(text):
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction, gold):
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction, gold, version="2.0"):
    """Token F1; ``version`` decides the case of a side without tokens (v1.1: 0, v2.0: 1 if both)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version == "2.0" and (not predicted or not expected):
        return float(predicted == expected)
    common = sum((collections.Counter(predicted) & collections.Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def gold_answers(question, version="2.0"):
    """The gold answer texts the version's script compares with.

    v1.1: every listed answer. v2.0: those not normalising to "", or ``[""]`` when none is left.
    """
    answers = [a["text"] for a in question.get("answers", [])]
    if version == "1.1":
        return answers
    return [text for text in answers if normalize_answer(text)] or [""]


def questions(articles):
    for article in articles:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def evaluate(articles, predictions, version="1.1"):
    """The version's official scores (percent) of ``predictions`` ({question id: text}).

    ``articles`` is the ``"data"`` list of a SQuAD JSON file. Returns the official script's output
    dict (see the module docstring) plus ``"missing"``: the ids of questions without a prediction.
    """
    if version not in VERSIONS:
        raise ValueError(f"SQuAD version must be one of {', '.join(VERSIONS)}, got {version!r}")
    em, f1s, has_answer, missing = {}, {}, {}, []
    for question in questions(articles):
        qid = question["id"]
        golds = gold_answers(question, version)
        has_answer[qid] = any(normalize_answer(text) for text in golds)
        if qid not in predictions:
            missing.append(qid)
            continue
        prediction = predictions[qid]
        em[qid] = max(exact_match(prediction, gold) for gold in golds)
        f1s[qid] = max(f1(prediction, gold, version) for gold in golds)
    if version == "1.1":
        total = len(em) + len(missing)
        return {"exact_match": 100.0 * sum(em.values()) / max(total, 1),
                "f1": 100.0 * sum(f1s.values()) / max(total, 1), "total": total, "missing": missing}
    scores = _means(em, f1s, list(em))
    scores = {"exact": scores["exact"], "f1": scores["f1"], "total": scores["total"]}
    split = (("HasAns", [q for q in em if has_answer[q]]), ("NoAns", [q for q in em if not has_answer[q]]))
    for name, ids in split:
        if ids:
            scores.update({f"{name}_{key}": value for key, value in _means(em, f1s, ids).items()})
    scores["missing"] = missing
    return scores


def _means(em, f1s, ids):
    total = len(ids)
    return {"exact": 100.0 * sum(em[q] for q in ids) / max(total, 1),
            "f1": 100.0 * sum(f1s[q] for q in ids) / max(total, 1), "total": total}


def official_output(scores):
    """The dict the version's official script prints: ``scores`` without the plugin's extras."""
    return {key: value for key, value in scores.items() if key not in ("missing", "total")
            or (key == "total" and "exact" in scores)}
