"""Checks of the task's data that the model's build can make before any batch is drawn."""

from ..checkpoints.vocabulary import word_indices
from ..user_input.user_errors import UserError


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
    # the label dictionary holds fairseq-preprocess's padding and the <mask> of sentence_prediction too
    names = [labels[index] for index in word_indices(labels)]
    if len(names) > num_classes:
        raise LabelCountError(
            f"the data's label dictionary ({getattr(cfg, 'data', 'DATA')}/label/dict.txt) holds {len(names)} "
            f"labels ({', '.join(names[:10])}) but --num-classes is {num_classes}: pass --num-classes "
            f"{len(names)}, or fix the stray labels and prepare the data again"
        )
