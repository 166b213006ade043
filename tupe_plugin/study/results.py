"""The numbers of a study, read back from its job folders: fairseq logs, positions.json, unigram.json.

Nothing here recomputes a score: each number is the one a tool printed or wrote, so the report can
be checked against the logs line by line.

- pre-training: the ``valid on 'valid' subset`` lines of fairseq-train (masked-LM loss in bits,
  base 2, at each ``num_updates``); speed: the median ``wps`` (input tokens per second, padding
  excluded) and ``ups`` (updates per second) of its ``train_inner`` lines.
- GLUE: the best validation line of each run by the task's metric, read by
  :mod:`tupe_plugin.cli.fairseq_logs` as ``tupe-collect-glue`` reads it (a run whose every evaluation
  gave ``nan`` is a failed run); the other metrics of the task from that same line.
- extrapolation: the loss :mod:`.extrapolation` wrote (fairseq-validate's, in bits), or why none.
- SQuAD: the score line of ``tupe-evaluate-squad``, with the official scripts' keys (v1.1
  ``{"exact_match": ..., "f1": ...}``, v2.0 ``{"exact": ..., "f1": ..., ...}``).
"""

import json
import os
import re
import statistics

from ..analysis.report import arrays_path
from ..cli.fairseq_logs import evaluations, train_inner_lines, valid_line_fields
from ..glue.tasks import GLUE_TASKS

# tupe-evaluate-squad's count line: "GOLD: 247 questions, 113 predicted (0 no answer) -> predictions.json"
SQUAD_COUNTS = re.compile(r": (\d+) questions, (\d+) predicted \(")


def staged_valid_lines(log_path, offsets):
    """The validation lines of a job log, ``num_updates`` counted over all stages: each stage's
    fairseq-train counts from 0, and ``offsets`` maps a stage's ``--save-dir`` folder name to the updates
    of the stages before it. The job's log names each command on a ``$ `` line before its output."""
    found, offset = [], 0
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("$ ") and "--save-dir" in line:
                save_dir = line.split("--save-dir", 1)[1].split()[0]
                offset = offsets.get(os.path.basename(save_dir.rstrip("/'")), 0)
            fields = valid_line_fields(line)
            if fields is not None and "num_updates" in fields:
                found.append({**fields, "num_updates": fields["num_updates"] + offset})
    return found


def pretrain_result(log_path, seconds, stage_offsets=None):
    """Validation curve, final loss and speed of one pre-training log (of all its stages)."""
    by_update = {}
    for fields in staged_valid_lines(log_path, stage_offsets or {}):
        if "loss" in fields:
            by_update[int(fields["num_updates"])] = fields["loss"]  # a resumed run repeats: keep the last
    curve = [[update, by_update[update]] for update in sorted(by_update)]
    inner = [f for f in train_inner_lines(log_path) if f.get("wps", 0) > 0]
    return {
        "valid_loss": curve[-1][1] if curve else None,
        "valid_loss_curve": curve,
        "seconds": seconds,
        "tokens_per_second": statistics.median(f["wps"] for f in inner) if inner else None,
        "updates_per_second": statistics.median(f["ups"] for f in inner) if inner else None,
    }


def glue_run(log_path, task, seed, checkpoint="best"):
    """The run's score: its best validation line by the task's metric (``checkpoint`` "best"), or its
    last one ("last", as Wang et al. report GLUE): ``{seed, score, metric: value, ...}``.

    A failed run (every evaluation gave nan; with "last", the last one did) has score None and
    ``failed`` saying so.
    """
    metric = GLUE_TASKS[task].metric
    found = evaluations(log_path, metric)
    line = found.best if checkpoint == "best" else found.last
    run = {"seed": seed, "score": None if line is None else line[metric], "evaluations": found.count,
           "nan_evaluations": found.nan_count}
    if line is None:
        last = "" if checkpoint == "best" else ", the last one included"
        return {**run, "failed": found.nan_summary() + last}
    return {**run, **{m: line.get(m) for m in GLUE_TASKS[task].shown}}


def glue_task(runs, task):
    """The median over the seeds' runs and their spread (TUPE, Ke et al., reports the median of its
    fine-tuning runs); failed runs are left out and their seeds listed."""
    metric, shown = GLUE_TASKS[task].metric, GLUE_TASKS[task].shown
    scored = [run for run in runs if run["score"] is not None]
    scores = [run["score"] for run in scored]
    return {
        "metric": metric, "shown": list(shown),
        "median": statistics.median(scores) if scores else None,
        "mean": statistics.fmean(scores) if scores else None,
        "min": min(scores, default=None), "max": max(scores, default=None),
        "medians": {m: statistics.median(run[m] for run in scored) if scored else None for m in shown},
        "runs": sorted(runs, key=lambda run: run["seed"]),
        "failed": sorted(run["seed"] for run in runs if run["score"] is None),
    }


def glue_average(glue, tasks):
    """The GLUE average of ``glue`` (``{task: {"median", ...}}``): the mean over ``tasks`` of each task's
    median, WNLI left out as in the papers; None unless every averaged task has one."""
    averaged = [task for task in tasks if task != "WNLI"]
    medians = [(glue.get(task) or {}).get("median") for task in averaged]
    return sum(medians) / len(medians) if averaged and None not in medians else None


def chosen_lr(by_lr, select):
    """The result of the learning rate whose runs have the best ``select`` ("median", TUPE's choice, or
    "mean") over their seeds, with ``lr`` and every learning rate's summary in ``by_lr``."""
    scored = {lr: result for lr, result in by_lr.items() if result[select] is not None}
    chosen = max(scored, key=lambda lr: scored[lr][select]) if scored else next(iter(by_lr))
    return {**by_lr[chosen], "lr": chosen, "select": select,
            "by_lr": {str(lr): {key: result[key] for key in ("median", "mean", "min", "max", "failed")}
                      for lr, result in by_lr.items()}}


def squad_runs(runs):
    """The SQuAD figure of several fine-tuning runs (seeds): the mean EM and F1 with their sample std
    (Wang et al. Table 3: mean ± std over five runs), each run's numbers in ``runs``."""
    if not runs:
        return None
    std = {key: statistics.stdev(run[key] for run in runs) if len(runs) > 1 else None
           for key in ("exact_match", "f1")}
    return {"exact_match": statistics.fmean(run["exact_match"] for run in runs),
            "f1": statistics.fmean(run["f1"] for run in runs), "std": std,
            **{key: runs[0][key] for key in ("predicted", "questions") if key in runs[0]},
            "runs": sorted(runs, key=lambda run: (run.get("pretrain_seed", 0), run["seed"]))}


def first_squad(squad):
    """The figures of the study's first SQuAD version in an arch's ``squad`` entry ({} when none)."""
    if not squad:
        return {}
    return squad if "f1" in squad else next(iter(squad.values()))


def squad_result(log_path):
    """EM and F1 of the last score line of the log (v1.1's ``exact_match`` or v2.0's ``exact``), and
    how many of the dev questions got a prediction (``questions``, ``predicted``; the others were
    skipped by tupe-prepare-squad and count as wrong)."""
    found, counts = None, {}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(('{"exact_match"', '{"exact"')):
                found = json.loads(line)
            count = SQUAD_COUNTS.search(line)
            if count:
                counts = {"questions": int(count.group(1)), "predicted": int(count.group(2))}
    if found is None:
        raise ValueError(f"{log_path}: no EM/F1 line from tupe-evaluate-squad")
    return {"exact_match": found["exact_match"] if "exact_match" in found else found["exact"],
            "f1": found["f1"], **counts}


def analysis_result(positions_json):
    """Per section: the property-metric rows, the figures with their captions, the kind and options of
    each figure (``plots``) and the file of their numbers (``arrays``, positions.npz), or why it does not
    apply."""
    with open(positions_json, encoding="utf-8") as f:
        report = json.load(f)
    numbers = arrays_path(positions_json)
    sections = {}
    for name, section in report["sections"].items():
        if not section["applies"]:
            sections[name] = {"title": section["title"], "applies": False, "reason": section["reason"]}
        else:
            sections[name] = {"title": section["title"], "applies": True, "rows": section["rows"],
                              "figures": section["figures"], "captions": section.get("captions", []),
                              "plots": section.get("plots", []),
                              "arrays": numbers if os.path.isfile(numbers) else None}
    return sections


def extrapolation_result(path):
    """``{"length", "max_positions", "loss", "reason"}`` written by :mod:`.extrapolation`."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def unigram_result(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
