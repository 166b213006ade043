"""Train a sentencepiece model on a corpus and encode its splits into pieces.

Reads ``train.txt`` (and ``valid.txt``, ``test.txt`` when present) from
``--corpus-dir`` as written by ``tupe-build-corpus``, trains a
sentencepiece model on ``train.txt`` and writes to ``--output-dir``:

- ``spm.model``, ``spm.vocab``: the sentencepiece model;
- ``train.bpe``, ``valid.bpe``, ``test.bpe``: the splits as space-separated
  pieces, line for line (blank lines stay blank), ready for
  ``fairseq-preprocess --only-source``.  A line of more than ``--max-pieces``
  pieces is cut into several lines, so that every line fits one
  ``masked_lm`` block (``--tokens-per-sample`` minus ``<s>`` and ``</s>``);
- ``dict.txt``: every piece of the model and token of ``train.bpe``, by count, for
  ``fairseq-preprocess --srcdict``.  A dictionary that fairseq-preprocess builds
  from ``train.bpe`` lacks the pieces the training text never uses alone (on
  a small corpus "," or "Q"), and fine-tuning text made of them got ``<unk>``.

Training is deterministic for a given corpus, seed and thread count.  To let
fairseq encode raw text with the same model, pass
``--bpe sentencepiece --sentencepiece-model OUTPUT_DIR/spm.model``.

Example::

    tupe-train-spm --corpus-dir demo/corpus --output-dir demo/spm
"""

import argparse
import logging
import re
import sys
from collections import Counter
from pathlib import Path

import sentencepiece as spm

from ..user_input.path_checks import path_problem
from ..user_input.user_errors import UserError

logger = logging.getLogger("train_spm")

SPLITS = ("train", "valid", "test")


class VocabularyTooSmallError(UserError, ValueError):
    """--vocab-size below the pieces sentencepiece cannot do without: every character of the corpus and
    the special pieces."""


def train(train_file, model_prefix, vocab_size, model_type, input_sentence_size, seed, threads):
    """Train a sentencepiece model; returns the path of the ``.model`` file.

    ``vocab_size`` is a soft limit, so a small corpus gets a smaller vocabulary
    instead of an error.
    """
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            input=str(train_file),
            model_prefix=str(model_prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            hard_vocab_limit=False,
            num_threads=threads,
            minloglevel=2,
        )
    except RuntimeError as error:
        needed = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", str(error))
        if needed is None:
            raise
        raise VocabularyTooSmallError(
            f"--vocab-size {vocab_size} is smaller than the {needed[1]} pieces sentencepiece needs for "
            f"{train_file}: each of its characters and the special pieces (character coverage 1.0): give "
            f"--vocab-size {needed[1]} or more") from None
    return model_prefix.with_suffix(".model")


def fewer_pieces_notice(model_file, got, asked, train_file):
    """One line: the vocabulary is smaller than --vocab-size, and why."""
    return (f"{model_file} has {got} pieces, not the {asked} of --vocab-size: sentencepiece finds no more "
            f"in {train_file} ({train_file.stat().st_size / 1e6:.2f} MB) and takes --vocab-size as an upper "
            "bound; more text gives more pieces")


def cut(pieces, max_pieces):
    """Split one encoded line into lines of at most ``max_pieces`` pieces."""
    if not pieces:
        return [[]]
    return [pieces[start : start + max_pieces] for start in range(0, len(pieces), max_pieces)]


def cut_notice(cut_lines, max_pieces):
    """What :func:`encode_file` did to the lines longer than ``max_pieces``, in words."""
    if not cut_lines:
        return f"no line longer than --max-pieces {max_pieces}"
    return (f"{cut_lines} line{'s' if cut_lines > 1 else ''} longer than --max-pieces {max_pieces} "
            f"split into lines of at most {max_pieces} pieces (a block of --tokens-per-sample "
            f"{max_pieces + 2} holds a whole line with <s> and </s>)")


def encode_file(processor, source, target, max_pieces):
    """Write ``source`` as space-separated pieces to ``target``.

    Returns the number of pieces and the number of lines that were cut.
    """
    lines = source.read_text(encoding="utf-8").splitlines()
    encoded = processor.encode(lines, out_type=str)
    with target.open("w", encoding="utf-8") as out:
        for pieces in encoded:
            for chunk in cut(pieces, max_pieces):
                out.write(" ".join(chunk) + "\n")
    return sum(len(pieces) for pieces in encoded), sum(len(pieces) > max_pieces for pieces in encoded)


def write_dictionary(processor, train_bpe, target):
    """fairseq's ``dict.txt``: every piece of the model (but ``<s>``, ``</s>``, ``<unk>``, fairseq's own) and
    every other token of ``train_bpe`` (a character sentencepiece maps to its ``<unk>``), by count."""
    counts = Counter(train_bpe.read_text(encoding="utf-8").split())
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_control(i) or processor.is_unknown(i))]
    tokens = list(dict.fromkeys(pieces + list(counts)))
    with target.open("w", encoding="utf-8") as out:
        for token in sorted(tokens, key=lambda token: -counts[token]):  # stable: ties in the model's order
            out.write(f"{token} {counts[token]}\n")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-dir", type=Path, required=True,
                        help="folder with train.txt (valid.txt, test.txt)")
    parser.add_argument("--output-dir", type=Path, required=True,
                        help="folder for spm.model and the .bpe files")
    parser.add_argument("--vocab-size", type=int, default=8000,
                        help="vocabulary size, at most: a small corpus gives fewer pieces, and says so "
                        "(default 8000)")
    parser.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram", help="default unigram")
    parser.add_argument("--input-sentence-size", type=int, default=100000,
                        help="train on at most this many lines of train.txt, sampled with --seed "
                        "(default 100000)")
    parser.add_argument("--max-pieces", type=int, default=126, help="longest encoded line; longer lines are "
                        "cut (default 126: --tokens-per-sample 128 minus <s> and </s>)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the line sampling (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="training threads (default 2)")
    args = parser.parse_args(argv)
    if args.vocab_size < 8:
        parser.error(f"--vocab-size must be at least 8, got {args.vocab_size}")
    if args.max_pieces < 1:
        parser.error(f"--max-pieces must be at least 1, got {args.max_pieces}")
    train_file = args.corpus_dir / "train.txt"
    for path, expected in ((args.corpus_dir, "folder"), (train_file, "file")):
        if problem := path_problem(path, expected):
            parser.error(f"--corpus-dir: {path}: {problem}; build it with "
                         "tupe-build-corpus --output-dir DIR, and give that DIR")
    if not train_file.read_text(encoding="utf-8").strip():
        parser.error(f"--corpus-dir: {train_file} is empty; rebuild the corpus")
    return args


def main(argv=None):
    # force: importing the package (fairseq) has given the root logger a handler already
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", force=True)
    args = parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model_file = train(
        args.corpus_dir / "train.txt",
        args.output_dir / "spm",
        args.vocab_size,
        args.model_type,
        args.input_sentence_size,
        args.seed,
        args.threads,
    )
    processor = spm.SentencePieceProcessor(model_file=str(model_file))
    logger.info("trained %s: %s, %d pieces", model_file, args.model_type, processor.get_piece_size())
    if processor.get_piece_size() < args.vocab_size:
        logger.warning(fewer_pieces_notice(model_file, processor.get_piece_size(), args.vocab_size,
                                           args.corpus_dir / "train.txt"))
    for split in SPLITS:
        source = args.corpus_dir / f"{split}.txt"
        if not source.is_file():
            continue
        target = args.output_dir / f"{split}.bpe"
        pieces, cut_lines = encode_file(processor, source, target, args.max_pieces)
        logger.info("%s: %d pieces; %s", target, pieces, cut_notice(cut_lines, args.max_pieces))
    write_dictionary(processor, args.output_dir / "train.bpe", args.output_dir / "dict.txt")
    logger.info("%s: every piece, for fairseq-preprocess --srcdict", args.output_dir / "dict.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
