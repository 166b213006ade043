"""The numbers of a study, read back from its job folders: fairseq logs, positions.json, unigram.json.

Nothing here recomputes a score: each number is the one a tool printed or wrote, so the report can
be checked against the logs line by line.

- pre-training: the ``valid on 'valid' subset`` lines of fairseq-train (masked-LM loss in bits,
  base 2, at each ``num_updates``); speed: the median ``wps`` (input tokens per second, padding
  excluded) and ``ups`` (updates per second) of its ``train_inner`` lines.
- GLUE: the best validation line of each run by the task's metric, as
  ``tupe-collect-glue`` picks it; the other metrics of the task from that same line.
- SQuAD: the score line of ``tupe-evaluate-squad``, with the official scripts' keys (v1.1
  ``{"exact_match": ..., "f1": ...}``, v2.0 ``{"exact": ..., "f1": ..., ...}``).
"""

import json
import re
import statistics

VALID_LINE = re.compile(r"\| valid on 'valid' subset \| (.*)$")
TRAIN_INNER = re.compile(r"\| train_inner \| .*?: +\d+ / \d+ (.*)$")
# evaluate_squad.py's count line: "GOLD: 247 questions, 113 predicted (0 no answer) -> predictions.json"
SQUAD_COUNTS = re.compile(r": (\d+) questions, (\d+) predicted \(")

# Task -> (the metric that picks the best checkpoint, the metrics shown), as examples/finetune_glue.sh
# reports them (seed 001 Table 2: CoLA Matthews corr., MRPC F1 and accuracy, STS-B Pearson and
# Spearman, accuracy elsewhere).
GLUE_METRICS = {
    "CoLA": ("mcc", ["mcc"]),
    "MRPC": ("f1", ["f1", "accuracy"]),
    "STS-B": ("pearson_and_spearman", ["pearson", "spearman"]),
}
DEFAULT_GLUE_METRICS = ("accuracy", ["accuracy"])


def glue_metrics(task):
    return GLUE_METRICS.get(task, DEFAULT_GLUE_METRICS)


def _fields(text, separator, joiner):
    fields = {}
    for item in text.split(separator):
        key, _, value = item.strip().partition(joiner)
        try:
            fields[key.strip()] = float(value)
        except ValueError:
            continue
    return fields


def valid_lines(log_path):
    """The fields (name -> float) of every validation line of a fairseq log, in order."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [_fields(m.group(1), " | ", " ") for m in map(VALID_LINE.search, f) if m]


def train_inner_lines(log_path):
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return [_fields(m.group(1), ", ", "=") for m in map(TRAIN_INNER.search, f) if m]


def pretrain_result(log_path, seconds):
    """Validation curve, final loss and speed of one pre-training log."""
    by_update = {}
    for fields in valid_lines(log_path):
        if "loss" in fields and "num_updates" in fields:
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


def glue_run(log_path, task, seed):
    """The run's best validation line by the task's metric: {seed, score, metric: value, ...}."""
    primary, shown = glue_metrics(task)
    lines = [f for f in valid_lines(log_path) if primary in f]
    if not lines:
        raise ValueError(f"{log_path}: no validation line reports {primary}")
    best = max(lines, key=lambda f: f[primary])  # first of equal bests, as fairseq keeps it
    return {"seed": seed, "score": best[primary], **{m: best.get(m) for m in shown}}


def glue_task(runs, task):
    """Median over seeds (seed 001 reports the median of its fine-tuning runs) and the spread."""
    primary, shown = glue_metrics(task)
    scores = [run["score"] for run in runs]
    return {
        "metric": primary, "shown": shown, "median": statistics.median(scores),
        "min": min(scores), "max": max(scores),
        "medians": {m: statistics.median(run[m] for run in runs) for m in shown},
        "runs": sorted(runs, key=lambda run: run["seed"]),
    }


def squad_result(log_path):
    """EM and F1 of the last score line of the log (v1.1's ``exact_match`` or v2.0's ``exact``), and
    how many of the dev questions got a prediction (``questions``, ``predicted``; the others were
    skipped by prepare_squad.py and count as wrong)."""
    found, counts = None, {}
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(('{"exact_match"', '{"exact"')):
                found = json.loads(line)
            count = SQUAD_COUNTS.search(line)
            if count:
                counts = {"questions": int(count.group(1)), "predicted": int(count.group(2))}
    if found is None:
        raise ValueError(f"{log_path}: no EM/F1 line from evaluate_squad.py")
    return {"exact_match": found["exact_match"] if "exact_match" in found else found["exact"],
            "f1": found["f1"], **counts}


def analysis_result(positions_json):
    """Per section: the property-metric rows and figures, or why it does not apply."""
    with open(positions_json, encoding="utf-8") as f:
        report = json.load(f)
    sections = {}
    for name, section in report["sections"].items():
        if not section["applies"]:
            sections[name] = {"title": section["title"], "applies": False, "reason": section["reason"]}
        else:
            sections[name] = {"title": section["title"], "applies": True, "rows": section["rows"],
                              "figures": section["figures"]}
    return sections


def unigram_result(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
