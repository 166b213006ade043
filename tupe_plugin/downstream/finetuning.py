"""What GLUE and SQuAD fine-tuning share: the pre-trained checkpoint's architecture, TUPE's optimiser
settings (Ke et al., "Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595,
Table 1: Adam eps 1e-6, betas (0.9, 0.999), clip 1.0, dropout 0.1, weight decay 0.01, linear decay to 0),
the linear schedule, and the fairseq-train run.

A run starts from the pre-trained checkpoint with fairseq's ``--finetune-from-model``: the weights are
loaded (optimizer, schedule, meters and data order fresh) only when ``SAVE_DIR`` has no
``checkpoint_last.pt``. A rerun resumes from ``checkpoint_last.pt``: a finished run is left as it is (its
best checkpoint and best score kept), an interrupted one goes on. The log is appended to, never truncated.
``SAVE_DIR/run.json`` records the run (:mod:`.run_record`): a rerun of another task or with other settings is
refused before anything is written, one on other data once the data are prepared aside, before they replace
``--bin-dir`` (:func:`check_data_rerun`).
"""

import argparse
import os
import subprocess
import sys

from ..cli.child_processes import ended_with_parent
from ..cli.fairseq_tools import PLUGIN_DIR, fairseq_tool
from ..user_input.cli_types import learning_rate
from ..user_input.path_checks import path_problem
from .run_record import holds_run, recorded_data, rerun_conflict, write_record

# fairseq-train's log line as it starts the first batch of an epoch, once every check has passed
TRAINING_STARTS = "Start iterating over samples"


def pretrained_architecture(checkpoint):
    """``(arch, max_positions)`` of a plugin checkpoint: fine-tuning keeps the pre-training model."""
    from ..checkpoints.checkpoint_config import saved_model_config

    model = saved_model_config(checkpoint)
    return model.arch, model.max_positions


def linear_schedule(examples, batch_size, epochs, warmup_percent):
    """``(total updates, warm-up updates)``: ceil(examples / batch) updates per epoch."""
    total = -(-examples // batch_size) * epochs
    return total, total * warmup_percent // 100


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def add_run_args(parser, lr, epochs, epochs_help):
    """The positional CKPT and DATA_BIN and the settings every fine-tuning run takes."""
    parser.add_argument("checkpoint", metavar="CKPT",
                        help="pre-trained plugin checkpoint (its --arch and --max-positions are kept)")
    parser.add_argument("data_bin", metavar="DATA_BIN",
                        help="the pre-training data-bin: its sentencepiece.bpe.model and dict.txt encode "
                        "the task")
    parser.add_argument("--lr", type=learning_rate, default=lr, help=f"peak learning rate (default {lr})")
    parser.add_argument("--seed", type=int, default=1, help="default 1")
    parser.add_argument("--max-epoch", type=int, default=epochs,
                        help=f"epochs (default {epochs_help})")
    parser.add_argument("--batch-size", type=int, default=32, help="default 32")
    parser.add_argument("--bin-dir", help="where the encoded task is written")
    parser.add_argument("--save-dir", help="where fairseq-train writes checkpoints and train.log")
    parser.add_argument("--cpu", action="store_true", help="train on CPU")


def parse_run_args(parser, argv):
    """The tool's arguments, and the rest for fairseq-train (after an optional ``--``)."""
    args, extra = parser.parse_known_args(argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    for name in ("seed", "max_epoch", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "seed" else 1):
            parser.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'seed' else 1}, "
                         f"got {value}")
    for path, what in ((args.checkpoint, "CKPT"),
                       (os.path.join(args.data_bin, "sentencepiece.bpe.model"), "DATA_BIN"),
                       (os.path.join(args.data_bin, "dict.txt"), "DATA_BIN")):
        if problem := path_problem(path):
            parser.error(f"{what} {path}: {problem}")
    return args, extra


def fairseq_train_command(args, data, arch, max_positions, total_updates, warmup_updates):
    """fairseq-train from ``args.checkpoint`` with TUPE's fine-tuning settings; the task's flags follow."""
    return [
        fairseq_tool("train"), data, "--user-dir", PLUGIN_DIR, "--arch", arch,
        "--finetune-from-model", os.path.abspath(args.checkpoint), "--max-positions", str(max_positions),
        "--batch-size", str(args.batch_size), "--max-epoch", str(args.max_epoch), "--seed", str(args.seed),
        "--optimizer", "adam", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-6", "--clip-norm", "1.0",
        "--weight-decay", "0.01", "--lr", str(args.lr), "--lr-scheduler", "polynomial_decay", "--power", "1",
        "--end-learning-rate", "0", "--warmup-updates", str(warmup_updates),
        "--total-num-update", str(total_updates), "--dropout", "0.1", "--attention-dropout", "0.1",
        "--save-dir", args.save_dir, "--no-epoch-checkpoints", "--find-unused-parameters",
        "--log-format", "simple", "--log-interval", "10", *(["--cpu"] if args.cpu else []),
    ]


def check_rerun(parser, save_dir, record, fairseq_task):
    """Stop ``parser``'s command when ``save_dir`` holds a run that ``record``'s may not resume."""
    conflict = rerun_conflict(save_dir, record, fairseq_task)
    if conflict:
        parser.error(conflict)


def check_data_rerun(parser, save_dir, record, fairseq_task, folder, source):
    """Record the encoded task data in ``folder`` (chosen by the flags ``source``) in ``record``; stop
    ``parser``'s command when ``save_dir`` holds a run trained on other data. The preparation calls it on
    its complete folder before that is put in ``--bin-dir``, which a refusal leaves as it was."""
    record["data"] = recorded_data(folder, source)
    check_rerun(parser, save_dir, record, fairseq_task)


def train_recorded(command, save_dir, record):
    """fairseq-train ``command`` logged to ``SAVE_DIR/train.log``; its exit status. A new run's ``record``
    is written once fairseq-train starts training; a resumed run keeps its own (:func:`check_rerun`)."""
    new = not holds_run(save_dir)
    return run_logged(command, os.path.join(save_dir, "train.log"),
                      on_training=(lambda: write_record(save_dir, record)) if new else None)


def run_logged(command, log_path, on_training=None):
    """Run ``command``, its output shown and appended to ``log_path``; its exit status. ``on_training`` is
    called at fairseq-train's first :data:`TRAINING_STARTS` line. It ends when this process is killed."""
    with open(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", preexec_fn=ended_with_parent())
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
            log.flush()
            if on_training is not None and TRAINING_STARTS in line:
                on_training()
                on_training = None
        return proc.wait()


def description(doc):
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   allow_abbrev=False)
