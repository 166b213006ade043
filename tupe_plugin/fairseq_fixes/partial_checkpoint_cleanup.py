"""A checkpoint save that fails (a full disk) removes its partial ``NAME.pt.tmp`` and says what is intact.

fairseq writes each checkpoint to ``NAME.pt.tmp`` and renames it; when ``torch.save`` fails (``No space
left on device``) it retries twice, logs a traceback and leaves the partial ``.tmp`` behind, taking the
space the user needs to free. Here the partial file is removed and the error names the file: the
checkpoints written before are complete (the rename never happened), so the same command resumes.
"""

import errno
import os

from fairseq import checkpoint_utils
from ..user_input.user_errors import UserError


class CheckpointSaveError(UserError, OSError):
    """Writing a checkpoint failed; the partial file was removed."""


def remove_partial(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def failed_save_error(filename, err):
    """The one-line error for a failed write of ``filename`` (torch raises RuntimeError for a full disk)."""
    reason = os.strerror(err.errno) if getattr(err, "errno", None) else (str(err).splitlines() or ["?"])[0]
    fix = "free disk space" if getattr(err, "errno", None) == errno.ENOSPC else "fix the cause"
    return CheckpointSaveError(
        getattr(err, "errno", None) or errno.EIO,
        f"writing the checkpoint {filename} failed ({reason}); the partial {filename}.tmp was removed and "
        f"the checkpoints saved before are complete: {fix} and run the same command again to resume",
    )


_fairseq_torch_persistent_save = checkpoint_utils.torch_persistent_save


def torch_persistent_save(obj, filename, async_write=False):
    """fairseq's save; on failure the partial ``filename.tmp`` is removed."""
    try:
        return _fairseq_torch_persistent_save(obj, filename, async_write=async_write)
    except Exception as err:
        if async_write or not isinstance(filename, str):
            raise
        remove_partial(filename + ".tmp")
        raise failed_save_error(filename, err) from err


checkpoint_utils.torch_persistent_save = torch_persistent_save
