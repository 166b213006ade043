"""Collect the best dev scores of GLUE fine-tuning runs into a markdown table (mean ± std over seeds).

Each RUN_DIR is a ``--save-dir`` of ``tupe-finetune-glue``: ``run.json`` names the task, arch, seed
and metric, and ``train.log`` is fairseq-train's log (``--log-format simple``). A run's score is the best
value of its metric over the ``valid on 'valid' subset`` lines of the log (every GLUE metric is maximised),
read by :mod:`tupe_plugin.cli.fairseq_logs`: a ``nan`` value is a failed evaluation (e.g. STS-B's correlations
of constant predictions), left out of the best value and counted; a run whose every evaluation is ``nan``
is a failed run, left out of the mean and counted in its cell (``2 failed``). Both are listed on stderr.
Runs of the same task, arch and learning rate are different seeds; the table has one row per arch (per arch
and learning rate when an arch was run with several) and one column per task, each cell ``mean ± sample
std (n seeds)``, like Wang et al. 2021 Table 2::

    tupe-collect-glue checkpoints/glue/*/*/seed*
"""

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from typing import NamedTuple

from tupe_plugin.cli.fairseq_logs import Evaluations, evaluations
from tupe_plugin.glue.tasks import GLUE_TASKS
from tupe_plugin.user_input.path_checks import path_problem


class Run(NamedTuple):
    """One fine-tuning run: its task, arch, seed, learning rate and the evaluations of its metric."""

    task: str
    arch: str
    seed: int
    evaluations: Evaluations  # of the run's metric; its score is None for a failed run
    run_dir: str = ""
    lr: str = None

    @property
    def metric(self):
        return self.evaluations.metric

    @property
    def score(self):
        return self.evaluations.score


def read_run(run_dir):
    """The :class:`Run` of one run directory."""
    info_path, log_path = os.path.join(run_dir, "run.json"), os.path.join(run_dir, "train.log")
    for path in (info_path, log_path):
        if problem := path_problem(path):
            raise FileNotFoundError(
                f"{path}: {problem} (RUN_DIR must be a --save-dir of tupe-finetune-glue)"
            )
    with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    if "task" in info and info["task"] not in GLUE_TASKS:
        raise ValueError(f"{info_path}: a run of {info['task']}, not of a GLUE task (RUN_DIR must be a "
                         "--save-dir of tupe-finetune-glue)")
    missing = {"task", "arch", "seed", "metric"} - info.keys()
    if missing:
        raise ValueError(f"{info_path}: lacks {', '.join(sorted(missing))}")
    return Run(info["task"], info["arch"], info["seed"], evaluations(log_path, info["metric"]), run_dir,
               info.get("lr"))


def row_names(runs):
    """The row of each run: its arch, or ``ARCH (lr LR)`` when the arch's runs have several learning
    rates (runs of different learning rates are not seeds of one another)."""
    lrs = defaultdict(set)
    for run in runs:
        lrs[run.arch].add(run.lr)
    return [run.arch if len(lrs[run.arch]) == 1 else f"{run.arch} (lr {run.lr})" for run in runs]


def markdown_table(runs):
    """Markdown table of ``runs`` (:class:`Run`); failed runs are counted in their cell, not averaged."""
    cells, failed, metrics = defaultdict(list), defaultdict(int), {}
    for row, run in zip(row_names(runs), runs):
        if run.evaluations.failed:
            failed[row, run.task] += 1
        else:
            cells[row, run.task].append(run.score)
        metrics[run.task] = run.metric
    tasks = sorted(metrics)
    archs = sorted({arch for arch, _ in [*cells, *failed]})
    lines = ["| arch | " + " | ".join(f"{t} ({metrics[t]})" for t in tasks) + " |",
             "|---|" + "---|" * len(tasks)]
    for arch in archs:
        row = []
        for task in tasks:
            scores = cells.get((arch, task), [])
            if not scores:
                cell = "–"
            elif len(scores) == 1:
                cell = f"{scores[0]:.1f} (1)"
            else:
                cell = f"{statistics.mean(scores):.1f} ± {statistics.stdev(scores):.1f} ({len(scores)})"
            if failed[arch, task]:
                cell += f", {failed[arch, task]} failed"
            row.append(cell)
        lines.append(f"| {arch} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="--save-dir of a tupe-finetune-glue run")
    args = parser.parse_args(argv)
    try:
        runs = [read_run(d) for d in args.run_dirs]
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"tupe-collect-glue: error: {e}")
    for run in runs:
        if run.evaluations.nan_count:
            what = ("every evaluation gave nan: failed run, left out of the mean" if run.evaluations.failed
                    else "left out of the best value")
            print(f"tupe-collect-glue: {run.run_dir}: {run.evaluations.nan_summary()} ({what})",
                  file=sys.stderr)
    print(markdown_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
