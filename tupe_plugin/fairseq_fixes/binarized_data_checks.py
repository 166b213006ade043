"""Clear errors for broken binarized data: an empty split, a truncated ``.idx`` or ``.bin``.

fairseq's ``MMapIndexedDataset`` (fairseq-preprocess's default ``--dataset-impl mmap``) maps the
files as they are: an empty corpus fails with "cannot mmap an empty file", a truncated index with
"buffer is smaller than requested size", a truncated ``.bin`` only when a batch is built ("offset
must be non-negative ..."), none naming the file. The index layout checked here is fairseq's:
magic (9 bytes), version (8), dtype code (1), N (8), then N int32 sizes and N int64 byte offsets.
"""

import os
import struct

import numpy as np
from fairseq.data import indexed_dataset
from ..user_input.user_errors import UserError

_HEADER_BYTES = 9 + 8 + 1 + 8


class BinarizedDataError(UserError, ValueError):
    """A binarized split that cannot be read."""


def check_mmap_split(prefix):
    """Refuse ``prefix.idx``/``prefix.bin`` when the split is empty or either file is truncated."""
    index, data = prefix + ".idx", prefix + ".bin"
    with open(index, "rb") as f:
        header = f.read(_HEADER_BYTES)
    if len(header) < _HEADER_BYTES:
        raise BinarizedDataError(f"{index} is truncated ({len(header)} bytes, not even a header): "
                                 "binarize the corpus again with fairseq-preprocess")
    (count,) = struct.unpack("<Q", header[-8:])
    if count == 0:
        raise BinarizedDataError(f"{index} holds no sentences: the text fairseq-preprocess binarized "
                                 "into this split was empty")
    expected = _HEADER_BYTES + count * (4 + 8)
    if os.path.getsize(index) < expected:
        raise BinarizedDataError(
            f"{index} is truncated ({os.path.getsize(index)} of {expected} bytes for {count} sentences): "
            "binarize the corpus again with fairseq-preprocess")
    last_size = np.fromfile(index, dtype=np.int32, count=1, offset=_HEADER_BYTES + (count - 1) * 4)[0]
    last_offset = np.fromfile(index, dtype=np.int64, count=1, offset=_HEADER_BYTES + count * 4
                              + (count - 1) * 8)[0]
    item_size = indexed_dataset._code_to_dtype[header[17]]().itemsize
    expected = int(last_offset) + int(last_size) * item_size
    if os.path.getsize(data) < expected:
        raise BinarizedDataError(
            f"{data} is truncated ({os.path.getsize(data)} of {expected} bytes listed in {index}): "
            "binarize the corpus again with fairseq-preprocess, or copy both files again")


_fairseq_make_dataset = indexed_dataset.make_dataset


def make_dataset(path, impl, *args, **kwargs):
    """fairseq's ``make_dataset``, after :func:`check_mmap_split` for the mmap format."""
    if impl == "mmap" and indexed_dataset.MMapIndexedDataset.exists(path):
        check_mmap_split(path)
    return _fairseq_make_dataset(path, impl, *args, **kwargs)


indexed_dataset.make_dataset = make_dataset
