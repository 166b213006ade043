"""An output file of a command-line tool that is one of its inputs, or an output folder that is, holds or
lies inside one, refused before anything is written."""

import os


def _given(inputs):
    """(name, path, real path) of each input that is given, links, ``./`` and ``..`` resolved."""
    return ((name, path, os.path.realpath(path)) for name, path in inputs if path is not None)


def overwritten_input(output, inputs):
    """What writing the file ``output`` would overwrite among ``inputs`` ((flag, path) pairs, a path None when
    the flag is not given), in words: ``"the --gold-file file"``, or ``"a file of --data DIR"`` for an
    existing file in an input folder; None when nothing. Paths are compared as real paths (links, ``./``
    and ``..`` resolved)."""
    target = os.path.realpath(output)
    for flag, path, real in _given(inputs):
        if real == target:
            return f"the {flag} file"
        if os.path.isdir(real) and os.path.dirname(target) == real and os.path.exists(target):
            return f"a file of {flag} {path}"
    return None


def folder_meeting_input(folder, inputs):
    """How the output ``folder``, which a command replaces whole, meets one of ``inputs`` ((name, path)
    pairs, a path None when absent), in words: ``"is DATA_BIN data"``, ``"holds CKPT run/model.pt"``,
    ``"lies inside DATA_BIN data"``; None when they are apart. Paths are compared as real paths."""
    target = os.path.realpath(folder)
    for name, path, real in _given(inputs):
        if real == target:
            return f"is {name} {path}"
        if real.startswith(os.path.join(target, "")):
            return f"holds {name} {path}"
        if target.startswith(os.path.join(real, "")):
            return f"lies inside {name} {path}"
    return None
