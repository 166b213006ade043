"""An output file of a command-line tool that is one of its inputs, refused before anything is written."""

import os


def overwritten_input(output, inputs):
    """What writing the file ``output`` would overwrite among ``inputs`` ((flag, path) pairs, a path None when
    the flag is not given), in words: ``"the --gold-file file"``, or ``"a file of --data DIR"`` for an
    existing file in an input folder; None when nothing. Paths are compared as real paths (links, ``./``
    and ``..`` resolved)."""
    target = os.path.realpath(output)
    for flag, path in inputs:
        if path is None:
            continue
        real = os.path.realpath(path)
        if real == target:
            return f"the {flag} file"
        if os.path.isdir(real) and os.path.dirname(target) == real and os.path.exists(target):
            return f"a file of {flag} {path}"
    return None
