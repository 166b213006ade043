"""The files ``tupe-prepare-squad`` writes for one split, read by the ``squad_span`` task and by
``tupe-evaluate-squad``.

A *feature* is one window of one question: ``<s> question </s> passage window </s>``.

- ``SPLIT.tokens.{bin,idx}``: the token ids of every feature (fairseq mmap dataset, ids of ``dict.txt``);
- ``SPLIT.spans.npy``: (features, 2) int64, the start and end token of the answer in each feature;
  ``(0, 0)`` (the ``<s>`` token) when the window holds no answer (SQuAD v2.0 unanswerable questions, and
  windows that miss the answer);
- ``SPLIT.features.jsonl``: one JSON object a line, ``{"id": question id, "context_start": index of the
  first passage token, "offsets": [[begin, end], ...]}``, the character span in the original context of
  each passage token (end exclusive; a whitespace-only piece has begin == end).
"""

import json
import os

import numpy as np

NO_ANSWER = 0


def tokens_prefix(data_dir, split):
    return os.path.join(data_dir, f"{split}.tokens")


def spans_path(data_dir, split):
    return os.path.join(data_dir, f"{split}.spans.npy")


def features_path(data_dir, split):
    return os.path.join(data_dir, f"{split}.features.jsonl")


def load_spans(data_dir, split):
    return np.load(spans_path(data_dir, split))


def load_features(data_dir, split):
    """The per-feature question id, first passage token and passage token offsets, in feature order."""
    with open(features_path(data_dir, split), encoding="utf-8") as f:
        return [json.loads(line) for line in f]
