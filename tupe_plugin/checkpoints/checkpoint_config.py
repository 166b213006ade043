"""What a fairseq checkpoint was trained with (its model configuration, its cfg), read on the CPU without its
tensors."""

import zipfile

from ..fairseq_fixes.checkpoint_compat import load
from ..fairseq_fixes.checkpoint_integrity import verify_checkpoint
from ..fairseq_fixes.unreadable_checkpoints import check_fairseq_checkpoint, raise_if_unreadable


def model_config(state):
    """The ``cfg.model`` (or legacy ``args``) of a loaded fairseq checkpoint ``state``."""
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if hasattr(cfg, "get") else None
    return model if model is not None else state.get("args")


def saved_model_config(path):
    """The model configuration of the fairseq checkpoint ``path``; a damaged or truncated file, or one that
    holds no fairseq checkpoint, is refused naming it."""
    return model_config(saved_state(path))


def saved_state(path):
    """The fairseq checkpoint ``path``, its tensors memory-mapped where torch can; refused as
    :func:`saved_model_config` says, and when it holds objects besides a checkpoint's."""
    verify_checkpoint(path)
    try:
        # mmap needs torch's zip format; the released fairseq RoBERTa files are in the legacy one
        state = load(path, mmap=zipfile.is_zipfile(path))
    except Exception as err:
        raise_if_unreadable(path, err)
        raise
    check_fairseq_checkpoint(path, state)
    return state
