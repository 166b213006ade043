"""argparse types shared by the command-line tools: a value out of range is refused as the flag is read,
in argparse's own one-line error naming the flag."""

import argparse


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
