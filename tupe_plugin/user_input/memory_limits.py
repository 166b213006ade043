"""Sizes past the machine's memory, refused as typos before anything is allocated.

A size flag or config field whose tensor alone would not fit in this machine's memory
(``--max-positions 4000000000``, ``--deberta-max-distance 1000000000``, a ``config.json`` with
``max_relative_positions: 1000000000``) is a typo: the model and converter checks ask
:func:`beyond_memory` before building, instead of an allocation that fails after minutes or aborts.
"""

import os


def machine_memory():
    """The bytes of memory of this machine, or None when the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def beyond_memory(size, tensor, nbytes):
    """Why the ``tensor`` of ``nbytes`` that ``size`` (a flag or config field and its value) asks for cannot
    be allocated on this machine, or None when it fits."""
    memory = machine_memory()
    if memory is None or nbytes <= memory:
        return None
    return (f"{size} would need a {nbytes / 2**30:,.1f} GiB {tensor}, more than the "
            f"{memory / 2**30:,.1f} GiB of memory of this machine: a typo?")
