"""Checks of the task's data that the model's build can make before any batch is drawn."""

from ..user_errors import UserError


class LabelCountError(UserError, ValueError):
    """More labels in the data than classification outputs."""


def check_num_classes(task):
    """Refuse a sentence_prediction label dictionary with more labels than ``--num-classes``.

    fairseq builds a head of ``--num-classes`` outputs and fails at the first batch holding a higher
    label id with ``IndexError: Target 2 is out of bounds``.
    """
    labels = getattr(task, "label_dictionary", None)
    cfg = getattr(task, "cfg", None)
    num_classes = getattr(cfg, "num_classes", None)
    if labels is None or num_classes is None or getattr(cfg, "regression_target", False):
        return
    # fairseq-preprocess pads a dictionary to a multiple of 8 symbols with madeupwordNNNN entries, and
    # sentence_prediction's load_dictionary appends <mask> to the label dictionary too
    names = [name for name in labels.symbols[labels.nspecial:]
             if not name.startswith("madeupword") and name != "<mask>"]
    if len(names) > num_classes:
        raise LabelCountError(
            f"the data's label dictionary ({getattr(cfg, 'data', 'DATA')}/label/dict.txt) holds {len(names)} "
            f"labels ({', '.join(names[:10])}) but --num-classes is {num_classes}: pass --num-classes "
            f"{len(names)}, or fix the stray labels and prepare the data again"
        )
