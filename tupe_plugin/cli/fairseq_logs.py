"""fairseq-train's logs (``--log-format simple``) read back: validation and train_inner lines, and the
best evaluation of a metric.

A ``nan`` evaluation (STS-B's correlations of constant predictions) is a failed evaluation: the best
evaluation is the best of the others, and a run whose every evaluation gave ``nan`` is a failed run,
with no best evaluation. tupe-collect-glue and the study's report both read runs this way.
"""

import math
import re
from typing import NamedTuple, Optional

VALID_LINE = re.compile(r"\| valid on 'valid' subset \| (.*)$")
TRAIN_INNER = re.compile(r"\| train_inner \| .*?: +\d+ / \d+ (.*)$")


def _fields(text, separator, joiner):
    fields = {}
    for item in text.split(separator):
        key, _, value = item.strip().partition(joiner)
        try:
            fields[key.strip()] = float(value)
        except ValueError:
            continue
    return fields


def valid_line_fields(line):
    """The fields (name -> float) of a validation line, None for another line."""
    match = VALID_LINE.search(line)
    return _fields(match.group(1), " | ", " ") if match else None


def valid_lines(log_path):
    """The fields (name -> float) of every validation line of a fairseq log, in order."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [fields for fields in map(valid_line_fields, f) if fields is not None]


def train_inner_lines(log_path):
    """The fields (name -> float) of every ``train_inner`` line of a fairseq log, in order."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [_fields(m.group(1), ", ", "=") for m in map(TRAIN_INNER.search, f) if m]


class Evaluations(NamedTuple):
    """The evaluations of one metric in a run's log."""

    metric: str
    best: Optional[dict]  # the validation line with the best finite value; None: every one gave nan
    count: int
    nan_count: int
    last: Optional[dict] = None  # the last validation line; None when it gave nan

    @property
    def failed(self):
        return self.best is None

    @property
    def score(self):
        """The best finite value of the metric, None for a failed run."""
        return None if self.failed else self.best[self.metric]

    def nan_summary(self):
        """``"N of M evaluations of METRIC gave nan"``."""
        return f"{self.nan_count} of {self.count} evaluations of {self.metric} gave nan"


def evaluations(log_path, metric):
    """The :class:`Evaluations` of ``metric`` (maximised) in the validation lines of ``log_path``.

    Of equal best values the first counts, as fairseq keeps its best checkpoint.
    Raises ValueError when no validation line reports ``metric``.
    """
    lines = [fields for fields in valid_lines(log_path) if metric in fields]
    if not lines:
        raise ValueError(f"{log_path}: no validation line reports {metric}")
    finite = [fields for fields in lines if not math.isnan(fields[metric])]
    best = max(finite, key=lambda fields: fields[metric]) if finite else None
    last = None if math.isnan(lines[-1][metric]) else lines[-1]
    return Evaluations(metric, best, len(lines), len(lines) - len(finite), last)
