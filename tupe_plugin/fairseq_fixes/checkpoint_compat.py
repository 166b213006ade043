"""The one reader of checkpoint and state-dict files: ``torch.load(weights_only=True)`` with fairseq's
allowlist, and a file that holds anything else refused in one line by name.

fairseq stores its argparse ``Namespace`` in every checkpoint, and the best validation score of tasks judged
by a scipy/sklearn metric (Matthews corr., F1, Pearson/Spearman) as a numpy scalar: these are allowed. A
pickle that names any other callable (an object whose ``__reduce__`` would run code when unpickled) is not
loaded: :func:`load` raises :class:`UnsafeCheckpointError` before torch's unpickler calls anything.
fairseq's ``checkpoint_utils`` (``fairseq-train --restore-file``, ``fairseq-validate --path``,
``load_model_ensemble_and_task``) reads through :func:`load` too, so every command of the plugin does.
"""

import argparse
import os
import pickle
import re

import numpy
import torch
from fairseq import checkpoint_utils

from ..user_input.user_errors import UserError

torch.serialization.add_safe_globals([
    argparse.Namespace,
    numpy.core.multiarray.scalar if not hasattr(numpy, "_core") else numpy._core.multiarray.scalar,
    numpy.dtype,
    *(getattr(numpy.dtypes, name) for name in dir(numpy.dtypes) if name.endswith("DType")),
])

# torch's weights-only unpickler, refusing the callable or class a pickle names (a text file or damaged bytes
# fail otherwise, and are left to the readers' own messages)
REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")
CHECKPOINT_FIX = ("pass a checkpoint written by fairseq-train or a tupe-* command (tensors and plain values "
                  "only): a file from elsewhere may run code when it is unpickled")


class UnsafeCheckpointError(UserError):
    """A file whose unpickling would build objects a checkpoint does not hold (and could run code)."""


def load(path, flag=None, fix=CHECKPOINT_FIX, **kwargs):
    """``torch.load(path, weights_only=True)`` on the CPU (``kwargs``: ``mmap``, ...); a file that holds
    other objects is refused naming it (after ``flag``, the option that gave it, when there is one) and
    ``fix``. ``path`` may be an open file."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, **kwargs)
    except pickle.UnpicklingError as error:
        found = REFUSED_GLOBAL.search(str(error))
        if found is None:
            raise
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path.name
        shown = f"{flag} {name}" if flag else name
        raise UnsafeCheckpointError(f"{shown} holds objects a checkpoint does not hold ({found.group(1)}); "
                                    f"it was not loaded: {fix}") from None


class _TorchReadingSafely:
    """torch as fairseq's ``checkpoint_utils`` sees it: ``torch.load`` is :func:`load`."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(f, map_location=None, **kwargs):
        return load(f, **{key: value for key, value in kwargs.items() if key != "weights_only"})


checkpoint_utils.torch = _TorchReadingSafely()

