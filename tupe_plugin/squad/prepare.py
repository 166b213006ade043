"""Encode the official SQuAD JSON (v1.1 or v2.0) into features for ``--task squad_span``.

Each question is encoded with the pre-training sentencepiece model as ``<s> question </s> window </s>``,
where the windows slide over the passage pieces by ``--doc-stride`` so that every feature fits
``--max-seq-length`` tokens (the fine-tuning ``--max-positions``); by default the stride is 128 pieces and
questions have up to 64, at most a third and a half of a shorter window. Every passage piece keeps its
character span in the original context (sentencepiece's byte offsets, converted to characters and stripped
of the leading whitespace a piece carries), so that predicted token spans map back to the exact original
text.
The answer labels are its first and last token in the window; ``<s>`` (token 0) when the window does not
hold the answer or the question is unanswerable (v2.0 ``is_impossible``). Training uses the first
answer. Files written to ``--out`` (see ``tupe_plugin/squad/features.py``)::

    dict.txt                      the pre-training dictionary (token ids are its indices)
    SPLIT.tokens.{bin,idx}        token ids per feature (fairseq mmap dataset)
    SPLIT.spans.npy               start/end token per feature
    SPLIT.features.jsonl          question id, first passage token, character span of each passage token

Bad input: a file that is not JSON or an entry without a required field stops with the file and the
entry's path (``data[3].paragraphs[0].qas[2]``). A question longer than ``--max-query-length`` pieces is
skipped, and an answer whose text differs from the context at ``answer_start`` is skipped in train (kept,
as given, in valid); both are logged with the question id and counted in the summary.

Example::

    tupe-prepare-squad --train-file train-v1.1.json --valid-file dev-v1.1.json \\
        --sentencepiece-model data-bin/sentencepiece.bpe.model --dict data-bin/dict.txt --out squad-bin
"""

import argparse
import json
import logging
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass

import numpy as np

from tupe_plugin.checkpoints.vocabulary import check_dictionary_symbols, check_unknown_pieces
from tupe_plugin.cli.prepared_folder import PreparedFolderError, fingerprint, write_prepared_folder
from tupe_plugin.squad.features import NO_ANSWER, features_path, spans_path, tokens_prefix
from tupe_plugin.user_input.path_checks import path_problem

logger = logging.getLogger("prepare_squad")


class SquadFormatError(ValueError):
    """A SQuAD file that cannot be read as the official JSON layout."""


@dataclass
class Example:
    id: str
    question: str
    context: str
    answers: list  # [(text, answer_start)]
    is_impossible: bool


def _field(entry, name, kind, where):
    if not isinstance(entry, dict) or name not in entry:
        raise SquadFormatError(f"{where}: missing '{name}'")
    if not isinstance(entry[name], kind):
        raise SquadFormatError(f"{where}: '{name}' is {type(entry[name]).__name__}, "
                               f"expected {getattr(kind, '__name__', kind)}")
    return entry[name]


def _is_impossible(qa, where):
    """SQuAD v2.0's flag, a JSON boolean: the string "False" is refused, not read as true."""
    value = qa.get("is_impossible", False)
    if not isinstance(value, bool):
        raise SquadFormatError(f"{where}: 'is_impossible' is {type(value).__name__} {value!r}, expected "
                               "true or false (a JSON boolean)")
    return value


def _check_unique_id(seen, qid, where):
    """Question ids name the predictions: two questions with one id would merge their windows."""
    if qid in seen:
        raise SquadFormatError(f"{where}: question id {qid!r} is also used at {seen[qid]}; ids must be "
                               "unique (rename one)")
    seen[qid] = where.split(" (id")[0]


def _load_json(path):
    with open(path, "rb") as f:
        data = f.read()
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise SquadFormatError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x}); "
                               "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    except json.JSONDecodeError as e:
        raise SquadFormatError(f"{path}: not valid JSON ({e})") from None


def read_squad(path, max_articles=None):
    """The questions of a SQuAD JSON file, in file order; ``SquadFormatError`` names file and entry."""
    squad = _load_json(path)
    examples, seen = [], {}
    articles = _field(squad, "data", list, path)[:max_articles]
    for i, article in enumerate(articles):
        for j, paragraph in enumerate(_field(article, "paragraphs", list, f"{path}: data[{i}]")):
            where = f"{path}: data[{i}].paragraphs[{j}]"
            context = _field(paragraph, "context", str, where)
            for k, qa in enumerate(_field(paragraph, "qas", list, where)):
                at = f"{where}.qas[{k}]"
                qid = _field(qa, "id", str, at)
                at += f" (id {qid})"
                impossible = _is_impossible(qa, at)
                _check_unique_id(seen, qid, at)
                answers = []
                for n, answer in enumerate(_field(qa, "answers", list, at)):
                    answers.append((_field(answer, "text", str, f"{at}.answers[{n}]"),
                                    _field(answer, "answer_start", int, f"{at}.answers[{n}]")))
                if not answers and not impossible:
                    raise SquadFormatError(f"{at}: no answers and not is_impossible")
                examples.append(Example(qid, _field(qa, "question", str, at), context, answers, impossible))
    return examples


def encode_context(processor, text):
    """Pieces of ``text`` and the character span [begin, end) in ``text`` of each, leading space removed."""
    char_of_byte = [i for i, ch in enumerate(text) for _ in ch.encode("utf-8")] + [len(text)]
    pieces, offsets = [], []
    for piece in processor.encode(text, return_type="proto").pieces:
        end = char_of_byte[piece.end]
        begin = min(char_of_byte[piece.begin] + len(piece.surface) - len(piece.surface.lstrip()), end)
        pieces.append(piece.piece)
        offsets.append((begin, end))
    return pieces, offsets


def answer_tokens(offsets, begin, end):
    """First and last token overlapping the characters [begin, end), or None."""
    covered = [i for i, (b, e) in enumerate(offsets) if b < e and b < end and e > begin]
    return (covered[0], covered[-1]) if covered else None


def windows(length, room, doc_stride):
    """[start, end) of the passage windows: ``room`` tokens each, starts ``doc_stride`` apart."""
    step, start, spans = min(doc_stride, room), 0, []
    while True:
        spans.append((start, min(length, start + room)))
        if start + room >= length:
            return spans
        start += step


def make_features(examples, processor, dictionary, max_seq_length, doc_stride, max_query_length,
                  skip_mismatched_answers):
    """Token ids, span labels and offsets of every window of every question, and what was skipped."""
    tokens, spans, features, counts = [], [], [], Counter()
    bos, eos = dictionary.bos(), dictionary.eos()
    for example in examples:
        counts["questions"] += 1
        question = processor.encode(example.question, out_type=str)
        if len(question) > max_query_length:
            logger.warning("question %s: %d pieces > --max-query-length %d, skipped",
                           example.id, len(question), max_query_length)
            counts["long_questions_skipped"] += 1
            continue
        pieces, offsets = encode_context(processor, example.context)
        answer = None
        if not example.is_impossible:
            text, start = example.answers[0]
            if example.context[start:start + len(text)] != text:
                logger.warning("question %s: answer %r differs from the context at answer_start %d (%r)%s",
                               example.id, text, start, example.context[start:start + len(text)],
                               ", skipped" if skip_mismatched_answers else "")
                counts["mismatched_answers"] += 1
                if skip_mismatched_answers:
                    continue
            answer = answer_tokens(offsets, start, start + len(text))
            if answer is None:
                logger.warning("question %s: answer %r covers no passage piece, skipped", example.id, text)
                counts["mismatched_answers"] += 1
                continue
        question_ids = [dictionary.index(p) for p in question]
        context_ids = [dictionary.index(p) for p in pieces]
        counts["unknown_pieces"] += (question_ids + context_ids).count(dictionary.unk())
        counts["pieces"] += len(question_ids) + len(context_ids)
        context_start = len(question_ids) + 2
        example_windows = windows(len(pieces), max_seq_length - context_start - 1, doc_stride)
        counts["long_passages"] += len(example_windows) > 1
        for begin, end in example_windows:
            tokens.append([bos, *question_ids, eos, *context_ids[begin:end], eos])
            if answer is not None and begin <= answer[0] and answer[1] < end:
                spans.append((answer[0] - begin + context_start, answer[1] - begin + context_start))
            else:
                spans.append((NO_ANSWER, NO_ANSWER))
            features.append({"id": example.id, "context_start": context_start,
                              "offsets": offsets[begin:end]})
    return tokens, spans, features, counts


def write_split(out, split, dictionary, tokens, spans, features):
    import torch
    from fairseq.data import indexed_dataset

    prefix = tokens_prefix(out, split)
    builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=len(dictionary) + 1)
    for ids in tokens:
        builder.add_item(torch.IntTensor(ids))
    builder.finalize(prefix + ".idx")
    np.save(spans_path(out, split), np.asarray(spans, dtype=np.int64).reshape(-1, 2))
    with open(features_path(out, split), "w", encoding="utf-8") as f:
        for feature in features:
            f.write(json.dumps(feature) + "\n")


def window_defaults(max_seq_length, doc_stride=None, max_query_length=None):
    """``(doc_stride, max_query_length)``, each given or by default scaled to the window.

    Windows of 384 tokens or more: stride 128 and questions up to 64 pieces (Wang et al.'s setting);
    shorter windows (a model pre-trained on short blocks): a third and a half of the window, so that a
    window keeps room for the passage and consecutive windows overlap.
    """
    if doc_stride is None:
        doc_stride = min(128, max_seq_length // 3)
    if max_query_length is None:
        max_query_length = min(64, max_seq_length // 2)
    return doc_stride, max_query_length


def prepare(files, sentencepiece_model, dictionary_path, out, max_seq_length=384, doc_stride=None,
            max_query_length=None, max_articles=None, accept=None):
    """Prepare ``files`` ({split: SQuAD JSON}); return ``({split: counts}, reused)``.

    ``doc_stride`` and ``max_query_length`` default to :func:`window_defaults`. ``out`` is written aside
    and renamed into place when complete; a finished preparation of the same files and settings is
    reused as it is (``reused`` True), one of other files or settings is replaced. ``accept(folder)``
    sees the complete preparation first (:func:`~tupe_plugin.cli.prepared_folder.write_prepared_folder`).
    """
    doc_stride, max_query_length = window_defaults(max_seq_length, doc_stride, max_query_length)
    for path, flag in ((sentencepiece_model, "--sentencepiece-model"), (dictionary_path, "--dict"),
                       *((p, f"--{s}-file") for s, p in files.items())):
        if problem := path_problem(path):
            raise FileNotFoundError(f"{flag} {path}: {problem}")
    if max_query_length + 4 > max_seq_length:
        raise ValueError(f"--max-query-length {max_query_length} leaves no room for the passage in "
                         f"--max-seq-length {max_seq_length} (3 special tokens and at least 1 piece)")
    expected = fingerprint(
        {"sentencepiece_model": sentencepiece_model, "dict": dictionary_path, **files},
        {"max_seq_length": max_seq_length, "doc_stride": doc_stride, "max_query_length": max_query_length,
         "max_articles": max_articles},
    )
    summary, reused = write_prepared_folder(
        out, expected, lambda folder: _prepare_into(files, sentencepiece_model, dictionary_path, folder,
                                                    max_seq_length, doc_stride, max_query_length,
                                                    max_articles),
        "tupe-prepare-squad", accept=accept)
    return {split: Counter(counts) for split, counts in summary.items()}, reused


def _prepare_into(files, sentencepiece_model, dictionary_path, out, max_seq_length, doc_stride,
                  max_query_length, max_articles):
    import sentencepiece as spm
    from fairseq.data import Dictionary

    examples = {split: read_squad(path, max_articles) for split, path in files.items()}
    processor = spm.SentencePieceProcessor(model_file=sentencepiece_model)
    dictionary = Dictionary.load(dictionary_path)
    check_dictionary_symbols(dictionary, processor, dictionary_path, sentencepiece_model)
    shutil.copyfile(dictionary_path, os.path.join(out, "dict.txt"))
    summary = {}
    for split, split_examples in examples.items():
        tokens, spans, features, counts = make_features(
            split_examples, processor, dictionary, max_seq_length, doc_stride, max_query_length,
            skip_mismatched_answers=split == "train")
        if not tokens:
            raise SquadFormatError(f"{files[split]}: no question could be encoded (see the warnings above)")
        check_unknown_pieces(counts["unknown_pieces"], counts["pieces"], dictionary_path, sentencepiece_model)
        write_split(out, split, dictionary, tokens, spans, features)
        counts["features"] = len(tokens)
        counts["no_answer_features"] = sum(span == (NO_ANSWER, NO_ANSWER) for span in spans)
        summary[split] = counts
    return summary


def main(argv=None, accept=None):
    """The command; ``accept``: see :func:`prepare` (tupe-finetune-squad's check of its data)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train-file", help="SQuAD JSON for training (train-v1.1.json, train-v2.0.json)")
    parser.add_argument("--valid-file", help="SQuAD JSON for validation and evaluation (dev-v1.1.json, ...)")
    parser.add_argument("--sentencepiece-model", required=True,
                        help="the pre-training sentencepiece model (data-bin/sentencepiece.bpe.model)")
    parser.add_argument("--dict", required=True, help="the pre-training dictionary (data-bin/dict.txt)")
    parser.add_argument("--out", required=True, help="output folder (squad-bin)")
    parser.add_argument("--max-seq-length", type=int, default=384,
                        help="tokens per feature, at most the model's --max-positions (default 384)")
    parser.add_argument("--doc-stride", type=int,
                        help="passage pieces between window starts (default: 128, at most a third of "
                        "--max-seq-length)")
    parser.add_argument("--max-query-length", type=int,
                        help="longer questions (in pieces) are skipped, logged and counted (default: 64, "
                        "at most half of --max-seq-length)")
    parser.add_argument("--max-articles", type=int, help="keep only the first N articles of each file")
    args = parser.parse_args(argv)
    files = {split: path for split, path in (("train", args.train_file), ("valid", args.valid_file)) if path}
    if not files:
        parser.error("give --train-file, --valid-file or both")
    for flag in ("max_seq_length", "doc_stride", "max_query_length", "max_articles"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    logging.basicConfig(format="%(name)s: %(message)s", level=logging.INFO)
    try:
        summary, reused = prepare(files, args.sentencepiece_model, args.dict, args.out,
                                  args.max_seq_length, args.doc_stride, args.max_query_length,
                                  args.max_articles, accept)
    except (SquadFormatError, FileNotFoundError, ValueError, PreparedFolderError) as e:
        sys.exit(f"tupe-prepare-squad: error: {e}")
    if reused:
        print(f"{args.out} already holds this preparation (same files and settings): reused")
    for split, c in summary.items():
        print(f"{split}: {c['questions']} questions -> {c['features']} features "
              f"({c['long_passages']} passages in several windows, {c['no_answer_features']} features "
              f"without the answer); skipped: {c['long_questions_skipped']} questions longer than "
              f"--max-query-length, {c['mismatched_answers']} answers not matching the context; "
              f"{c['unknown_pieces']} of {c['pieces']} pieces not in --dict -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
