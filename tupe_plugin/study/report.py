"""The study's report: ``report.json`` (every number), ``report.md`` (the tables) and ``figures/``.

The layout follows the papers' comparisons: the validation masked-LM loss against updates of all
architectures on one plot (TUPE, arXiv 2006.15595, Fig. 4a); GLUE as its Table 2 (one row per
architecture, the median over fine-tuning seeds, their spread, the average); SQuAD EM / F1 as
Table 3 of "On Position Embeddings in BERT"; that paper's position properties (translation
invariance, monotonicity, symmetry) of each architecture's position matrices side by side.

Beside the losses stands the context-free baseline (:mod:`.unigram`): a study whose best model is
less than ``report.min_margin_bits`` below it is flagged "not yet discriminative" — its models have
hardly learned to use the context, so their position encodings cannot differ yet.
"""

import json
import os
import shlex

from . import results
from ..glue.tasks import GLUE_TASKS
from .runner import DONE, FAILED

# The columns of the property table (docs/analysis.md defines them).
PROPERTIES = (
    ("translation_invariance_violation", "TI-viol"),
    ("monotonicity_forward", "mono+"),
    ("monotonicity_backward", "mono-"),
    ("symmetry_violation", "sym-viol"),
    ("offset_asymmetry", "asym"),
)


def collect(config, jobs, outcome):
    """report.json's content, from the finished jobs' folders."""
    done = {job.name: job for job in jobs if outcome.get(job.name, (None,))[0] == DONE}
    report = {"archs": {}, "config": config, "jobs": {}}
    for job in jobs:
        record = _record(job)
        report["jobs"][job.name] = {
            "status": outcome.get(job.name, ("not run", ""))[0], "note": outcome.get(job.name, ("", ""))[1],
            "seconds": record.get("seconds"), "commands": _commands(job),
            "log": os.path.join(job.folder, job.log),
        }
    unigram = done.get("unigram")
    report["unigram"] = (results.unigram_result(os.path.join(unigram.folder, "unigram.json"))
                         if unigram else None)
    for arch in config["archs"]:
        entry = {"valid_loss": None, "valid_loss_curve": [], "glue": {}, "squad": None, "analysis": None,
                 "seconds": None}
        pretrain = done.get(f"pretrain/{arch}")
        if pretrain:
            entry.update(results.pretrain_result(os.path.join(pretrain.folder, pretrain.log),
                                                 _record(pretrain).get("seconds")))
        if config["glue"] is not None:
            for task in config["glue"]["tasks"]:
                runs = []
                for seed in config["glue"]["seeds"]:
                    name = f"glue/{arch}/{task}/seed{seed}"
                    if name in done:
                        runs.append(results.glue_run(os.path.join(done[name].folder, "run", "train.log"),
                                                     task, seed))
                        if "failed" in runs[-1]:
                            report["jobs"][name].update(status=FAILED, note=f"{runs[-1]['failed']}: a failed "
                                                        "run, left out of the median")
                if runs:
                    entry["glue"][task] = results.glue_task(runs, task)
        squad = done.get(f"squad/{arch}")
        if squad:
            entry["squad"] = results.squad_result(os.path.join(squad.folder, squad.log))
        analysis = done.get(f"analysis/{arch}")
        if analysis:
            entry["analysis"] = results.analysis_result(os.path.join(analysis.folder, "analysis",
                                                                     "positions.json"))
        entry["seconds_all_jobs"] = sum(j["seconds"] or 0 for n, j in report["jobs"].items()
                                        if n.split("/")[1:2] == [arch])
        report["archs"][arch] = entry
    report["baseline"] = _baseline(report, config["report"]["min_margin_bits"])
    return report


def _record(job):
    from .state import read_record

    return read_record(job.folder) or {}


def _commands(job):
    """The job's commands as shell lines."""
    return [shlex.join(argv) for argv in job.commands]


def _baseline(report, min_margin):
    """Each arch's margin below the unigram baseline, and whether the study discriminates."""
    if report["unigram"] is None:
        return None
    unigram = report["unigram"]["bits_per_token"]
    margins = {arch: unigram - entry["valid_loss"] for arch, entry in report["archs"].items()
               if entry["valid_loss"] is not None}
    return {"unigram_bits": unigram, "margins": margins, "min_margin_bits": min_margin,
            "discriminative": bool(margins) and max(margins.values()) >= min_margin}


def write_report(config, jobs, outcome, out):
    """Write report.json, the figures and report.md into ``out``; returns their paths."""
    report = collect(config, jobs, outcome)
    figures_dir = os.path.join(out, "figures")
    os.makedirs(figures_dir, exist_ok=True)
    from .figures import analysis_figures, loss_figure

    figures = {"loss": loss_figure(report, os.path.join(figures_dir, "pretrain_valid_loss.png")),
               "analysis": analysis_figures(report, figures_dir)}
    report["figures"] = {k: v for k, v in figures.items() if v}
    paths = {"json": os.path.join(out, "report.json"), "md": os.path.join(out, "report.md"),
             "figures": figures_dir}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(markdown(report, out))
    return paths


def _number(value, digits=3):
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(report, out):
    """report.md: the tables, the figures (relative links) and the commands."""
    config = report["config"]
    lines = ["# Position-encoding study", ""]
    corpus = config["corpus"] or "the demo's embedded corpus (Python standard-library docstrings)"
    pretrain = config["pretrain"]
    lines += [f"Corpus: {corpus}. Pre-training: {pretrain['updates']} updates of {pretrain['batch_size']} "
              f"blocks of up to {pretrain['tokens_per_sample']} tokens, lr {pretrain['lr']}, seed "
              f"{pretrain['seed']}.", ""]
    lines += _pretrain_section(report, out)
    if config["glue"] is not None:
        lines += _glue_section(report)
    if config["squad"] is not None:
        lines += _squad_section(report)
    if config["analysis"]:
        lines += _analysis_section(report, out)
    lines += _jobs_section(report)
    return "\n".join(lines) + "\n"


def _pretrain_section(report, out):
    baseline = report["baseline"]
    lines = ["## Pre-training (masked LM, validation loss in bits)", ""]
    if baseline:
        lines += [f"Context-free baseline (unigram cross-entropy of the validation text under the training "
                  f"text's token frequencies, same dictionary): "
                  f"**{baseline['unigram_bits']:.3f} bits/token**.", ""]
    lines += ["| arch | valid loss | below unigram | updates | wall time (s) | tokens/s | updates/s |",
              "|---|---|---|---|---|---|---|"]
    for arch, entry in report["archs"].items():
        curve = entry["valid_loss_curve"]
        margin = baseline["margins"].get(arch) if baseline else None
        lines.append(f"| {arch} | {_number(entry['valid_loss'])} | {_number(margin)} | "
                     f"{curve[-1][0] if curve else '–'} | {_number(entry['seconds'], 0)} | "
                     f"{_number(entry.get('tokens_per_second'), 0)} | "
                     f"{_number(entry.get('updates_per_second'), 2)} |")
    lines.append("")
    if baseline and baseline["margins"]:
        best = max(baseline["margins"].values())
        if baseline["discriminative"]:
            lines.append(f"The best model is {best:.3f} bits below the unigram baseline (at least "
                         f"{baseline['min_margin_bits']} required): the models use the context.")
        else:
            where = f"only {best:.3f} bits below" if best >= 0 else f"{-best:.3f} bits above"
            lines.append(f"**Not yet discriminative**: the best model is {where} the "
                         f"unigram baseline (less than {baseline['min_margin_bits']} below); "
                         "the models barely use "
                         "the context, so differences between position encodings mean little. Pre-train "
                         "longer or on more text.")
        lines.append("")
    figure = report["figures"].get("loss")
    if figure:
        lines += [f"![validation loss against updates]({os.path.relpath(figure, out)})", ""]
    return lines


def _glue_section(report):
    tasks = report["config"]["glue"]["tasks"]
    seeds = report["config"]["glue"]["seeds"]
    metrics = "; ".join(f"{task} {'/'.join(GLUE_TASKS[task].shown)} (best by {GLUE_TASKS[task].metric})"
                        for task in tasks)
    lines = ["## GLUE (dev)", "",
             f"Median over fine-tuning seeds {seeds} of each run's best evaluation (min–max of the task's "
             f"metric in brackets): {metrics}. Avg.: mean over tasks of the median of each task's metric. "
             "A run whose every evaluation gave nan is a failed run, counted in its cell and left out of "
             "the median.", "",
             "| arch | " + " | ".join(tasks) + " | Avg. |", "|---|" + "---|" * (len(tasks) + 1)]
    for arch, entry in report["archs"].items():
        cells, medians = [], []
        for task in tasks:
            result = entry["glue"].get(task)
            if result is None:
                cells.append("–")
                continue
            cell = "–"
            if result["median"] is not None:
                shown = "/".join(_number(result["medians"][m], 1) for m in result["shown"])
                cell = f"{shown} ({_number(result['min'], 1)}–{_number(result['max'], 1)})"
                medians.append(result["median"])
            if result["failed"]:
                cell += f", {len(result['failed'])} failed"
            cells.append(cell)
        average = _number(sum(medians) / len(medians), 1) if len(medians) == len(tasks) else "–"
        lines.append(f"| {arch} | " + " | ".join(cells) + f" | {average} |")
    return lines + [""]


def _ordinal(n):
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _squad_section(report):
    squad = report["config"]["squad"]
    if squad["train"] is None:
        first = f" (first {squad['max_articles']} articles)" if squad["max_articles"] else ""
        source = (f"fine-tuned on a split of the articles of {squad['dev']}{first}: "
                  f"every {_ordinal(squad['dev_every'])} article is dev, the others train, so these scores "
                  "are not comparable with published SQuAD dev scores")
    else:
        source = f"fine-tuned on {squad['train']}, evaluated on {squad['dev']}"
    lines = [f"## SQuAD v{squad['version']}", "",
             f"EM / F1, {source}. Questions tupe-prepare-squad skipped (too long for the fine-tuning "
             "window) have no prediction and count as wrong: the last column says how many were "
             "predicted.", "",
             "| arch | EM | F1 | predicted / questions |", "|---|---|---|---|"]
    for arch, entry in report["archs"].items():
        result = entry["squad"] or {}
        coverage = (f"{result['predicted']} / {result['questions']}" if "questions" in result else "–")
        lines.append(f"| {arch} | {_number(result.get('exact_match'), 1)} | {_number(result.get('f1'), 1)} "
                     f"| {coverage} |")
    return lines + [""]


def _analysis_section(report, out):
    lines = ["## Position analysis (tupe-analyze)", "",
             "Translation-invariance violation (0 = invariant), monotonicity fractions forward/backward "
             "(1 = monotone), symmetry violation and offset asymmetry of each matrix, as defined in "
             "docs/analysis.md.", "",
             "| matrix | arch | " + " | ".join(title for _, title in PROPERTIES) + " |",
             "|---|---|" + "---|" * len(PROPERTIES)]
    for section in _section_names(report):
        for arch, entry in report["archs"].items():
            result = (entry["analysis"] or {}).get(section)
            if result is None or not result["applies"]:
                continue
            for row in result["rows"]:
                cells = " | ".join(_number(row.get(key)) for key, _ in PROPERTIES)
                lines.append(f"| {section}: {row['label']} | {arch} | {cells} |")
    lines.append("")
    for section, figure in report["figures"].get("analysis", {}).items():
        lines += [f"![{section}, all archs side by side]({os.path.relpath(figure, out)})", ""]
    return lines


def _section_names(report):
    names = []
    for entry in report["archs"].values():
        for name in entry["analysis"] or {}:
            if name not in names:
                names.append(name)
    return names


def _jobs_section(report):
    lines = ["## Jobs and the commands behind every number", "",
             "Each job ran these commands from the repository root (`fairseq-*` from the study's Python "
             "environment on PATH); its output is in the log named.", ""]
    for name, job in report["jobs"].items():
        status = job["status"] + (f" ({job['note']})" if job["status"] != DONE else "")
        lines += [f"- `{name}`: {status}, {_number(job['seconds'], 0)} s, log `{job['log']}`", "",
                  "  ```bash"]
        lines += [f"  {command}" for command in job["commands"]]
        lines += ["  ```", ""]
    return lines
