"""Encode and binarize one GLUE task for fairseq's ``sentence_prediction`` task.

Reads ``GLUE_DIR/TASK/train.tsv`` and the task's dev file in the standard GLUE tsv layout, encodes the
input columns with the pre-training sentencepiece model and binarizes them against the pre-training
dictionary, the layout fairseq's RoBERTa GLUE example produces::

    OUT/input0/{train,valid}.{bin,idx}, dict.txt     first sentence (pieces, binarized with --srcdict DICT)
    OUT/input1/...                                   second sentence (pair tasks only)
    OUT/label/{train,valid}.{bin,idx}, dict.txt      classification: labels binarized, dict built from train
    OUT/label/{train,valid}.label                    regression (STS-B): one float per line, score / 5
    OUT/raw/{train,valid}.{input0,input1,label}      the encoded text that was binarized

STS-B scores are divided by 5 as in fairseq's example (targets in [0, 1]); Pearson and Spearman
correlations do not change. A line with the wrong number of columns stops with ``file:line``, or is
logged and counted with ``--skip-malformed``. A dev label that train does not contain stops with its name,
a header without a column for the label (GLUE's test files) with the column expected.

Example::

    tupe-prepare-glue --task RTE --glue-dir glue_data \\
        --sentencepiece-model data-bin/sentencepiece.bpe.model --dict data-bin/dict.txt --out RTE-bin
"""

import argparse
import json
import logging
import os
import subprocess
import sys
from collections import Counter

from tupe_plugin.cli.prepared_folder import fingerprint, write_prepared_folder
from tupe_plugin.glue.tasks import GLUE_TASKS
from tupe_plugin.user_input.path_checks import path_problem

logger = logging.getLogger("prepare_glue")


STSB_SCALE = 5.0


class GlueFormatError(ValueError):
    """A GLUE tsv file that cannot be read as its task's layout."""


def read_tsv(path, layout, skip_malformed=False, max_examples=None):
    """Rows of ``path`` as ``(line_number, [input0, input1?], label)``, and the number of skipped lines.

    ``layout`` is the file's :class:`~tupe_plugin.glue.tasks.GlueTask`. The expected column count is the
    header's (MNLI's train and dev files differ), or ``layout.columns`` for files without a header.
    """
    rows, skipped = [], 0
    task_dir = os.path.basename(os.path.dirname(path))
    with open(path, "rb") as f:
        columns = layout.columns
        for number, raw in enumerate(f, start=1):
            line = decode_line(path, number, raw)
            fields = line.rstrip("\r\n").split("\t")
            if layout.header and number == 1:
                columns, header = len(fields), fields
                check_label_column(path, header, layout)
                continue
            if len(fields) != columns:
                message = (f"{path}:{number}: expected {columns} tab-separated columns for {task_dir}, "
                           f"found {len(fields)}")
                if not skip_malformed:
                    raise GlueFormatError(message + " (--skip-malformed skips such lines)")
                logger.warning("skipped %s", message)
                skipped += 1
                continue
            inputs = [fields[layout.input0]]
            if layout.input1 is not None:
                inputs.append(fields[layout.input1])
            rows.append((number, inputs, fields[layout.label].strip()))
            if max_examples is not None and len(rows) >= max_examples:
                break
    if not rows:
        raise GlueFormatError(f"{path}: no examples")
    if layout.header:
        check_header(path, header, layout, rows)
    return rows, skipped


def check_label_column(path, header, layout):
    """Stop when the header leaves no column for the label (as in GLUE's test files): rows would have none."""
    counted_from_start = [index for index in (layout.input0, layout.input1, layout.label)
                          if index is not None and index >= 0]
    columns = max(counted_from_start) + 1 + (layout.label < 0)  # a label counted from the end follows them
    if len(header) < columns:
        task_dir = os.path.basename(os.path.dirname(path))
        label_column = layout.label + 1 if layout.label >= 0 else columns + layout.label + 1
        raise GlueFormatError(
            f"{path}:1: the header names {len(header)} columns ({', '.join(header)}) where {task_dir} needs "
            f"{columns}, its label in column {label_column}: the file has no label column (GLUE's test.tsv "
            f"files have none); give {task_dir}'s train or dev file, with its labels"
        )


def check_header(path, header, layout, rows):
    """Stop when line 1 is an example, not the header: reading it as the header loses that example."""
    label = header[layout.label].strip() if len(header) > max(layout.input0, layout.label) else None
    if label is None or label in {row_label for _, _, row_label in rows} or _is_number(label):
        raise GlueFormatError(
            f"{path}:1: expected the header line of {os.path.basename(os.path.dirname(path))} "
            f"(column names), found an example (label {label!r}); restore the header line "
            "(the GLUE files have one)"
        )


def _is_number(text):
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def decode_line(path, number, raw):
    """A line as UTF-8 text (utf-8-sig on line 1 drops MRPC's byte-order mark), naming file and line."""
    try:
        return raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as error:
        raise GlueFormatError(
            f"{path}:{number}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column {error.start + 1}); "
            "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def regression_targets(path, rows):
    """STS-B scores as fairseq's regression targets (score / 5), naming ``file:line`` of a bad one."""
    targets = []
    for number, _, label in rows:
        try:
            score = float(label)
        except ValueError:
            raise GlueFormatError(f"{path}:{number}: score {label!r} is not a number") from None
        if not 0 <= score <= STSB_SCALE:  # also nan
            raise GlueFormatError(f"{path}:{number}: score {label!r} is outside STS-B's range [0, 5]")
        targets.append(score / STSB_SCALE)
    return targets


def check_label_count(task, path, labels):
    """Stop on more distinct train labels than the task has classes (tupe-finetune-glue's --num-classes)."""
    found = sorted(set(labels))
    num_classes = GLUE_TASKS[task].num_classes
    if len(found) > num_classes:
        raise GlueFormatError(
            f"{path}: {len(found)} distinct labels ({', '.join(found[:10])}) where {task} has "
            f"{num_classes} classes: fix the stray labels (or the label column)"
        )


def check_dictionary_fits(processor, dictionary_path, sentencepiece_model):
    """Refuse a --dict built for another sentencepiece model (see tupe_plugin.checkpoints.vocabulary)."""
    from fairseq.data import Dictionary

    from tupe_plugin.checkpoints.vocabulary import check_dictionary_symbols

    check_dictionary_symbols(Dictionary.load(dictionary_path), processor, dictionary_path,
                             sentencepiece_model)


def check_pieces_in_dictionary(pieces, dictionary_path, sentencepiece_model):
    """Refuse a --dict that does not hold the sentencepiece model's pieces, ``pieces`` the encoded lines of
    the whole task (see tupe_plugin.checkpoints.vocabulary)."""
    from fairseq.data import Dictionary

    from tupe_plugin.checkpoints.vocabulary import check_unknown_pieces

    dictionary = Dictionary.load(dictionary_path)
    flat = [piece for line in pieces for piece in line]
    unknown = Counter(piece for piece in flat if dictionary.index(piece) == dictionary.unk())
    check_unknown_pieces(sum(unknown.values()), len(flat), dictionary_path, sentencepiece_model,
                         [piece for piece, _ in unknown.most_common(3)])


def check_dev_labels(train_labels, dev_path, dev_rows):
    """Stop on a dev label that train does not have: fairseq would silently map it to <unk>."""
    known = set(train_labels)
    for number, _, label in dev_rows:
        if label not in known:
            raise GlueFormatError(
                f"{dev_path}:{number}: label {label!r} does not occur in train "
                f"(train labels: {', '.join(sorted(known))})"
            )


# fairseq-preprocess's main for each command line in one child process (fairseq's import, seconds, paid once);
# each run adds a handler of a log file in its --destdir to the module's logger, closed before the next run
_MARKER = "=== fairseq-preprocess --destdir "
_PREPROCESS_EACH = f"""
import json, sys
from fairseq import options
from fairseq_cli import preprocess
for argv in json.loads(sys.argv[1]):
    print({_MARKER!r} + argv[argv.index("--destdir") + 1], flush=True)
    preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    for handler in list(preprocess.logger.handlers):
        preprocess.logger.removeHandler(handler)
        handler.close()
"""


def binarize(folders, workers=1):
    """Run ``fairseq-preprocess --only-source`` for each (destdir, trainpref, validpref, srcdict or None) of
    ``folders``, one after the other in one child process."""
    commands = [["--only-source", "--trainpref", trainpref, "--validpref", validpref, "--destdir", destdir,
                 "--workers", str(workers), *(["--srcdict", srcdict] if srcdict is not None else [])]
                for destdir, trainpref, validpref, srcdict in folders]
    proc = subprocess.run([sys.executable, "-c", _PREPROCESS_EACH, json.dumps(commands)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        failed = proc.stdout.rpartition(_MARKER)[2]
        destdir, _, output = failed.partition("\n")
        raise RuntimeError(f"fairseq-preprocess for {destdir} failed:\n{output[-3000:]}")


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(f"{line}\n")


def task_files(task, glue_dir, sentencepiece_model, dictionary):
    """``{split: tsv path}`` of ``task``, after checking that every input file exists."""
    for path, flag in ((sentencepiece_model, "--sentencepiece-model"), (dictionary, "--dict")):
        if problem := path_problem(path):
            raise FileNotFoundError(f"{flag} {path}: {problem}")
    files = GLUE_TASKS[task].files(glue_dir)
    for path in files.values():
        if problem := path_problem(path):
            raise FileNotFoundError(f"{path}: {problem} (--glue-dir {glue_dir}, --task {task})")
    return files


def prepare(task, glue_dir, sentencepiece_model, dictionary, out, max_examples=None,
            skip_malformed=False, workers=1, accept=None):
    """Prepare ``task`` into ``out``; return ``{split: number of examples}`` plus ``skipped`` and ``reused``.

    ``out`` is written aside and renamed into place when complete; a finished preparation of the same
    files and settings is reused as it is, one of other files or settings is replaced. ``accept(folder)``
    sees the complete preparation first (:func:`~tupe_plugin.cli.prepared_folder.write_prepared_folder`).
    """
    files = task_files(task, glue_dir, sentencepiece_model, dictionary)
    expected = fingerprint(
        {"sentencepiece_model": sentencepiece_model, "dict": dictionary, **files},
        {"task": task, "max_examples": max_examples, "skip_malformed": skip_malformed},
    )
    counts, reused = write_prepared_folder(
        out, expected, lambda folder: _prepare_into(task, glue_dir, sentencepiece_model, dictionary,
                                                    folder, max_examples, skip_malformed, workers),
        "tupe-prepare-glue", accept=accept)
    return {**counts, "reused": reused}


def _prepare_into(task, glue_dir, sentencepiece_model, dictionary, out, max_examples, skip_malformed,
                  workers):
    import sentencepiece as spm

    layout = GLUE_TASKS[task]
    files = task_files(task, glue_dir, sentencepiece_model, dictionary)

    data, skipped = {}, 0
    for split, path in files.items():
        data[split], n = read_tsv(path, layout, skip_malformed, max_examples)
        skipped += n
    if not layout.regression:
        check_label_count(task, files["train"], [label for _, _, label in data["train"]])
        check_dev_labels([label for _, _, label in data["train"]], files["valid"], data["valid"])

    processor = spm.SentencePieceProcessor(model_file=sentencepiece_model)
    check_dictionary_fits(processor, dictionary, sentencepiece_model)
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    encoded = []
    for split, rows in data.items():
        for i in range(len(rows[0][1])):
            pieces = processor.encode([inputs[i] for _, inputs, _ in rows], out_type=str)
            encoded += pieces
            write_lines(os.path.join(raw, f"{split}.input{i}"), (" ".join(p) for p in pieces))
        if layout.regression:
            os.makedirs(os.path.join(out, "label"), exist_ok=True)
            write_lines(os.path.join(out, "label", f"{split}.label"), regression_targets(files[split], rows))
        else:
            write_lines(os.path.join(raw, f"{split}.label"), (label for _, _, label in rows))

    check_pieces_in_dictionary(encoded, dictionary, sentencepiece_model)
    inputs = ["input0"] + (["input1"] if layout.input1 is not None else [])
    folders = [(os.path.join(out, name), os.path.join(raw, f"train.{name}"),
                os.path.join(raw, f"valid.{name}"), dictionary) for name in inputs]
    if not layout.regression:
        folders.append((os.path.join(out, "label"), os.path.join(raw, "train.label"),
                        os.path.join(raw, "valid.label"), None))
    binarize(folders, workers=workers)

    counts = {split: len(rows) for split, rows in data.items()}
    counts["skipped"] = skipped
    if not layout.regression:
        counts["labels"] = dict(Counter(label for _, _, label in data["train"]).most_common())
    return counts


def main(argv=None, accept=None):
    """The command; ``accept``: see :func:`prepare` (tupe-finetune-glue's check of its data)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", required=True, choices=sorted(GLUE_TASKS), help="GLUE task (folder name)")
    parser.add_argument("--glue-dir", required=True, help="folder holding TASK/train.tsv and TASK/dev.tsv")
    parser.add_argument("--sentencepiece-model", required=True,
                        help="the pre-training sentencepiece model (data-bin/sentencepiece.bpe.model)")
    parser.add_argument("--dict", required=True, help="the pre-training dictionary (data-bin/dict.txt)")
    parser.add_argument("--out", required=True, help="output folder (TASK-bin)")
    parser.add_argument("--max-examples", type=int, help="keep only the first N examples of each split")
    parser.add_argument("--skip-malformed", action="store_true",
                        help="log and count lines with a wrong column count instead of stopping")
    parser.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    args = parser.parse_args(argv)
    if args.max_examples is not None and args.max_examples < 1:
        parser.error("--max-examples must be at least 1")
    logging.basicConfig(format="%(name)s: %(message)s", level=logging.INFO)
    try:
        counts = prepare(args.task, args.glue_dir, args.sentencepiece_model, args.dict, args.out,
                         args.max_examples, args.skip_malformed, args.workers, accept)
    except (GlueFormatError, FileNotFoundError, RuntimeError, ValueError) as e:
        # PreparedFolderError included (a RuntimeError)
        sys.exit(f"tupe-prepare-glue: error: {e}")
    labels = counts.get("labels")
    if counts["reused"]:
        print(f"{args.task}: {args.out} already holds this preparation (same files and settings): reused")
    print(f"{args.task}: train {counts['train']}, valid {counts['valid']}, skipped malformed "
          f"{counts['skipped']}" + (f", train labels {labels}" if labels else ", regression (score / 5)")
          + f" -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
