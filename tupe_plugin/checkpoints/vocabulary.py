"""The words of a fairseq dictionary, and whether a sentencepiece model and a ``dict.txt`` belong
together (tupe-prepare-glue, tupe-prepare-squad).

A ``--dict`` of another sentencepiece model still encodes every piece, as ``<unk>`` when it is missing:
31 % of a task's tokens became ``<unk>`` without a word. A dictionary built from data encoded with the
same model misses only pieces that data never uses alone (many on a small corpus; the ``dict.txt`` that
tupe-train-spm writes has them all), and every one of its symbols is a piece of the model.
"""

import logging
from ..user_input.user_errors import UserError

logger = logging.getLogger(__name__)

MAX_UNKNOWN_FRACTION = 0.2  # of the pieces of the task's text; any is logged with its rate
NOTICEABLE_UNKNOWN_FRACTION = 0.01  # below, a warning would be noise: rare characters, not a wrong --dict
MAX_FOREIGN_FRACTION = 0.1  # of the dictionary's symbols that are no piece of the sentencepiece model


def word_indices(dictionary):
    """Indices of the dictionary's words: after its special symbols (``<s>``, ``<pad>``, ``</s>``,
    ``<unk>``), none starting with ``<`` (``<mask>``; the official TUPE release's ``<url>``, ...), none of
    the ``madeupwordNNNN`` entries fairseq-preprocess pads a dictionary with to a multiple of 8 symbols."""
    return [index for index in range(dictionary.nspecial, len(dictionary))
            if not dictionary[index].startswith(("<", "madeupword"))]


class DictionaryFitError(UserError, ValueError):
    """A ``--dict`` that does not hold the pieces of ``--sentencepiece-model``."""


def check_unknown_pieces(unknown, total, dictionary_path, sentencepiece_model, examples=()):
    """Refuse more than :data:`MAX_UNKNOWN_FRACTION` of pieces missing from the dictionary; log any, as a
    warning from :data:`NOTICEABLE_UNKNOWN_FRACTION` on (below it, characters the pre-training text lacks)."""
    if total == 0 or unknown == 0:
        return
    rate = unknown / total
    message = (f"{unknown} of {total} pieces ({100 * rate:.1f}%) of --sentencepiece-model "
               f"{sentencepiece_model} are not in --dict {dictionary_path} and become <unk>")
    if rate > MAX_UNKNOWN_FRACTION:
        raise DictionaryFitError(
            message + ": the dictionary was built for another sentencepiece model; pass the pair of the "
            "pre-training data-bin (its sentencepiece.bpe.model and dict.txt)"
        )
    if examples:
        message += f" (e.g. {', '.join(repr(piece) for piece in examples)})"
    if rate < NOTICEABLE_UNKNOWN_FRACTION:
        logger.info(message + ": characters the pre-training text does not have")
    else:
        logger.warning(message + "; the dict.txt of tupe-train-spm (fairseq-preprocess --srcdict) has every "
                       "piece")


def check_dictionary_symbols(dictionary, processor, dictionary_path, sentencepiece_model,
                             flags=("--dict", "--sentencepiece-model")):
    """Refuse a dictionary whose symbols are mostly not pieces of the sentencepiece model ``processor``;
    ``flags`` name the two paths in the message."""
    symbols = [dictionary[index] for index in word_indices(dictionary)]
    foreign = [s for s in symbols if processor.piece_to_id(s) == processor.unk_id()]
    if symbols and len(foreign) > MAX_FOREIGN_FRACTION * len(symbols):
        raise DictionaryFitError(
            f"{len(foreign)} of the {len(symbols)} symbols of {flags[0]} {dictionary_path} (e.g. "
            f"{', '.join(repr(s) for s in foreign[:3])}) are not pieces of {flags[1]} "
            f"{sentencepiece_model}: the dictionary was built for another sentencepiece model; pass the "
            "pair of the pre-training data-bin (its sentencepiece.bpe.model and dict.txt)"
        )
