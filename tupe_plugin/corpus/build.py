"""Build an English pre-training corpus and split it into train/valid/test.

By default the text is the docstrings of the Python standard library, which
exists on every machine that has Python, so the demo needs no download.  With
``--corpus FILE`` a text file of your own is used instead.

Output (in ``--output-dir``): ``train.txt``, ``valid.txt`` and ``test.txt``,
one paragraph per line and a blank line between documents, the layout
fairseq's ``masked_lm`` task expects (``--sample-break-mode complete`` or
``complete_doc``).  Long paragraphs are cut at sentence ends into lines of at
most ``--max-words`` words so that every line fits one training block.

Documents are assigned to splits by a seeded hash of their text, so the same
input and seed always give the same files.

Example::

    tupe-build-corpus --output-dir demo/corpus
    tupe-build-corpus --corpus my_text.txt --output-dir demo/corpus
"""

import argparse
import ast
import hashlib
import logging
import os
import re
import sys
import sysconfig
from pathlib import Path

from tupe_plugin.user_input.cli_types import finite_float
from tupe_plugin.user_input.overwritten_inputs import overwritten_input
from ..user_input.path_checks import path_problem

logger = logging.getLogger("build_corpus")

SPLITS = ("train", "valid", "test")

# Standard-library folders whose docstrings are tests, demos, vendored code or
# generated boilerplate rather than prose.
SKIP_DIRS = frozenset(
    {
        "__pycache__",
        "encodings",
        "ensurepip",
        "idlelib",
        "lib2to3",
        "pydoc_data",
        "site-packages",
        "test",
        "tests",
        "turtledemo",
    }
)

DOCSTRING_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")

MIN_WORDS = 3
MIN_LETTER_FRACTION = 0.6


def normalise(text):
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


def wrap(paragraph, max_words):
    """Cut a one-line paragraph into lines of at most ``max_words`` words.

    Whole sentences are packed greedily; a sentence longer than ``max_words``
    is cut between words.
    """
    lines, current = [], []
    for sentence in SENTENCE_END.split(paragraph):
        words = sentence.split()
        if current and len(current) + len(words) > max_words:
            lines.append(" ".join(current))
            current = []
        while len(words) > max_words:
            lines.append(" ".join(words[:max_words]))
            words = words[max_words:]
        current.extend(words)
    if current:
        lines.append(" ".join(current))
    return lines


def is_prose(paragraph):
    """True for a paragraph of words, False for code, tables and doctests."""
    if paragraph.startswith("...") or ">>>" in paragraph:
        return False
    if len(paragraph.split()) < MIN_WORDS:
        return False
    visible = paragraph.replace(" ", "")
    letters = sum(char.isalpha() for char in visible)
    return letters >= MIN_LETTER_FRACTION * len(visible)


def stdlib_files(root):
    """All ``.py`` files under ``root`` outside SKIP_DIRS, in sorted order."""
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(
            name
            for name in subfolders
            if name not in SKIP_DIRS and not name.startswith("config-")
        )
        files.extend(Path(folder, name) for name in sorted(names) if name.endswith(".py"))
    return files


def docstrings(path):
    """Module, class and function docstrings of one source file, in file order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as error:
        logger.debug("skipping %s: %s", path, error)
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, DOCSTRING_OWNERS):
            text = ast.get_docstring(node, clean=True)
            if text:
                found.append(text)
    return found


def stdlib_documents(max_words):
    """One document per standard-library docstring, as a list of lines.

    Paragraphs that are not prose are dropped and a line already seen in an
    earlier docstring is dropped too, so boilerplate appears once.
    """
    root = sysconfig.get_paths()["stdlib"]
    files = stdlib_files(root)
    logger.info("reading docstrings from %d files under %s", len(files), root)
    seen = set()
    documents = []
    for path in files:
        for text in docstrings(path):
            lines = []
            for block in re.split(r"\n\s*\n", text):
                paragraph = normalise(block)
                if not is_prose(paragraph):
                    continue
                for line in wrap(paragraph, max_words):
                    if line not in seen:
                        seen.add(line)
                        lines.append(line)
            if lines:
                documents.append(lines)
    return documents


def file_documents(path, max_words):
    """Documents of a text file, as lists of lines.

    Documents are separated by blank lines; a file without blank lines has
    one document per line.  Whitespace is normalised and long lines are
    wrapped, nothing else is changed.
    """
    text = path.read_text(encoding="utf-8")
    if re.search(r"\n\s*\n", text.strip()):
        blocks = re.split(r"\n\s*\n", text)
    else:
        blocks = text.splitlines()
    documents = []
    for block in blocks:
        lines = []
        for raw_line in block.splitlines():
            line = normalise(raw_line)
            if line:
                lines.extend(wrap(line, max_words))
        if lines:
            documents.append(lines)
    return documents


def split_documents(documents, valid_fraction, test_fraction, seed):
    """Assign documents to train/valid/test by a seeded hash of their text.

    Documents are ranked by hash; the first ones go to valid, the next to
    test, the rest to train.  valid and test get at least one document each.
    Each split keeps the original document order.
    """
    count = len(documents)
    n_valid = max(1, round(count * valid_fraction))
    n_test = max(1, round(count * test_fraction))
    if count < n_valid + n_test + 1:
        raise ValueError(
            f"only {count} document(s): need at least {n_valid + n_test + 1} "
            "to fill train, valid and test"
        )

    def rank(index):
        key = f"{seed}\n" + "\n".join(documents[index])
        return hashlib.sha256(key.encode("utf-8")).hexdigest(), index

    ranked = sorted(range(count), key=rank)
    assignment = {index: "valid" for index in ranked[:n_valid]}
    assignment.update({index: "test" for index in ranked[n_valid : n_valid + n_test]})
    splits = {split: [] for split in SPLITS}
    for index, document in enumerate(documents):
        splits[assignment.get(index, "train")].append(document)
    return splits


def write_split(path, documents):
    """Write documents one line per paragraph, a blank line between documents."""
    path.write_text("\n\n".join("\n".join(lines) for lines in documents) + "\n", encoding="utf-8")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, required=True,
                        help="folder for train.txt, valid.txt, test.txt")
    parser.add_argument("--corpus", type=Path, help="UTF-8 text file to use instead of the standard-library "
                        "docstrings (documents separated by blank lines, or one document per line)")
    for split in ("valid", "test"):
        parser.add_argument(f"--{split}-fraction", type=finite_float, default=0.02,
                            help=f"share of documents for {split} (default 0.02)")
    parser.add_argument("--max-words", type=int, default=48,
                        help="longest line in words; longer paragraphs are cut at sentence ends (default 48)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the split hash (default 1)")
    args = parser.parse_args(argv)
    fractions = {"--valid-fraction": args.valid_fraction, "--test-fraction": args.test_fraction}
    for flag, fraction in fractions.items():
        if not 0 < fraction < 0.5:
            parser.error(f"{flag} must be between 0 and 0.5, got {fraction}")
    if args.max_words < 1:
        parser.error(f"--max-words must be at least 1, got {args.max_words}")
    if args.corpus is not None and (problem := path_problem(args.corpus)):
        parser.error(f"--corpus {args.corpus}: {problem}; give the path of a UTF-8 text file")
    return parser, args


def main(argv=None):
    # force: importing the package (fairseq) has given the root logger a handler already
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", force=True)
    parser, args = parse_args(argv)
    for split in SPLITS:
        if overwritten_input(args.output_dir / f"{split}.txt", (("--corpus", args.corpus),)):
            parser.error(f"--output-dir {args.output_dir}: its {split}.txt is the --corpus file, which the "
                         f"{split} split would overwrite: give another --output-dir")
    if args.corpus is None:
        documents = stdlib_documents(args.max_words)
        source = "Python standard-library docstrings"
    else:
        documents = file_documents(args.corpus, args.max_words)
        source = str(args.corpus)
        if not documents:
            parser.error(f"--corpus: {args.corpus} contains no text; give a non-empty UTF-8 text file")
    try:
        splits = split_documents(documents, args.valid_fraction, args.test_fraction, args.seed)
    except ValueError as error:
        parser.error(f"{source}: {error}; give a larger text")

    args.output_dir.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        path = args.output_dir / f"{split}.txt"
        write_split(path, splits[split])
        lines = sum(len(lines) for lines in splits[split])
        logger.info(
            "%s: %d documents, %d lines, %.2f MB",
            path,
            len(splits[split]),
            lines,
            path.stat().st_size / 1e6,
        )
    logger.info("corpus from %s written to %s", source, args.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
