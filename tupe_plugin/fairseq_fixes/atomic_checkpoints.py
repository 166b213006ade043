"""Atomic checkpoint copies: an interrupted save never leaves a truncated ``checkpoint_last.pt``.

fairseq writes the first checkpoint of a save atomically (``torch_persistent_save`` writes
``NAME.tmp`` and renames it), but then *copies* it to the other names of that save —
``checkpoint_last.pt``, ``checkpoint_best.pt`` — with ``shutil.copyfile`` straight onto the
destination. A process killed during that copy leaves a truncated ``checkpoint_last.pt``, the very
file a restarted run resumes from. Here the copy goes to ``DEST.tmp`` and is renamed over ``DEST``
(``os.replace``, atomic on POSIX and Windows), so ``DEST`` is always a complete old or new file.
"""

import os
import shutil

from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from .partial_checkpoint_cleanup import failed_save_error, remove_partial


class AtomicCopyPathManager(PathManager):
    """fairseq's ``PathManager`` whose local ``copy`` writes a temporary file, then renames it."""

    @staticmethod
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(dst_path):
            return PathManager.copy(src_path, dst_path, overwrite=overwrite)
        tmp_path = dst_path + ".tmp"
        try:
            shutil.copyfile(src_path, tmp_path)
        except Exception as err:  # a full disk: remove the partial copy, DEST keeps its old content
            remove_partial(tmp_path)
            raise failed_save_error(dst_path, err) from err
        os.replace(tmp_path, dst_path)
        return True


checkpoint_utils.PathManager = AtomicCopyPathManager
