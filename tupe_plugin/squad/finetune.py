"""Fine-tune a plugin checkpoint on SQuAD span prediction (v1.1 or v2.0) and print the official EM and F1.

    tupe-finetune-squad VERSION CKPT DATA_BIN [--squad-dir squad] [--seed S] [fairseq-train flags...]

1. tupe-prepare-squad: the train and dev files into BIN_DIR (windows of --max-seq-length tokens,
   --doc-stride apart; questions over --max-query-length pieces are skipped and counted).
2. fairseq-train --task squad_span --criterion squad_span with Wang et al.'s SQuAD setting ("On Position
   Embeddings in BERT", ICLR 2021, App. A.3, Table 4: length 384, 3 epochs, lr 3e-5, batch 32, weight
   decay 0.01; best checkpoint every 1000 updates) and the huggingface recipe it follows for the rest
   (linear decay to 0 without warm-up, Adam eps 1e-6 betas (0.9, 0.999), dropout 0.1, doc stride 128,
   questions up to 64 pieces; at most a third and a half of a shorter --max-seq-length).
3. tupe-evaluate-squad on SAVE_DIR/checkpoint_best.pt: SAVE_DIR/predictions.json, EM and F1 in
   SAVE_DIR/eval.log.
Flags this tool does not know go last to fairseq-train and override its settings. SAVE_DIR/run.json names
the SQuAD version, arch and the settings the run trained with; it is written once training starts. The run
starts from CKPT once: a rerun with the same SAVE_DIR resumes from its checkpoint_last.pt (a finished run
stays as it is), and is refused, before anything is written, when it names another task (a GLUE task,
another SQuAD version), other settings or other data (checked on the data prepared aside: --bin-dir is left
as it was). Validate the result with

    fairseq-validate BIN_DIR --user-dir tupe_plugin --path SAVE_DIR/checkpoint_best.pt \\
        --task squad_span --criterion squad_span --batch-size 32
"""

import json
import os
import sys

from ..downstream.finetuning import (add_run_args, check_data_rerun, check_rerun, count_lines, description,
                                     fairseq_train_command, linear_schedule, parse_run_args,
                                     pretrained_architecture, run_logged, summary, train_recorded)
from ..user_input.cli_types import at_least_one, finite_float
from ..user_input.path_checks import path_problem
from . import prepare

SQUAD_WEBSITE = "rajpurkar.github.io/SQuAD-explorer"
# the checkpoint the official evaluation scores, and where it is logged, its EM/F1 line last
EVALUATED_CHECKPOINT = "checkpoint_best.pt"
EVALUATION_LOG = "eval.log"


def main(argv=None):
    parser = description(__doc__)
    parser.add_argument("version", metavar="VERSION", choices=("1.1", "2.0"),
                        help="1.1, or 2.0 (with unanswerable questions)")
    add_run_args(parser, lr="3e-5", epochs=3, epochs_help="3")
    parser.add_argument("--squad-dir", default="squad",
                        help=f"the official SQuAD files ({SQUAD_WEBSITE}), train-vVERSION.json and "
                        "dev-vVERSION.json (default squad)")
    parser.add_argument("--train-file", help="default SQUAD_DIR/train-vVERSION.json")
    parser.add_argument("--valid-file", help="default SQUAD_DIR/dev-vVERSION.json")
    parser.add_argument("--warmup-percent", type=int, default=0, help="warm-up, in percent of all updates "
                        "(default 0)")
    parser.add_argument("--max-seq-length", type=int,
                        help="tokens per window (default 384, at most the checkpoint's max_positions)")
    parser.add_argument("--doc-stride", type=int, help="default 128, at most --max-seq-length / 3")
    parser.add_argument("--max-query-length", type=int, help="default 64, at most --max-seq-length / 2")
    parser.add_argument("--max-answer-length", type=int, default=30, help="default 30")
    parser.add_argument("--null-threshold", type=finite_float, default=0.0, help="v2.0 only (default 0.0)")
    parser.add_argument("--max-articles", type=at_least_one,
                        help="keep only the first N articles of each file")
    args, extra = parse_run_args(parser, argv)
    files = {"train": args.train_file or os.path.join(args.squad_dir, f"train-v{args.version}.json"),
             "valid": args.valid_file or os.path.join(args.squad_dir, f"dev-v{args.version}.json")}
    for split, path in files.items():
        if problem := path_problem(path):
            parser.error(f"{path}: {problem}: give --squad-dir, the folder of the official SQuAD files "
                         f"(train-v{args.version}.json, dev-v{args.version}.json; {SQUAD_WEBSITE}), or "
                         f"--{split}-file")
    arch, max_positions = pretrained_architecture(args.checkpoint)
    args.max_seq_length = args.max_seq_length or min(max_positions, 384)
    args.bin_dir = args.bin_dir or os.path.join("squad-bin", f"v{args.version}")
    args.save_dir = args.save_dir or os.path.join("checkpoints", "squad", f"v{args.version}", arch,
                                                  f"seed{args.seed}")
    articles = ["--max-articles", str(args.max_articles)] if args.max_articles else []
    doc_stride, max_query_length = prepare.window_defaults(args.max_seq_length, args.doc_stride,
                                                           args.max_query_length)
    record = {"task": f"SQuAD v{args.version}", "checkpoint": os.path.realpath(args.checkpoint),
              "arch": arch, "seed": args.seed, "lr": args.lr, "batch_size": args.batch_size,
              "max_epoch": args.max_epoch, "warmup_percent": args.warmup_percent,
              "max_seq_length": args.max_seq_length, "doc_stride": doc_stride,
              "max_query_length": max_query_length, "max_articles": args.max_articles, "fairseq_args": extra}
    check_rerun(parser, args.save_dir, record, "squad_span")

    prepared = prepare.main([
        "--train-file", files["train"], "--valid-file", files["valid"], "--out", args.bin_dir,
        "--sentencepiece-model", os.path.join(args.data_bin, "sentencepiece.bpe.model"),
        "--dict", os.path.join(args.data_bin, "dict.txt"), "--max-seq-length", str(args.max_seq_length),
        *(["--doc-stride", str(args.doc_stride)] if args.doc_stride else []),
        *(["--max-query-length", str(args.max_query_length)] if args.max_query_length else []), *articles,
    ], accept=lambda folder: check_data_rerun(parser, args.save_dir, record, "squad_span", folder,
                                              f"--train-file {files['train']} --valid-file {files['valid']}"))
    if prepared:
        return prepared
    features = count_lines(os.path.join(args.bin_dir, "train.features.jsonl"))
    total, warmup = linear_schedule(features, args.batch_size, args.max_epoch, args.warmup_percent)
    os.makedirs(args.save_dir, exist_ok=True)
    command = fairseq_train_command(args, args.bin_dir, arch, max_positions, total, warmup) + [
        "--task", "squad_span", "--criterion", "squad_span", "--validate-interval-updates", "1000",
        "--save-interval-updates", "1000", "--keep-interval-updates", "1", *extra,
    ]
    trained = train_recorded(command, args.save_dir, record)
    if trained:
        return trained
    negative = (["--version-2-with-negative", "--null-threshold", str(args.null_threshold)]
                if args.version == "2.0" else [])
    evaluate = [sys.executable, "-m", "tupe_plugin.squad.evaluate",
                "--path", os.path.join(args.save_dir, EVALUATED_CHECKPOINT), "--data", args.bin_dir,
                "--gold-file", files["valid"], "--output", os.path.join(args.save_dir, "predictions.json"),
                "--max-answer-length", str(args.max_answer_length), *negative, *articles,
                *(["--cpu"] if args.cpu else [])]
    evaluated = run_logged(evaluate, os.path.join(args.save_dir, EVALUATION_LOG))
    if evaluated == 0:
        print(finished_run(args.version, args.save_dir))
    return evaluated


def official_scores(save_dir):
    """(EM, F1) of the last line of them that tupe-evaluate-squad wrote in SAVE_DIR/eval.log (SQuAD's
    official evaluation of SAVE_DIR/checkpoint_best.pt), or None."""
    log, scores = os.path.join(save_dir, EVALUATION_LOG), None
    if not os.path.isfile(log):
        return None
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(('{"exact_match"', '{"exact"')):
                scores = json.loads(line)
    if scores is None:
        return None
    return float(scores.get("exact_match", scores.get("exact"))), float(scores["f1"])


def finished_run(version, save_dir):
    """What ends a run that trained and was evaluated: its official dev scores (:func:`official_scores`),
    the checkpoint they are of, the folder."""
    log, scores = os.path.join(save_dir, EVALUATION_LOG), official_scores(save_dir)
    if scores is None:
        score = f"none: {log} holds no EM/F1 line of tupe-evaluate-squad"
    else:
        score = f"EM {scores[0]:.2f}, F1 {scores[1]:.2f} (official evaluation; predictions.json)"
    return summary(f"tupe-finetune-squad: SQuAD v{version} done", [
        ("dev", score),
        ("checkpoint", f"{os.path.join(save_dir, EVALUATED_CHECKPOINT)} (the best dev loss; "
                       "checkpoint_last.pt beside it)"),
        ("output folder", f"{save_dir} (train.log, fairseq-train's log; eval.log, the evaluation; "
                          "run.json, the run's settings)")])


if __name__ == "__main__":
    sys.exit(main())
