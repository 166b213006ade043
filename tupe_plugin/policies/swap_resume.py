"""A ``--init-from-checkpoint`` run is a new run: rerun, it resumes from its own checkpoint, never from CKPT.

With the semantics of fairseq's ``--finetune-from-model``: the weights of CKPT start
the run only while its ``--save-dir`` holds no ``checkpoint_last.pt``. Before the model is built,
:func:`prepare_swap` marks a rerun that will resume (``init_from_checkpoint_applied``, read by
:mod:`tupe_plugin.models.checkpoint_init`) so that CKPT is not read again (it may even be gone), and
refuses ``--restore-file`` / ``--finetune-from-model`` beside it: both load weights of their own.
"""

import argparse
import logging
import os

from fairseq.file_io import PathManager
from fairseq.utils import safe_getattr

from ..models.checkpoint_init import check_exists
from ..user_input.user_errors import UserError
from .missing_restore_file import DEFAULT_RESTORE_FILE

logger = logging.getLogger(__name__)


class SwapFlagError(UserError, ValueError):
    """``--init-from-checkpoint`` beside another flag that loads weights."""


def prepare_swap(cfg):
    """Before fairseq-train builds the model of config ``cfg``: a rerun of a ``--init-from-checkpoint`` run
    resumes from ``SAVE_DIR/checkpoint_last.pt``; a new one needs CKPT to exist."""
    path = safe_getattr(cfg.model, "init_from_checkpoint", None)
    if not path or not isinstance(cfg.model, argparse.Namespace):
        return
    checkpoint = cfg.checkpoint
    other = ("--restore-file", checkpoint.restore_file) if checkpoint.restore_file != DEFAULT_RESTORE_FILE \
        else ("--finetune-from-model", checkpoint.finetune_from_model) if checkpoint.finetune_from_model \
        else None
    if other is not None:
        raise SwapFlagError(
            f"--init-from-checkpoint {path} and {other[0]} {other[1]} both load weights: drop {other[0]} to "
            "start a new run from the weights of CKPT with this command's architecture, or drop "
            "--init-from-checkpoint to continue the checkpoint's own architecture"
        )
    last = os.path.join(checkpoint.save_dir, f"checkpoint_last{checkpoint.checkpoint_suffix or ''}.pt")
    if PathManager.exists(last):
        logger.info(f"the run resumes from its own {last}: --init-from-checkpoint {path} is not read again")
        cfg.model.init_from_checkpoint_applied = True
    else:
        check_exists(path)
