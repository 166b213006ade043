"""Fine-tune a plugin checkpoint on one GLUE task with fairseq's sentence_prediction task.

    tupe-finetune-glue TASK CKPT DATA_BIN [--seed S] [--glue-dir glue_data] [fairseq-train flags...]

Encodes GLUE_DIR/TASK with the pre-training sentencepiece model and dictionary (tupe-prepare-glue, reused
when already done), then runs fairseq-train with the fine-tuning hyper-parameters of TUPE (Ke et al.,
arXiv 2006.15595) Table 1: batch 32, peak lr 2e-5, 6% linear warm-up then linear decay to 0, Adam eps
1e-6 betas (0.9, 0.999), clip 1.0, dropout 0.1, weight decay 0.01. The task's classes, epochs and metric
(which chooses the best checkpoint) come from the table of GLUE tasks (``python -m tupe_plugin.glue.tasks``).
Flags this tool does not know go last to fairseq-train and override its settings.

SAVE_DIR/train.log is fairseq-train's log and SAVE_DIR/run.json names the task, arch, metric and the
settings the run trained with, for tupe-collect-glue; it is written once training starts. The run starts
from CKPT once: a rerun with the same SAVE_DIR resumes from its checkpoint_last.pt (a finished run stays as
it is), and is refused, before anything is written, when it names another task, other settings or other
data (checked on the data prepared aside: --bin-dir is left as it was). Validate the result with

    fairseq-validate BIN_DIR --user-dir tupe_plugin --path SAVE_DIR/checkpoint_best.pt \\
        --task sentence_prediction --criterion sentence_prediction --batch-size 32
"""

import os
import sys

from ..downstream.finetuning import (add_run_args, check_data_rerun, check_rerun, count_lines, description,
                                     fairseq_train_command, linear_schedule, parse_run_args,
                                     pretrained_architecture, train_recorded)
from ..user_input.cli_types import at_least_one
from ..user_input.path_checks import path_problem
from . import prepare
from .tasks import GLUE_TASKS

WARMUP_PERCENT = 6


def main(argv=None):
    parser = description(__doc__)
    parser.add_argument("task", metavar="TASK", choices=list(GLUE_TASKS),
                        help=f"a GLUE task: {', '.join(GLUE_TASKS)}")
    add_run_args(parser, lr="2e-5", epochs=None, epochs_help="the task's: 10, or 5 for MNLI, QNLI, QQP")
    parser.add_argument("--glue-dir", default="glue_data",
                        help="the GLUE data, TASK/train.tsv and TASK/dev.tsv, as the GLUE benchmark's "
                        "download script download_glue_data.py (linked from gluebenchmark.com) writes it "
                        "(default glue_data)")
    parser.add_argument("--max-examples", type=at_least_one,
                        help="keep only the first N examples of each split")
    args, extra = parse_run_args(parser, argv)
    task = GLUE_TASKS[args.task]
    folder = os.path.join(args.glue_dir, task.folder)
    if problem := path_problem(folder, "folder"):
        parser.error(f"--glue-dir {args.glue_dir}: {folder}: {problem}: give the folder of the GLUE data "
                     "(TASK/train.tsv, TASK/dev.tsv), as the GLUE benchmark's download script "
                     "(download_glue_data.py, linked from gluebenchmark.com) writes it")
    arch, max_positions = pretrained_architecture(args.checkpoint)
    args.max_epoch = args.max_epoch or task.epochs
    args.bin_dir = args.bin_dir or os.path.join("glue-bin", f"{task.name}-bin")
    args.save_dir = args.save_dir or os.path.join("checkpoints", "glue", task.name, arch, f"seed{args.seed}")
    record = {"task": task.name, "checkpoint": os.path.realpath(args.checkpoint), "arch": arch,
              "seed": args.seed, "metric": task.metric, "lr": args.lr, "batch_size": args.batch_size,
              "max_epoch": args.max_epoch, "max_examples": args.max_examples, "fairseq_args": extra}
    check_rerun(parser, args.save_dir, record, "sentence_prediction")

    prepared = prepare.main(["--task", task.name, "--glue-dir", args.glue_dir, "--out", args.bin_dir,
                             "--sentencepiece-model", os.path.join(args.data_bin, "sentencepiece.bpe.model"),
                             "--dict", os.path.join(args.data_bin, "dict.txt"),
                             *(["--max-examples", str(args.max_examples)] if args.max_examples else [])],
                            accept=lambda folder: check_data_rerun(parser, args.save_dir, record,
                                                                   "sentence_prediction", folder,
                                                                   f"--glue-dir {args.glue_dir}"))
    if prepared:
        return prepared
    examples = count_lines(os.path.join(args.bin_dir, "raw", "train.input0"))
    total, warmup = linear_schedule(examples, args.batch_size, args.max_epoch, WARMUP_PERCENT)
    os.makedirs(args.save_dir, exist_ok=True)
    command = fairseq_train_command(args, args.bin_dir, arch, max_positions, total, warmup) + [
        "--task", "sentence_prediction", "--criterion", "sentence_prediction",
        "--init-token", "0", "--separator-token", "2", *task.fairseq_train_args(),
        "--shorten-method", "truncate", "--maximize-best-checkpoint-metric",
        *extra,
    ]
    return train_recorded(command, args.save_dir, record)


if __name__ == "__main__":
    sys.exit(main())
