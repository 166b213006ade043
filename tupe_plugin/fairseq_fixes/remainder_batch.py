"""fairseq's batching keeps every example: the remainder that the compiled batcher drops becomes a last batch.

``fairseq.data.data_utils.batch_by_size`` (the compiled ``data_utils_fast`` of ve-fairseq 0.12.3) drops
the examples left over after the last full multiple of ``--required-batch-size-multiple`` (8 by default):
35 validation blocks give 32 scored, a split of fewer than 8 gives no batch at all ("The dataset is
empty"), and a GLUE or SQuAD dev set loses up to 7 examples from its score, silently, for every model.
Upstream fairseq keeps them in a last, smaller batch; so does this fix, cut to ``max_sentences`` and
``max_tokens`` like the others.
"""

import numpy as np
from fairseq.data import data_utils

_fairseq_batch_by_size = data_utils.batch_by_size


def _remainder_batches(missing, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences):
    """``missing`` (in order) cut into batches of at most ``max_sentences`` examples and ``max_tokens``
    tokens (the longest example times the batch size, as fairseq counts)."""
    batches, batch, longest = [], [], 0
    for index in missing:
        tokens = int(num_tokens_vec[index]) if num_tokens_vec is not None else int(num_tokens_fn(index))
        wider = max(longest, tokens)
        full = (max_sentences and len(batch) >= max_sentences) or (
            max_tokens and batch and wider * (len(batch) + 1) > max_tokens)
        if full:
            batches.append(np.array(batch, dtype=np.int64))
            batch, wider = [], tokens
        batch.append(index)
        longest = wider
    if batch:
        batches.append(np.array(batch, dtype=np.int64))
    return batches


def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                  required_batch_size_multiple=1, fixed_shapes=None):
    batches = _fairseq_batch_by_size(indices, num_tokens_fn, num_tokens_vec=num_tokens_vec,
                                     max_tokens=max_tokens, max_sentences=max_sentences,
                                     required_batch_size_multiple=required_batch_size_multiple,
                                     fixed_shapes=fixed_shapes)
    if fixed_shapes is not None:
        return batches
    indices = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
    covered = np.concatenate(batches) if len(batches) else np.empty(0, dtype=np.int64)
    if len(covered) == len(indices):
        return batches
    missing = indices[~np.isin(indices, covered)]
    return list(batches) + _remainder_batches(missing, num_tokens_fn, num_tokens_vec, max_tokens,
                                              max_sentences)


batch_by_size.__doc__ = _fairseq_batch_by_size.__doc__
data_utils.batch_by_size = batch_by_size
