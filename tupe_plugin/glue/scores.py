"""Collect the best dev scores of GLUE fine-tuning runs into a markdown table (mean ± std over seeds).

Each RUN_DIR is a ``SAVE_DIR`` of ``examples/finetune_glue.sh``: ``run.json`` names the task, arch, seed
and metric, and ``train.log`` is fairseq-train's log (``--log-format simple``). A run's score is the best
value of its metric over the ``valid on 'valid' subset`` lines of the log (every GLUE metric is maximised).
A ``nan`` value is a failed evaluation (e.g. STS-B's correlations of constant predictions): it is left
out of the best value and counted; a run whose every evaluation is ``nan`` is a failed run, left out of
the mean and counted in its cell (``2 failed``). Both are listed on stderr.
Runs of the same task and arch are different seeds; the table has one row per arch and one column per task,
each cell ``mean ± sample std (n seeds)``, like Wang et al. 2021 Table 2::

    tupe-collect-glue checkpoints/glue/*/*/seed*
"""

import argparse
import json
import math
import os
import re
import statistics
import sys
from collections import defaultdict
from typing import NamedTuple, Optional

VALID_LINE = re.compile(r"\| valid on 'valid' subset \| (.*)$")


def valid_scores(log_path, metric):
    """Values of ``metric`` on every validation line of a fairseq log."""
    scores = []
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            match = VALID_LINE.search(line)
            if not match:
                continue
            fields = dict(item.split(" ", 1) for item in match.group(1).split(" | ") if " " in item)
            if metric in fields:
                scores.append(float(fields[metric]))
    return scores


class Run(NamedTuple):
    task: str
    arch: str
    seed: int
    metric: str
    score: Optional[float]  # the best finite value; None when every evaluation gave nan
    evaluations: int
    nan_evaluations: int
    run_dir: str = ""


def read_run(run_dir):
    """The :class:`Run` of one run directory."""
    info_path, log_path = os.path.join(run_dir, "run.json"), os.path.join(run_dir, "train.log")
    for path in (info_path, log_path):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path}: missing (RUN_DIR must be a SAVE_DIR of examples/finetune_glue.sh)"
            )
    with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    missing = {"task", "arch", "seed", "metric"} - info.keys()
    if missing:
        raise ValueError(f"{info_path}: lacks {', '.join(sorted(missing))}")
    scores = valid_scores(log_path, info["metric"])
    if not scores:
        raise ValueError(f"{log_path}: no validation line reports {info['metric']}")
    finite = [score for score in scores if not math.isnan(score)]
    return Run(info["task"], info["arch"], info["seed"], info["metric"], max(finite) if finite else None,
               len(scores), len(scores) - len(finite), run_dir)


def markdown_table(runs):
    """Markdown table of ``runs`` (:class:`Run`); failed runs are counted in their cell, not averaged."""
    cells, failed, metrics = defaultdict(list), defaultdict(int), {}
    for run in runs:
        if run.score is None:
            failed[run.arch, run.task] += 1
        else:
            cells[run.arch, run.task].append(run.score)
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
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="SAVE_DIR of a finetune_glue.sh run")
    args = parser.parse_args(argv)
    try:
        runs = [read_run(d) for d in args.run_dirs]
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"collect_glue_scores.py: error: {e}")
    for run in runs:
        if run.nan_evaluations:
            what = ("every evaluation gave nan: failed run, left out of the mean" if run.score is None else
                    "left out of the best value")
            print(f"collect_glue_scores.py: {run.run_dir}: {run.nan_evaluations} of {run.evaluations} "
                  f"evaluations of {run.metric} gave nan ({what})", file=sys.stderr)
    print(markdown_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
