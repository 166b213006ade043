"""A clear error, naming the file, for a checkpoint that torch cannot read (damaged, truncated, or not a
checkpoint).

fairseq's ``load_checkpoint_to_cpu`` (behind ``fairseq-train`` resuming or ``--restore-file``, and
``fairseq-validate --path``) hands the file straight to ``torch.load``, whose errors ("failed finding
central directory", "invalid load key", an unpickling error) name neither the file nor what to do.
When a load fails, the file is examined: damaged bytes (a record that fails its CRC), a truncated or
foreign file, a zip archive torch's reader refuses (its records not under one top folder), a torch file
that holds no fairseq checkpoint, each get their own message; a file that
holds objects besides a checkpoint's is refused by :func:`.checkpoint_compat.load` before it is examined.
"""

import os
import zipfile

from fairseq import checkpoint_utils
from ..user_input.user_errors import UserError
from .checkpoint_compat import UnsafeCheckpointError, load, torch_zip_problem, unreadable_reason
from .checkpoint_integrity import verify_checkpoint


class UnreadableCheckpointError(UserError, RuntimeError):
    """A checkpoint file that is not a complete torch checkpoint."""


class NotAFairseqCheckpointError(UnreadableCheckpointError):
    """A torch file (a bare state dict, a tensor, ...) that is not a fairseq checkpoint."""


_fairseq_load_checkpoint_to_cpu = checkpoint_utils.load_checkpoint_to_cpu


def load_checkpoint_to_cpu(path, *args, **kwargs):
    """fairseq's loader; a local file that fails to load is examined and reported."""
    try:
        return _fairseq_load_checkpoint_to_cpu(path, *args, **kwargs)
    except Exception as err:
        verify_checkpoint(path)
        raise_if_unreadable(path, err)
        raise_if_not_fairseq(path, err)
        raise


def raise_if_unreadable(path, err):
    """Raise :class:`UnreadableCheckpointError` from ``err`` when ``path`` is a local file that is no
    zip archive torch reads as a checkpoint (the plugin's other readers of checkpoints call this on a
    failed load), saying what it is (truncated, damaged, not torch's, records not under one top folder);
    a file refused as unsafe (a legacy pickle may be one) is left to that refusal."""
    if isinstance(err, UnsafeCheckpointError) or not os.path.isfile(path):
        return
    if zipfile.is_zipfile(path) and torch_zip_problem(path) is None:
        return
    raise UnreadableCheckpointError(
        f"{path} ({os.path.getsize(path)} bytes) cannot be read as a checkpoint: {unreadable_reason(path)}. "
        "Resume or fine-tune from another checkpoint of the run "
        "(--restore-file SAVE_DIR/checkpoint_EPOCH_UPDATES.pt) and remove or replace this one"
    ) from err


checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def check_fairseq_checkpoint(path, state):
    """Raise :class:`NotAFairseqCheckpointError` when ``state``, loaded from ``path``, is no fairseq
    checkpoint (a dict of ``model`` and ``cfg`` or legacy ``args``)."""
    if isinstance(state, dict) and "model" in state and ("cfg" in state or "args" in state):
        return
    held = (f"a dict of {', '.join(map(repr, list(state)[:4]))}{', ...' if len(state) > 4 else ''}"
            if isinstance(state, dict) else f"a {type(state).__name__}")
    raise NotAFairseqCheckpointError(
        f"{path} is a torch file but not a fairseq checkpoint (it holds {held}; a fairseq checkpoint holds "
        "'model', 'cfg' and 'optimizer_history'): pass a checkpoint written by fairseq-train, or convert "
        "the authors' released TUPE weights with tupe-convert-official"
    )


def raise_if_not_fairseq(path, err):
    """Raise :class:`NotAFairseqCheckpointError` from ``err`` when ``path`` loads with torch but holds no
    fairseq checkpoint (fairseq fails with ``KeyError: 'best_loss'`` or ``Tensor.__contains__``)."""
    if not os.path.isfile(path):
        return
    try:
        state = load(path, mmap=True)
    except Exception:
        return
    try:
        check_fairseq_checkpoint(path, state)
    except NotAFairseqCheckpointError as error:
        raise error from err
