"""Stop when fairseq would skip more than a small fraction of the training data for being too long.

fairseq drops the samples longer than the model's ``max_positions`` from every training epoch after one
WARNING ("N samples have invalid sizes and will be skipped"). With ``--sample-break-mode complete``
(whole lines per sample) and lines longer than ``--tokens-per-sample``, that was 92 % of the tokens of a
corpus, and the run trained on the rest with exit 0. Above :data:`MAX_SKIPPED_FRACTION` of the tokens the
run now stops, saying how much and what to change; ``--allow-skipped-data`` accepts the loss and keeps
fairseq's warning. It is a flag of the plugin's architectures only: building one of them sets
``task.allow_skipped_data``, and the tasks of other models (which have no such flag) are left to fairseq.
"""

import logging

import numpy as np
from fairseq.tasks import FairseqTask
from ..user_input.user_errors import UserError

logger = logging.getLogger(__name__)

MAX_SKIPPED_FRACTION = 0.01


class SkippedDataError(UserError, ValueError):
    """More than :data:`MAX_SKIPPED_FRACTION` of a split would be skipped for its length."""


def _tokens(dataset, indices):
    """Tokens of the samples ``indices``, summed in int64 (fairseq stores sizes as uint16 when they fit)."""
    indices = np.asarray(indices, dtype=np.int64)
    if len(indices) == 0:
        return 0
    try:
        sizes = dataset.num_tokens_vec(indices)
    except NotImplementedError:
        sizes = [dataset.num_tokens(int(i)) for i in indices]
    return int(np.asarray(sizes, dtype=np.int64).sum())


def check_skipped(task, dataset, indices, ignored, max_positions):
    """Raise :class:`SkippedDataError` when ``ignored`` holds more than the allowed fraction of tokens.

    Only for a task a plugin model was built for without ``--allow-skipped-data``."""
    if len(ignored) == 0 or getattr(task, "allow_skipped_data", True):
        return
    total = _tokens(dataset, indices)
    skipped = _tokens(dataset, ignored)
    if total == 0 or skipped / total <= MAX_SKIPPED_FRACTION:
        return
    split = next((name for name, d in getattr(task, "datasets", {}).items() if d is dataset), "the data")
    cfg = getattr(task, "cfg", None)
    if getattr(cfg, "sample_break_mode", None) in ("complete", "complete_doc", "eos"):
        fix = (f"--sample-break-mode {cfg.sample_break_mode} keeps whole lines: use --sample-break-mode "
               "none (fixed blocks), or raise --tokens-per-sample and --max-positions")
    else:
        fix = "raise --max-positions (and --tokens-per-sample), or truncate the inputs (--truncate-sequence)"
    raise SkippedDataError(
        f"{100 * skipped / total:.1f}% of the tokens of {split} ({len(ignored):,} of {len(indices):,} "
        f"samples) are longer than max_positions={max_positions} and fairseq would skip them: {fix}; "
        "or pass --allow-skipped-data to train on the rest"
    )


_fairseq_filter_indices_by_size = FairseqTask.filter_indices_by_size


def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
    """fairseq's filter, after :func:`check_skipped` where fairseq would skip samples with a warning."""
    if ignore_invalid_inputs and max_positions is not None:
        _, ignored = dataset.filter_indices_by_size(indices, max_positions)
        check_skipped(self, dataset, indices, ignored, max_positions)
    return _fairseq_filter_indices_by_size(self, indices, dataset, max_positions, ignore_invalid_inputs)


FairseqTask.filter_indices_by_size = filter_indices_by_size
