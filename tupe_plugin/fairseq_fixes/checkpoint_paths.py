"""A checkpoint path that is no file (missing, a folder, a symlink loop) refused in one line naming the flag.

fairseq's loaders take the path as given: ``fairseq-validate --path`` (``load_model_ensemble_and_task``)
fails with "OSError: Model file not found" for a missing file or a symlink loop and with
``IsADirectoryError`` for a folder; ``fairseq-train --finetune-from-model`` with "ValueError: ... does not
exist" for a missing file, and, for a folder, finds no checkpoint in it and trains from random
initialisation; ``from_pretrained(FOLDER)`` with either error for a ``checkpoint_file`` that is no file in
FOLDER. :func:`check_checkpoint_file` is the one check of such a path, for these loaders (every model) and
for the plugin's own readers of a path a flag gives; :func:`check_checkpoints_in` the one of
``from_pretrained``'s ``checkpoint_file``.
"""

import os

from fairseq import checkpoint_utils
from fairseq.file_io import PathManager

from ..user_input.path_checks import path_problem
from ..user_input.user_errors import UserError

DEFAULT_RESTORE_FILE = "checkpoint_last.pt"
# the names fairseq-train and the tupe-* commands give the checkpoints they write, the likeliest first
CHECKPOINT_NAMES = ("checkpoint_best.pt", "checkpoint_last.pt", "model.pt")


class CheckpointPathError(UserError, FileNotFoundError):
    """A path given for a checkpoint file that is no file."""


def check_checkpoint_file(path, flag, error=CheckpointPathError):
    """Raise ``error`` naming ``flag``, ``path`` and what to give instead when ``path`` is no file (a path
    that fairseq's ``PathManager`` finds, and no folder, is left to the loader: it may be remote)."""
    if PathManager.exists(path) and not os.path.isdir(path):
        return
    if os.path.isdir(path):
        found = checkpoint_in(path)
        fix = (f"give a checkpoint file in it, e.g. {os.path.join(path, found)}" if found else
               "give a checkpoint file (a .pt written by fairseq-train); this folder holds none")
    else:
        fix = "give the path of a checkpoint file (a .pt written by fairseq-train)"
    raise error(f"{flag} {path}: {path_problem(path)}: {fix}")


def checkpoint_in(folder):
    """The name of the likeliest checkpoint file in ``folder`` (checkpoint_best.pt, ..., else the first
    .pt), or None."""
    try:
        names = sorted(name for name in os.listdir(folder)
                       if name.endswith(".pt") and os.path.isfile(os.path.join(folder, name)))
    except OSError:
        return None
    return next((name for name in CHECKPOINT_NAMES if name in names), names[0] if names else None)


def check_checkpoints_in(folder, checkpoint_file):
    """Raise :class:`CheckpointPathError` when a name of ``checkpoint_file`` (``os.pathsep``-separated, as
    fairseq's ``from_pretrained`` takes it) is no file in ``folder``, naming the checkpoint it holds."""
    for name in checkpoint_file.split(os.pathsep):
        path = os.path.join(folder, name)
        if problem := path_problem(path):
            found = checkpoint_in(folder)
            fix = f"pass checkpoint_file={found!r}" if found else "this folder holds no .pt checkpoint"
            raise CheckpointPathError(f"from_pretrained checkpoint_file={name!r}: {path}: {problem}: {fix}")


def finetune_checkpoint(cfg, suffix=""):
    """The ``--finetune-from-model`` fairseq's ``load_checkpoint`` loads for checkpoint config ``cfg`` (on
    a first launch: no ``checkpoint_last`` in the save dir, no ``--continue-once``), checked; else None."""
    if cfg.finetune_from_model is None or cfg.restore_file != DEFAULT_RESTORE_FILE:
        return None
    if PathManager.exists(os.path.join(cfg.save_dir, f"checkpoint_last{suffix or ''}.pt")):
        return None
    if getattr(cfg, "continue_once", None) is not None:
        return None
    check_checkpoint_file(cfg.finetune_from_model, "--finetune-from-model")
    return cfg.finetune_from_model


_fairseq_load_checkpoint = checkpoint_utils.load_checkpoint
_fairseq_load_model_ensemble_and_task = checkpoint_utils.load_model_ensemble_and_task


def load_checkpoint(cfg, trainer, **passthrough_args):
    """fairseq-train's loader; a ``--finetune-from-model`` it would read that is no file is refused."""
    finetune_checkpoint(cfg, trainer.checkpoint_suffix)
    return _fairseq_load_checkpoint(cfg, trainer, **passthrough_args)


def load_model_ensemble_and_task(filenames, arg_overrides=None, task=None, strict=True, suffix="",
                                 num_shards=1, state=None):
    """fairseq's loader of ``--path``; a file it would read (each shard's, with ``suffix``) that is no file
    is refused."""
    if state is None:
        for filename in filenames:
            for shard in range(num_shards):
                check_checkpoint_file(checkpoint_utils.get_maybe_sharded_checkpoint_filename(
                    filename, suffix, shard, num_shards), "--path")
    return _fairseq_load_model_ensemble_and_task(filenames, arg_overrides, task, strict, suffix, num_shards,
                                                 state)


checkpoint_utils.load_checkpoint = load_checkpoint
checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task
