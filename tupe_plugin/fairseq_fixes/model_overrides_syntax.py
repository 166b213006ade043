"""``--model-overrides`` that is no Python dict is refused as the command line is read, in argparse's line.

fairseq-validate, fairseq-eval-lm and fairseq-generate take ``--model-overrides`` as text and turn it into
a dict only once the run has started (``eval`` / ``ast.literal_eval``): ``"{'max_positions': }"`` ended in
a ``SyntaxError`` traceback from inside fairseq. The flag is given an argparse type that reads the text as a
dict literal and keeps it as text, so fairseq reads it as before.
"""

import argparse
import ast

from fairseq import options
from fairseq.dataclass.configs import CommonEvalConfig

_fairseq_gen_parser_from_dataclass = options.gen_parser_from_dataclass


def model_overrides_text(text):
    """``text`` when it is a Python dict literal of settings by name; argparse's error otherwise."""
    try:
        overrides = ast.literal_eval(text)
    except (SyntaxError, ValueError) as error:
        problem = error.msg if isinstance(error, SyntaxError) else "it holds more than literal values"
        raise argparse.ArgumentTypeError(
            f"{text!r} is no Python dict ({problem}); write the settings as "
            "\"{'max_positions': 1024, 'attention_dropout': 0.0}\"") from None
    if not isinstance(overrides, dict) or not all(isinstance(key, str) for key in overrides):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a {type(overrides).__name__}, not a dict of settings by name; write it as "
            "\"{'max_positions': 1024}\"")
    return text


def gen_parser_from_dataclass(parser, dataclass_instance, *args, **kwargs):
    """fairseq's; the evaluation flags' ``--model-overrides`` gets the type :func:`model_overrides_text`."""
    _fairseq_gen_parser_from_dataclass(parser, dataclass_instance, *args, **kwargs)
    if isinstance(dataclass_instance, CommonEvalConfig):
        for action in parser._group_actions if hasattr(parser, "_group_actions") else parser._actions:
            if action.dest == "model_overrides":
                action.type = model_overrides_text


options.gen_parser_from_dataclass = gen_parser_from_dataclass
