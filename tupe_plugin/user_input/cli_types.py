"""argparse types shared by the command-line tools: a value out of range is refused as the flag is read,
in argparse's own one-line error naming the flag."""

import argparse
import math


def at_least_one(text):
    """An int of at least 1 (a count such as ``--max-examples``, where 0 would silently mean "all" or
    "none")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def finite_float(text):
    """A float that is a number: ``nan`` and ``inf`` (which ``float`` accepts) are refused, for every float
    flag of the plugin (a nan --fire-threshold trained until the gradients were nan)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def learning_rate(text):
    """A finite learning rate above 0, kept as typed: fairseq-train gets it, and run records and the rows
    of the collected scores show it, as the user wrote it."""
    if finite_float(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return text
