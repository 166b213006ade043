"""The --help text of the repository's commands, all in one interpreter (fairseq's import costs seconds).

Run as ``python tests/command_help.py REQUESTS`` from the repository root: REQUESTS is a JSON list of
``[tool, choices]``, where tool is a ``tupe-*`` command, ``fairseq-train``, ``fairseq-validate``,
``fairseq-preprocess``, a Python script's path or ``-m MODULE``, and choices are the flags that decide
which options a fairseq command has (``--task masked_lm --arch tupe_r_base ...``). Prints
``{key: help text}`` as JSON, the key being ``tool`` and the choices joined by spaces.
"""

import contextlib
import io
import json
import runpy
import sys
from importlib.metadata import entry_points

FAIRSEQ_PARSERS = {"fairseq-train": "get_training_parser", "fairseq-validate": "get_validation_parser",
                   "fairseq-preprocess": "get_preprocessing_parser"}


def fairseq_help(tool, choices):
    """fairseq's parser with the options of the task, arch, criterion, ... that ``choices`` name."""
    from fairseq import options

    parser = getattr(options, FAIRSEQ_PARSERS[tool])()
    if tool != "fairseq-preprocess":
        options.parse_args_and_arch(parser, input_args=["data", *choices], parse_known=True)
    return parser.format_help()


def printed_help(run):
    """What ``run()`` prints before argparse's --help exits."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        run()
    return out.getvalue()


def script_help(path):
    def run():
        sys.argv = [path, "--help"]
        runpy.run_path(path, run_name="__main__")
    return printed_help(run)


def module_help(module):
    def run():
        sys.argv = [module, "--help"]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    return printed_help(run)


def command_help(tool, choices):
    if tool in FAIRSEQ_PARSERS:
        return fairseq_help(tool, choices)
    commands = {point.name: point for point in entry_points(group="console_scripts")}
    if tool in commands:
        return printed_help(lambda: commands[tool].load()(["--help"]))
    if tool.startswith("-m "):
        return module_help(tool.removeprefix("-m "))
    return script_help(tool)


if __name__ == "__main__":
    requests = json.loads(sys.argv[1])
    json.dump({" ".join([tool, *choices]): command_help(tool, choices) for tool, choices in requests},
              sys.stdout)
