"""The one reader of checkpoint and state-dict files: ``torch.load(weights_only=True)`` with fairseq's
allowlist, and a file that holds anything else refused in one line by name.

fairseq stores its argparse ``Namespace`` in every checkpoint, and the best validation score of tasks judged
by a scipy/sklearn metric (Matthews corr., F1, Pearson/Spearman) as a numpy scalar: these are allowed. A
pickle that names any other callable (an object whose ``__reduce__`` would run code when unpickled) is not
loaded: :func:`load` raises :class:`UnsafeCheckpointError` before torch's unpickler calls anything.
fairseq's ``checkpoint_utils`` (``fairseq-train --restore-file``, ``fairseq-validate --path``,
``load_model_ensemble_and_task``) reads through :func:`load` too, so every command of the plugin does.
"""

import _compat_pickle
import argparse
import io
import os
import pickle
import pickletools
import zipfile

import numpy
import torch
import torch._weights_only_unpickler as _weights_only
from fairseq import checkpoint_utils

from ..user_input.user_errors import UserError

torch.serialization.add_safe_globals([
    argparse.Namespace,
    numpy.core.multiarray.scalar if not hasattr(numpy, "_core") else numpy._core.multiarray.scalar,
    numpy.dtype,
    *(getattr(numpy.dtypes, name) for name in dir(numpy.dtypes) if name.endswith("DType")),
])

CHECKPOINT_FIX = ("pass a checkpoint written by fairseq-train or a tupe-* command (tensors and plain values "
                  "only): a file from elsewhere may run code when it is unpickled")


class UnsafeCheckpointError(UserError):
    """A file whose unpickling would build objects a checkpoint does not hold (and could run code)."""


def load(path, flag=None, fix=CHECKPOINT_FIX, **kwargs):
    """``torch.load(path, weights_only=True)`` on the CPU (``kwargs``: ``mmap``, ...); a file that holds
    other objects is refused naming it (after ``flag``, the option that gave it, when there is one) and
    ``fix``. ``path`` may be an open file.

    A refusal is recognised by what the file holds, not by torch's wording: when torch's weights-only
    unpickler raises :class:`pickle.UnpicklingError`, the file's pickles are read to their end without
    being unpickled (:func:`refused_globals`); a complete pickle means torch refused its content. A file
    whose pickle is damaged or ends early keeps torch's error, for the readers' own messages."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, **kwargs)
    except pickle.UnpicklingError:
        refused = refused_globals(path)
        if refused is None:
            raise
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path.name
        shown = f"{flag} {name}" if flag else name
        held = ", ".join(refused) if refused else "an object torch's weights-only loader does not build"
        raise UnsafeCheckpointError(f"{shown} holds objects a checkpoint does not hold ({held}); "
                                    f"it was not loaded: {fix}") from None


# the pickles of a file in torch.save's former format: magic number, protocol, system info, the object
LEGACY_PICKLES = 4


def refused_globals(path):
    """The callables and classes that the pickles of the checkpoint ``path`` (a path or an open file) name
    and torch's weights-only loader refuses, sorted, read with :mod:`pickletools` (nothing is unpickled);
    None when a pickle is damaged or ends early, or the file is in neither of torch.save's formats."""
    if isinstance(path, (str, os.PathLike)):
        with open(path, "rb") as f:
            return refused_globals(f)
    position = path.tell()
    try:
        path.seek(0)
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                record = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
                if record is None:
                    return None
                streams = [io.BytesIO(archive.read(record))]
        else:
            path.seek(0)
            streams = [path] * LEGACY_PICKLES
        named = set().union(*(_pickled_globals(stream) for stream in streams))
    except (ValueError, EOFError, zipfile.BadZipFile, OSError, UnicodeDecodeError):
        return None
    finally:
        path.seek(position)
    allowed = {**_weights_only._get_allowed_globals(), **_weights_only._get_user_allowed_globals()}
    blocked = set(getattr(_weights_only, "_blocklisted_modules", ()))
    return sorted(f"{module}.{name}" for module, name in named
                  if f"{module}.{name}" not in allowed or module in blocked)


def _pickled_globals(stream):
    """The (module, name) of every global one pickle in ``stream`` names, read to its STOP (ValueError
    when it is damaged or ends early)."""
    named, strings = set(), []
    for opcode, argument, _ in pickletools.genops(stream):
        if opcode.name in ("GLOBAL", "INST"):  # protocol 2 names Python 2's modules, as unpickling maps them
            module, name = argument.split(" ", 1)
            renamed = (_compat_pickle.IMPORT_MAPPING.get(module, module), name)
            named.add(_compat_pickle.NAME_MAPPING.get((module, name), renamed))
        elif opcode.name == "STACK_GLOBAL":  # protocol 4: the module and the name pushed as strings before it
            named.add(tuple(strings) if len(strings) == 2 else ("?", "a global named from the pickle's memo"))
            strings.clear()
        elif "UNICODE" in opcode.name:
            strings = (strings + [argument])[-2:]
        elif opcode.name != "MEMOIZE":
            strings.clear()
    return named


ZIP_SIGNATURE = b"PK\x03\x04"
PICKLE_PROTOCOL = b"\x80"  # the first byte of a file in torch.save's former format (a pickle, protocol 2)


def unreadable_reason(path):
    """Why torch cannot load the file ``path`` (a load of it failed), in a phrase for an error message:
    "it is truncated" only when it ends before the data its own records announce (found by loading it
    again and watching for a read past its end); never torch's advice."""
    size = os.path.getsize(path)
    if size == 0:
        return "it is empty"
    with open(path, "rb") as f:
        head = f.read(len(ZIP_SIGNATURE))
    if head == ZIP_SIGNATURE:
        if zipfile.is_zipfile(path):
            return torch_zip_problem(path) or "its records are damaged"
        return "it is truncated: a zip archive that ends before its directory"
    if not head.startswith(PICKLE_PROTOCOL):
        return "it is not a file written by torch.save"
    with open(path, "rb") as f:
        watched = _ReadsPastTheEnd(f)
        try:
            torch.load(watched, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 (the failure is known; only where it stopped is looked at)
            pass
    if watched.short:
        return "it is truncated: it ends before the data it announces"
    return "its pickled data is damaged or not a checkpoint's"


def torch_zip_problem(path):
    """None when torch's zip reader opens the zip archive ``path`` and finds the pickle of a checkpoint in
    it; else why not, in a phrase for an error message, from the archive's record names: torch.save writes
    every record under one top folder (``NAME/data.pkl``, ``NAME/version``, ``NAME/data/0``, ...), and
    torch reads the folder of the first record only."""
    try:
        if torch._C.PyTorchFileReader(os.fspath(path)).has_record("data.pkl"):
            return None
    except RuntimeError:
        pass
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    loose = [name for name in names if "/" not in name]
    tops = list(dict.fromkeys(name.split("/", 1)[0] for name in names if "/" in name))
    if loose:
        return (f"it is a zip archive whose record {loose[0]} is in no folder, not under one top folder as "
                "torch.save writes them")
    if len(tops) > 1:
        shown = ", ".join(f"{top}/" for top in tops[:3]) + (", ..." if len(tops) > 3 else "")
        return (f"it is a zip archive whose records are under {len(tops)} top folders ({shown}), "
                "not under one as torch.save writes them")
    if not tops:
        return "it is a zip archive of no records"
    missing = [record for record in ("version", "data.pkl")
               if f"{tops[0]}/{record}" not in names and f"{tops[0]}/.data/{record}" not in names]
    if missing:
        return f"it is a zip archive with no {tops[0]}/{missing[0]} record of torch.save's"
    return "it is a zip archive but not one torch.save wrote"


class _ReadsPastTheEnd(io.RawIOBase):
    """A file read without a buffer, noting whether a read asked for bytes past its end."""

    def __init__(self, file):
        super().__init__()
        self.file, self.short = file, False

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=os.SEEK_SET):
        return self.file.seek(offset, whence)

    def tell(self):
        return self.file.tell()

    def readinto(self, buffer):
        count = self.file.readinto(buffer)
        self.short = self.short or count < len(buffer)
        return count


class _TorchReadingSafely:
    """torch as fairseq's ``checkpoint_utils`` sees it: ``torch.load`` is :func:`load`."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(f, map_location=None, **kwargs):
        return load(f, **{key: value for key, value in kwargs.items() if key != "weights_only"})


checkpoint_utils.torch = _TorchReadingSafely()

