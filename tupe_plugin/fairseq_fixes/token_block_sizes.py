"""Block sizes of fairseq's TokenBlockDataset that do not wrap around at 65,536 tokens.

fairseq picks the dtype of the block sizes from ``block_size`` (uint16 below 65,535: every
``--tokens-per-sample`` in use) instead of from the blocks it built. With ``--sample-break-mode complete``,
``complete_doc`` or ``eos`` a block is a whole line however long, so a line of 70,000 tokens was stored
as 70,001 mod 65,536 = 4,465, and one of 65,535 (with its </s>) became 0 once PrependTokenDataset
added <s> in the same dtype. The length filter then kept it (fairseq trained on it or the model
crashed) and the share the skipped-data check reports was wrong (81.3% instead of 98.6%). The sizes
are now uint32 whenever a block reaches 65,535 tokens, as fairseq's own margin for the <s> intends.
"""

import numpy as np
from fairseq.data.token_block_dataset import TokenBlockDataset

_UINT16_LIMIT = 65535   # fairseq's margin: a size stored as uint16 must stay below it, <s> added

_fairseq_build_slice_indices = TokenBlockDataset._build_slice_indices


def _build_slice_indices(sizes, break_mode, document_sep_len, block_size):
    """fairseq's ``_build_slice_indices``, with block sizes in a dtype that holds the longest block."""
    block_sizes, block_to_dataset_index, slice_indices = _fairseq_build_slice_indices(
        sizes, break_mode, document_sep_len, block_size)
    if block_sizes.dtype == np.uint16 and len(slice_indices):
        exact = slice_indices[:, 1].astype(np.int64) - slice_indices[:, 0].astype(np.int64)
        if exact.max() >= _UINT16_LIMIT:
            block_sizes = exact.astype(np.uint32)
    return block_sizes, block_to_dataset_index, slice_indices


TokenBlockDataset._build_slice_indices = staticmethod(_build_slice_indices)
