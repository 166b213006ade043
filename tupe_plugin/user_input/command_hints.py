"""Fixes worded for the command being run: a flag of fairseq-train is not one of fairseq-validate.

fairseq-train takes model options as flags (``--max-positions 128``); fairseq-validate (and
fairseq-eval-lm, fairseq-generate, ...) only through ``--model-overrides "{'max_positions': 128}"``;
``from_pretrained`` as keyword arguments (``max_positions=128``). Messages that tell a user what to
change ask :func:`model_setting` how to say it.
"""

import os
import sys

OVERRIDE_COMMANDS = ("validate", "eval_lm", "eval-lm", "generate", "interactive", "score")


def current_command(argv=None):
    """``"train"``, ``"validate"`` (any fairseq command taking --model-overrides) or ``"python"``."""
    argv = sys.argv if argv is None else argv
    program = os.path.basename(argv[0]) if argv else ""
    if "train" in program:
        return "train"
    if any(name in program for name in OVERRIDE_COMMANDS):
        return "validate"
    return "python"


def model_setting(name, value, argv=None):
    """How to set model option ``name`` (e.g. ``max_positions``) to ``value`` in the command at hand (a
    string is quoted where Python reads it: ``{'attention_backend': 'triton'}``)."""
    literal = repr(value) if isinstance(value, str) else value
    flag = f"--{name.replace('_', '-')} {value}"
    override = f"--model-overrides \"{{'{name}': {literal}}}\""
    command = current_command(argv)
    if command == "train":
        return flag
    if command == "validate":
        return override
    return f"{flag} (fairseq-train), {override} (fairseq-validate) or {name}={literal} (from_pretrained)"


def overrides_named(overrides, argv=None):
    """The overrides ``overrides`` ({name: value}) of a checkpoint's settings as the command at hand takes
    them: ``--model-overrides "{...}"``, or the ``arg_overrides`` of fairseq's loaders in Python."""
    if current_command(argv) == "validate":
        return f"--model-overrides \"{overrides!r}\""
    return f"arg_overrides {overrides!r}"


def input_length_fix(limit, argv=None):
    """How to keep the inputs within ``limit`` learned positions in the command at hand."""
    command = current_command(argv)
    if command == "train":
        return ("raise --max-positions (pre-training) or truncate the input "
                "(--tokens-per-sample / --max-positions at fine-tuning)")
    if command == "validate":
        return (f"validate with --tokens-per-sample {limit} or less (a learned table cannot grow; "
                "architectures with sinusoidal, T5 or Shaw positions, or none, accept longer inputs)")
    return (f"pass at most {limit} tokens; a learned table cannot grow (fairseq-train: raise "
            f"--max-positions when pre-training; fairseq-validate: --tokens-per-sample {limit} or less)")
