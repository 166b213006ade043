"""A ``--restore-file`` that does not exist (or is a folder) stops the run, naming the path.

fairseq's ``load_checkpoint`` treats a missing checkpoint as "no checkpoint yet": a mistyped
``--restore-file`` logs "No existing checkpoint found" at INFO and trains from random initialisation,
exit 0. For the plugin's architectures only the default value (``checkpoint_last.pt``, fairseq's
resume-if-present behaviour) may be missing; a path the user gave must exist (checked before the model is
built, :mod:`.training_run`). :func:`checkpoint_to_restore` also says which file fairseq will load, for
the plugin's checks that run before the model is built.
"""

import os

from fairseq.file_io import PathManager
from ..fairseq_fixes.checkpoint_paths import (
    DEFAULT_RESTORE_FILE, CheckpointPathError, check_checkpoint_file, finetune_checkpoint,
)


class MissingRestoreFileError(CheckpointPathError):
    """An explicitly given ``--restore-file`` that does not exist."""


def checkpoint_to_restore(cfg, suffix=""):
    """The file fairseq's ``load_checkpoint`` will load for checkpoint config ``cfg``, or None.

    Raises :class:`MissingRestoreFileError` for a non-default ``--restore-file`` that does not exist or is a
    folder, :class:`~tupe_plugin.fairseq_fixes.checkpoint_paths.CheckpointPathError` for a
    ``--finetune-from-model`` to be read that is no file.
    """
    suffix = suffix or ""
    if cfg.restore_file == DEFAULT_RESTORE_FILE:
        last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
        if PathManager.exists(last):
            return last
        if getattr(cfg, "continue_once", None) is not None:
            return cfg.continue_once
        return finetune_checkpoint(cfg, suffix)  # None: a new run
    path = cfg.restore_file.replace(".pt", suffix + ".pt") if suffix else cfg.restore_file
    if not PathManager.exists(path):
        raise MissingRestoreFileError(
            f"--restore-file {path} does not exist (fairseq would train from random initialisation): "
            "correct the path, or drop --restore-file to start a new run"
        )
    check_checkpoint_file(path, "--restore-file", MissingRestoreFileError)
    return path

