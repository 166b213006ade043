"""From start/end logits of every window of a question to its answer text (BERT's SQuAD decoding).

A candidate answer is a span of passage tokens s <= e of at most ``max_answer_length`` tokens, s among
the ``n_best`` highest start logits and e among the ``n_best`` highest end logits of its window; its score
is start[s] + end[e]. Candidates of all windows compete; the text is the original context from the
first character of token s to the last of token e. The null score of a question is the lowest
start[0] + end[0] (the ``<s>`` token) over its windows; with ``allow_no_answer`` (SQuAD v2.0) the
answer is "" when null score - best span score > ``null_threshold``.
"""

from dataclasses import dataclass, field

import numpy as np


@dataclass
class QuestionAnswer:
    text: str
    null_score_diff: float  # null score - best span score (-inf when no span was found)
    nbest: list = field(default_factory=list)  # [(text, score)], best first


def window_candidates(start_logits, end_logits, feature, n_best, max_answer_length):
    """[(score, begin_char, end_char)] for the valid spans of one window."""
    first, offsets = feature["context_start"], feature["offsets"]
    last = first + len(offsets) - 1
    starts = first + np.argsort(-start_logits[first:last + 1], kind="stable")[:n_best]
    ends = first + np.argsort(-end_logits[first:last + 1], kind="stable")[:n_best]
    candidates = []
    for s in starts:
        for e in ends:
            if e < s or e - s + 1 > max_answer_length:
                continue
            begin, end = offsets[s - first][0], offsets[e - first][1]
            if begin < end:
                candidates.append((float(start_logits[s] + end_logits[e]), begin, end))
    return candidates


def best_answer(context, windows, n_best=20, max_answer_length=30, allow_no_answer=False,
                null_threshold=0.0):
    """The answer to one question from ``windows``: [(start_logits, end_logits, feature)]."""
    candidates, null_score = [], float("inf")
    for start_logits, end_logits, feature in windows:
        candidates += window_candidates(start_logits, end_logits, feature, n_best, max_answer_length)
        null_score = min(null_score, float(start_logits[0] + end_logits[0]))
    nbest, seen = [], set()
    for score, begin, end in sorted(candidates, key=lambda c: -c[0]):
        text = context[begin:end].strip()
        if text and text not in seen:
            seen.add(text)
            nbest.append((text, score))
        if len(nbest) == n_best:
            break
    best_score = nbest[0][1] if nbest else float("-inf")
    diff = null_score - best_score
    if not nbest or (allow_no_answer and diff > null_threshold):
        return QuestionAnswer("", diff, nbest)
    return QuestionAnswer(nbest[0][0], diff, nbest)
