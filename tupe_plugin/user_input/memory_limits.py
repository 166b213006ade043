"""Sizes past the machine's memory, refused as typos before anything is allocated.

A size flag or config field whose tensor alone would not fit in this machine's memory
(``--max-positions 4000000000``, ``--deberta-max-distance 1000000000``, a ``config.json`` with
``max_relative_positions: 1000000000``) is a typo: the model and converter checks ask
:func:`beyond_memory` before building, instead of an allocation that fails after minutes or aborts.

What a size costs is counted on the work, not only on the parameters: what the model holds in training
(each parameter with its gradient and Adam's two moments, :data:`TRAINING_COPIES`) and what one forward of
the configured batch computes (:class:`ForwardShape`, from fairseq's ``--batch-size``, ``--max-tokens`` and
``--tokens-per-sample``: :func:`forward_shape`).
"""

import os
from dataclasses import dataclass

from fairseq.utils import safe_getattr

FLOAT32 = 4
# A trained parameter is held four times: its value, its gradient and Adam's two moments
TRAINING_COPIES = 4


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


def trained_bytes(parameters):
    """The float32 bytes ``parameters`` take in training: :data:`TRAINING_COPIES` copies."""
    return parameters * TRAINING_COPIES * FLOAT32


@dataclass(frozen=True)
class ForwardShape:
    """One forward of the configured batch: ``sequences`` (B) of ``length`` tokens (T), through ``layers``
    layers. Where the batch is unknown, one sequence of the longest length: what the model holds then."""

    sequences: int = 1
    length: int = 1
    layers: int = 1

    @property
    def tokens(self):
        return self.sequences * self.length

    def describe(self):
        return f"{self.sequences} x {self.length} tokens"


def forward_shape(args):
    """The :class:`ForwardShape` of fairseq ``args``: T = ``--tokens-per-sample`` (no longer than
    ``--max-positions``, which fairseq's filter keeps), else ``--max-positions``; B the most sequences of T
    tokens that ``--batch-size`` and ``--max-tokens`` allow (1 where neither is known). A value missing or
    not a positive number is left out (its own check names it)."""

    def positive(name):
        value = safe_getattr(args, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    max_positions, tokens_per_sample = positive("max_positions"), positive("tokens_per_sample")
    length = min(filter(None, (tokens_per_sample, max_positions)), default=1)
    limits = [positive("batch_size"), positive("max_tokens") and max(1, positive("max_tokens") // length)]
    sequences = min(filter(None, limits), default=1)
    return ForwardShape(sequences, length, positive("encoder_layers") or 1)
