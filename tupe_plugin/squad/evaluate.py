"""Evaluate a ``squad_span`` checkpoint on SQuAD: predictions JSON and the official EM and F1.

Two modes:

- ``--path CKPT --data SQUAD-BIN --gold-file dev.json``: run the model, write ``--output``, print the scores;
- ``--gold-file dev.json --predictions predictions.json`` (no model): score a predictions file, with the
  interface and output of the official evaluation script (``--version-2-with-negative`` for v2.0).

Each version's own rules apply (:mod:`tupe_plugin.squad.metric`): v1.1 keeps gold answers that normalise
to the empty string and averages over every question of the file; v2.0 drops them and averages over the
predicted questions.

Runs the model over the features ``tupe-prepare-squad`` wrote for ``--split`` (default valid),
decodes each question's answer from all its windows (:mod:`tupe_plugin.squad.spans`: best valid span,
start <= end, at most ``--max-answer-length`` tokens, ``--n-best`` starts and ends per window; with
``--version-2-with-negative`` no answer when null score - best span score > ``--null-threshold``),
writes ``{question id: answer text}`` to ``--output`` and prints EM and F1 computed as the official
evaluation scripts do against the gold answers of ``--gold-file``, the SQuAD JSON the features were
prepared from (same ``--max-articles``). Questions without a prediction (skipped by tupe-prepare-squad)
score 0 in v1.1, as in the official script; when most questions have none (features prepared from part
of the file), a warning says so. Predicted ids that are no question of ``--gold-file`` are named in a
warning, and stop the scoring when none is; a gold answer that is not a string stops it, naming the question.

Example::

    tupe-evaluate-squad --path checkpoints/squad/checkpoint_best.pt --data squad-bin \\
        --gold-file dev-v1.1.json --output predictions.json
    tupe-evaluate-squad --gold-file dev-v1.1.json --predictions predictions.json
"""

import argparse
import json
import logging
import sys

import torch

from tupe_plugin.squad.features import features_path, load_features
from tupe_plugin.squad.metric import evaluate, official_output, questions
from tupe_plugin.squad.spans import best_answer
from tupe_plugin.user_input.cli_types import at_least_one, finite_float
from tupe_plugin.user_input.overwritten_inputs import overwritten_input
from tupe_plugin.user_input.path_checks import path_problem

logger = logging.getLogger("evaluate_squad")


def span_logits(checkpoint, data_dir, split="valid", batch_size=16, cpu=False):
    """Start and end logits of every feature of ``split``, unpadded, in feature order."""
    from fairseq import checkpoint_utils, utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data_dir}
    )
    model = models[0].eval()
    use_cuda = torch.cuda.is_available() and not cpu
    if use_cuda:
        model.cuda()
    dataset = task.load_dataset(split)
    batches = task.get_batch_iterator(dataset, max_sentences=batch_size, ignore_invalid_inputs=False,
                                      num_workers=0).next_epoch_itr(shuffle=False)
    logits = [None] * len(dataset)
    with torch.no_grad():
        for sample in batches:
            if use_cuda:
                sample = utils.move_to_cuda(sample)
            (starts, ends), _ = model(**sample["net_input"], span_head_name=task.cfg.span_head_name)
            for row, index in enumerate(sample["id"].tolist()):
                length = int(sample["net_input"]["src_lengths"][row])
                logits[index] = (starts[row, :length].float().cpu().numpy(),
                                 ends[row, :length].float().cpu().numpy())
    return logits


def predict_answers(articles, features, logits, **decoding):
    """{question id: QuestionAnswer} for every question that has features."""
    contexts = {qa["id"]: paragraph["context"] for article in articles
                for paragraph in article["paragraphs"] for qa in paragraph["qas"]}
    windows = {}
    for feature, (start_logits, end_logits) in zip(features, logits):
        if feature["id"] not in contexts:
            raise ValueError(f"question {feature['id']} of the features is not in the gold file: prepare and "
                             "evaluate with the same SQuAD JSON and --max-articles")
        windows.setdefault(feature["id"], []).append((start_logits, end_logits, feature))
    return {qid: best_answer(contexts[qid], question_windows, **decoding)
            for qid, question_windows in windows.items()}


def read_json(path, flag, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, IsADirectoryError):
        sys.exit(f"tupe-evaluate-squad: error: {flag} {path}: {path_problem(path)}")
    except (ValueError, UnicodeDecodeError) as e:
        sys.exit(f"tupe-evaluate-squad: error: {flag} {path} is not a {what} JSON file ({e})")


def check_gold_answers(articles, gold_file):
    """Stop on a gold answer that is not ``{"text": string, ...}`` (a number, a list, null), naming it."""
    for where, question in _located_questions(articles):
        malformed = _malformed_answer(question.get("answers", []))
        if malformed is not None:
            part, value = malformed
            sys.exit(f"tupe-evaluate-squad: error: --gold-file {gold_file}: {where} "
                     f"(id {question.get('id')}): {part} is {json.dumps(value)}: gold answers are "
                     '[{"text": "a string", "answer_start": N}, ...]; correct the file')


def _located_questions(articles):
    """(its place in the file, e.g. ``data[0].paragraphs[1].qas[2]``, question) of every question."""
    for i, article in enumerate(articles):
        for j, paragraph in enumerate(article["paragraphs"]):
            for k, question in enumerate(paragraph["qas"]):
                yield f"data[{i}].paragraphs[{j}].qas[{k}]", question


def _malformed_answer(answers):
    """(where, value) of the first part of ``answers`` that is not a list of ``{"text": string}``, or None."""
    if not isinstance(answers, list):
        return "answers", answers
    for n, answer in enumerate(answers):
        if not isinstance(answer, dict):
            return f"answers[{n}]", answer
        if not isinstance(answer.get("text"), str):
            return f"answers[{n}].text", answer.get("text")
    return None


def check_predicted_ids(predictions, articles, args):
    """Stop when no predicted id is a question of --gold-file; warn about the ids that are not."""
    gold_ids = {question["id"] for question in questions(articles)}
    unknown = [qid for qid in predictions if qid not in gold_ids]
    example = f" (e.g. {unknown[0]})" if unknown else ""
    if len(unknown) == len(predictions):
        sys.exit(f"tupe-evaluate-squad: error: none of the {len(predictions)} question ids of --predictions "
                 f"{args.predictions}{example} is in --gold-file {args.gold_file}: score the predictions "
                 "against the SQuAD JSON they were made from (and its --max-articles)")
    if unknown:
        print(f"tupe-evaluate-squad: warning: {len(unknown)} of the {len(predictions)} predicted "
              f"question ids are not in {args.gold_file}{example}; they are not scored", file=sys.stderr)


def warn_missing(scores, gold_file, total, max_articles=None):
    """A warning line on stderr for the questions of ``gold_file`` (``total``) without a prediction; loud
    when they are the majority."""
    missing = scores["missing"]
    if not missing:
        return
    predicted = total - len(missing)
    if len(missing) * 2 > total:
        hint = ("the predictions cover only part of --gold-file: evaluate against the part they were made "
                "from" + (" (--max-articles N, as given to tupe-prepare-squad)"
                          if max_articles is None else ""))
        print(f"tupe-evaluate-squad: WARNING: {len(missing)} of the {total} questions of {gold_file} have no "
              f"prediction ({predicted} predicted); {hint}", file=sys.stderr)
    else:
        print(f"tupe-evaluate-squad: warning: {len(missing)} of the {total} questions of {gold_file} have no "
              f"prediction (e.g. {missing[0]})", file=sys.stderr)


def score_predictions(args):
    """The official script's mode: --gold-file and --predictions, no model."""
    dataset = read_json(args.gold_file, "--gold-file", "SQuAD")
    predictions = read_json(args.predictions, "--predictions", "predictions")
    if not isinstance(dataset, dict) or "data" not in dataset:
        sys.exit(f"tupe-evaluate-squad: error: --gold-file {args.gold_file} has no \"data\" list: "
                 "give the official SQuAD JSON")
    if not isinstance(predictions, dict):
        sys.exit(f"tupe-evaluate-squad: error: --predictions {args.predictions} must map question ids "
                 "to answer texts ({\"id\": \"text\", ...})")
    not_text = next((qid for qid, text in predictions.items() if not isinstance(text, str)), None)
    if not_text is not None:
        sys.exit(f"tupe-evaluate-squad: error: --predictions {args.predictions}: the answer of {not_text} is "
                 f"{json.dumps(predictions[not_text])}, not a text: predictions map question ids to answer "
                 "texts ({\"id\": \"text\", ...}; \"\" for no answer)")
    version = "2.0" if args.version_2_with_negative else "1.1"
    if str(dataset.get("version")).lstrip("v") != version:  # the official files say "1.1" and "v2.0"
        print(f"tupe-evaluate-squad: warning: --gold-file {args.gold_file} is version "
              f"{dataset.get('version')}, scored with the v{version} rules"
              + ("" if args.version_2_with_negative else " (--version-2-with-negative for v2.0)"),
              file=sys.stderr)
    articles = dataset["data"][:args.max_articles]
    check_gold_answers(articles, args.gold_file)
    check_predicted_ids(predictions, articles, args)
    unanswerable = [q["id"] for q in questions(articles) if not q.get("answers")]
    if unanswerable and version == "1.1":
        sys.exit(f"tupe-evaluate-squad: error: --gold-file {args.gold_file} has {len(unanswerable)} "
                 f"questions without an answer (SQuAD v2.0, e.g. {unanswerable[0]}): score it with "
                 "--version-2-with-negative")
    scores = evaluate(articles, predictions, version)
    warn_missing(scores, args.gold_file, len(list(questions(articles))), args.max_articles)
    print(json.dumps(official_output(scores), indent=2 if version == "2.0" else None))
    return scores


class FeatureMismatchError(ValueError):
    """A features file that does not describe the prepared tokens it is evaluated with."""


def check_features(features, logits, features_file):
    """Refuse features that are not those of the tokens (count, lengths) or that repeat a question id
    in two places (windows of one question are consecutive): decoding would use the wrong context."""
    if len(features) != len(logits):
        raise FeatureMismatchError(
            f"{features_file} lists {len(features)} features but the prepared tokens hold {len(logits)}: "
            "the file is truncated or from another run of tupe-prepare-squad; prepare the data again")
    first_at = {}
    for number, (feature, (start_logits, _)) in enumerate(zip(features, logits), 1):
        length = feature["context_start"] + len(feature["offsets"]) + 1
        if length != len(start_logits):
            raise FeatureMismatchError(
                f"{features_file}:{number}: question {feature['id']} describes {length} tokens but "
                f"feature {number} of the prepared tokens has {len(start_logits)}: the file does not belong "
                "to these tokens; prepare the data again")
        previous = features[number - 2] if number > 1 else None
        next_window = previous is not None and previous["id"] == feature["id"] \
            and previous["context_start"] == feature["context_start"] \
            and feature["offsets"][:1] > previous["offsets"][:1]
        if feature["id"] in first_at and not next_window:
            raise FeatureMismatchError(
                f"{features_file}:{number}: question id {feature['id']} also names the question at line "
                f"{first_at[feature['id']]}; ids must be unique (tupe-prepare-squad now refuses duplicates)")
        first_at.setdefault(feature["id"], number)


def check_output_is_no_input(args):
    """Stop when --output (which the model's predictions overwrite) is one of the command's inputs: the gold
    file, the checkpoint or a file of --data, compared as real paths (links, ``./`` and ``..`` resolved)."""
    overwritten = overwritten_input(args.output, (("--gold-file", args.gold_file), ("--path", args.path),
                                                  ("--data", args.data)))
    if overwritten:
        sys.exit(f"tupe-evaluate-squad: error: --output {args.output} is {overwritten}, which the "
                 "predictions would overwrite: write them elsewhere (--output predictions.json)")


def check_decoding_flags(parser, args):
    for flag in ("n_best", "max_answer_length"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--path", help="fine-tuned checkpoint (fairseq-train --task squad_span)")
    parser.add_argument("--data", help="folder written by tupe-prepare-squad (with --path)")
    parser.add_argument("--predictions", help="score this predictions JSON ({question id: answer text}) "
                        "instead of running a model, as the official evaluation script does")
    parser.add_argument("--gold-file", required=True, help="the SQuAD JSON the features were prepared from")
    parser.add_argument("--split", default="valid", help="prepared split to evaluate (default valid)")
    parser.add_argument("--max-articles", type=at_least_one, help="as given to tupe-prepare-squad")
    parser.add_argument("--output", default="predictions.json",
                        help="predictions JSON (default predictions.json)")
    parser.add_argument("--n-best", type=int, default=20,
                        help="start and end candidates per window (default 20)")
    parser.add_argument("--max-answer-length", type=int, default=30,
                        help="longest answer in tokens (default 30)")
    parser.add_argument("--version-2-with-negative", action="store_true",
                        help="SQuAD v2.0: no answer when null score - best span score > --null-threshold")
    parser.add_argument("--null-threshold", type=finite_float, default=0.0, help="default 0.0")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cpu", action="store_true", help="run on CPU even when a GPU is available")
    args = parser.parse_args(argv)
    if args.predictions is not None:
        if args.path is not None:
            parser.error("give either --predictions (score a file) or --path and --data (run a model)")
        score_predictions(args)
        return 0
    if args.path is None or args.data is None:
        parser.error("give --path and --data (run a model), or --predictions (score a predictions file)")
    check_decoding_flags(parser, args)
    check_output_is_no_input(args)
    logging.basicConfig(format="%(name)s: %(message)s", level=logging.INFO)
    articles = read_json(args.gold_file, "--gold-file", "SQuAD")["data"][:args.max_articles]
    check_gold_answers(articles, args.gold_file)
    features = load_features(args.data, args.split)
    logits = span_logits(args.path, args.data, args.split, args.batch_size, args.cpu)
    check_features(features, logits, features_path(args.data, args.split))
    answers = predict_answers(articles, features, logits, n_best=args.n_best,
                              max_answer_length=args.max_answer_length,
                              allow_no_answer=args.version_2_with_negative,
                              null_threshold=args.null_threshold)
    predictions = {qid: answer.text for qid, answer in answers.items()}
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(predictions, f, ensure_ascii=False, indent=1)
    version = "2.0" if args.version_2_with_negative else "1.1"
    scores = evaluate(articles, predictions, version)
    no_answer = sum(not text for text in predictions.values())
    total = len(list(questions(articles)))
    print(f"{args.gold_file}: {total} questions, {len(predictions)} predicted ({no_answer} no answer) -> "
          f"{args.output}")
    warn_missing(scores, args.gold_file, total, args.max_articles)
    print(json.dumps({key: round(value, 2) if isinstance(value, float) else value
                      for key, value in official_output(scores).items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
