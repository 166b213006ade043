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

from . import convergence, results, statistics
from ..analysis.report import format_columns
from .results import first_squad
from .statistics import mean
from .jobs import Model, along_models, extrapolation_name, glue_run_name, squad_run_name, stage_offsets
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
    pretrain = config["pretrain"]
    for arch in config["archs"]:
        models = {seed: _model_entry(config, Model(arch, seed), done, report["jobs"])
                  for seed in pretrain["seeds"]}
        entry = _over_seeds(config, models)
        along = {}
        for seed in pretrain["seeds"]:
            for model in along_models(pretrain, Model(arch, seed)):
                along.setdefault(model.at, {})[seed] = _model_entry(config, model, done, report["jobs"],
                                                                    models[seed]["valid_loss_curve"])
        along = {at: _over_seeds(config, by_seed) for at, by_seed in along.items()}
        along[pretrain["updates"]] = entry
        entry["along_pretraining"] = {
            str(at): {key: result[key] for key in ("valid_loss", "glue", "squad")}
            for at, result in sorted(along.items())} if pretrain["evaluate_at"] else {}
        entry["seconds_all_jobs"] = sum(j["seconds"] or 0 for n, j in report["jobs"].items()
                                        if n.split("/")[1:2] == [arch])
        report["archs"][arch] = entry
    reference = report["archs"][config["report"]["reference"]]
    for arch, entry in report["archs"].items():
        entry["versus_reference"] = None if arch == config["report"]["reference"] else \
            statistics.paired_difference(_valid_losses(entry), _valid_losses(reference))
    report["baseline"] = _baseline(report, config["report"]["min_margin_bits"])
    _convergence(report, config)
    return report


def _convergence(report, config):
    """Each arch's ``convergence`` to the reference's final loss, each run's ``left_plateau_at`` and
    ``on_plateau`` (with a unigram baseline), and with GLUE along pre-training each arch's
    ``glue_convergence`` to the reference's final GLUE average (:mod:`.convergence`)."""
    pretrain, tasks = config["pretrain"], (config["glue"] or {}).get("tasks", [])
    reference = report["archs"][config["report"]["reference"]]
    finals = [model["valid_loss"] for model in reference["seeds"].values() if model["valid_loss"] is not None]
    target = sum(finals) / len(finals) if finals else None
    glue_target = results.glue_average(reference["glue"], tasks)
    for entry in report["archs"].values():
        entry["convergence"] = None if target is None else convergence.convergence(
            {seed: model["valid_loss_curve"] for seed, model in entry["seeds"].items()}, target,
            pretrain["updates"])
        for model in entry["seeds"].values():
            model.update(convergence.plateau(model["valid_loss_curve"], report["unigram"]["bits_per_token"],
                                             config["report"]["plateau_bits"])
                         if report["unigram"] else {"left_plateau_at": None, "on_plateau": None})
        if pretrain["evaluate_at"] and glue_target is not None:
            averages = {int(at): results.glue_average(along["glue"], tasks)
                        for at, along in entry["along_pretraining"].items()}
            reached = convergence.first_checkpoint_reaching(averages, glue_target)
            entry["glue_convergence"] = {
                "target": glue_target, "averages": {str(at): avg for at, avg in sorted(averages.items())},
                "checkpoint": reached, "fraction": None if reached is None else reached / pretrain["updates"]}


def _model_entry(config, model, done, jobs, curve=None):
    """The numbers of one pre-trained :class:`Model` and the jobs built on it; a checkpoint along
    pre-training (``model.at``) takes its validation loss from the final model's ``curve``."""
    entry = {"valid_loss": None, "valid_loss_curve": [], "glue": {}, "squad": None, "analysis": None,
             "seconds": None, "extrapolation": {}}
    seed, model_key = model.seed, model.key
    pretrain = done.get(model.pretrain_job)
    if pretrain and model.at is None:
        entry.update(results.pretrain_result(os.path.join(pretrain.folder, pretrain.log),
                                             _record(pretrain).get("seconds"),
                                             stage_offsets(config["pretrain"])))
    elif model.at is not None:
        entry["valid_loss"] = next((loss for update, loss in curve or [] if update == model.at), None)
    glue = config["glue"]
    for task in glue["tasks"] if glue is not None else []:
        by_lr = {}
        for lr in glue["lrs"]:
            runs = []
            for run_seed in glue["seeds"]:
                name = glue_run_name(model, task, lr, run_seed)
                if name in done:
                    runs.append({**results.glue_run(os.path.join(done[name].folder, "run", "train.log"),
                                                    task, run_seed, glue["checkpoint"]),
                                 "pretrain_seed": seed, "lr": lr})
                    if "failed" in runs[-1]:
                        jobs[name].update(status=FAILED, note=f"{runs[-1]['failed']}: a failed run, left "
                                          "out of the median")
            if runs:
                by_lr[lr] = results.glue_task(runs, task)
        if by_lr:
            entry["glue"][task] = results.chosen_lr(by_lr, glue["select"])
    if config["squad"] is not None:
        entry["squad"] = {}
        for version in config["squad"]["versions"]:
            runs = [{**results.squad_result(os.path.join(done[name].folder, done[name].log)),
                     "seed": run_seed, "pretrain_seed": seed}
                    for run_seed in config["squad"]["seeds"]
                    for name in [squad_run_name(model, version, run_seed)] if name in done]
            if runs:
                entry["squad"][version] = results.squad_runs(runs)
    analysis = done.get(f"analysis/{model_key}")
    if analysis:
        entry["analysis"] = results.analysis_result(os.path.join(analysis.folder, "analysis",
                                                                 "positions.json"))
    entry["extrapolation_scaled"] = {}
    extrapolation = config["extrapolation"] or {"lengths": [], "rotary_scalings": []}
    for scaling in [None, *extrapolation["rotary_scalings"]]:
        found = entry["extrapolation"] if scaling is None else \
            entry["extrapolation_scaled"].setdefault(scaling_label(scaling), {})
        for length in extrapolation["lengths"]:
            job = done.get(extrapolation_name(model, length, scaling))
            if job:
                found[str(length)] = results.extrapolation_result(
                    os.path.join(job.folder, "extrapolation.json"))
    return entry


def scaling_label(scaling):
    """``linear x4``: a RoPE scaling's name in the report."""
    return f"{scaling['scaling']} x{scaling['factor']:g}"


def _squad_entry(config, models):
    """An arch's SQuAD figures over its models' runs: the one version's (EM, F1, ...) when the study has
    one, else ``{version: figures}``; None without SQuAD or any finished run."""
    if config["squad"] is None:
        return None
    by_version = {}
    for version in config["squad"]["versions"]:
        runs = [run for m in models.values()
                for run in ((m["squad"] or {}).get(version) or {}).get("runs", [])]
        if runs:
            by_version[version] = results.squad_runs(runs)
    if len(config["squad"]["versions"]) == 1:
        return next(iter(by_version.values()), None)
    return by_version or None


def _valid_losses(entry):
    return {int(seed): model["valid_loss"] for seed, model in entry["seeds"].items()}


def _over_seeds(config, models):
    """An arch's entry from its models, one per pre-training seed: with one seed that model's numbers;
    with several, each figure's spread over the seeds (:func:`statistics.spread`) and the curve of the
    mean. ``seeds`` keeps every model's own numbers."""
    first = next(iter(models.values()))
    entry = {key: first[key] for key in ("valid_loss", "valid_loss_curve", "seconds", "analysis")}
    entry["squad"] = _squad_entry(config, models)
    entry.update(tokens_per_second=first.get("tokens_per_second"),
                 updates_per_second=first.get("updates_per_second"),
                 seeds={str(seed): model for seed, model in models.items()})
    entry["glue"] = {}
    for task in (config["glue"] or {}).get("tasks", []):
        chosen = {seed: m["glue"][task] for seed, m in models.items() if task in m["glue"]}
        if chosen:
            runs = [run for result in chosen.values() for run in result["runs"]]
            entry["glue"][task] = {**results.glue_task(runs, task),
                                   "lr": {str(seed): result["lr"] for seed, result in chosen.items()}}
    extrapolation = config["extrapolation"] or {"lengths": [], "rotary_scalings": []}
    entry["extrapolation"] = _extrapolation_over_seeds(extrapolation["lengths"],
                                                       [m["extrapolation"] for m in models.values()])
    entry["extrapolation_scaled"] = {
        scaling_label(scaling): _extrapolation_over_seeds(
            extrapolation["lengths"],
            [m["extrapolation_scaled"].get(scaling_label(scaling), {}) for m in models.values()])
        for scaling in extrapolation["rotary_scalings"]}
    if len(models) > 1:
        entry["valid_loss"] = statistics.spread([m["valid_loss"] for m in models.values()])
        entry["valid_loss_curve"] = _mean_curve([m["valid_loss_curve"] for m in models.values()])
        entry["valid_loss_band"] = _band([m["valid_loss_curve"] for m in models.values()])
        for task, result in entry["glue"].items():
            result["over_pretrain_seeds"] = statistics.spread(
                [m["glue"][task]["median"] for m in models.values() if task in m["glue"]])
        entry["seconds"] = statistics.spread([m["seconds"] for m in models.values()])
    return entry


def _extrapolation_over_seeds(lengths, by_seed):
    """``{LENGTH: {"loss" (mean over seeds), "std", "reason"}}`` from each seed's results."""
    summary = {}
    for length in lengths:
        found = [results_of[str(length)] for results_of in by_seed if str(length) in results_of]
        losses = statistics.spread([r["loss"] for r in found])
        reasons = sorted({r["reason"] for r in found if r["reason"]})
        summary[str(length)] = {"loss": losses["mean"] if losses else None,
                                "std": losses["std"] if losses else None,
                                "reason": "; ".join(reasons) or (None if found else "not run")}
    return summary


def _by_update(curves):
    points = {}
    for curve in curves:
        for update, loss in curve:
            points.setdefault(update, []).append(loss)
    return {u: losses for u, losses in points.items() if len(losses) == len(curves)}


def _mean_curve(curves):
    """The mean curve over the seeds, at the updates every seed evaluated."""
    return [[u, sum(losses) / len(losses)] for u, losses in sorted(_by_update(curves).items())]


def _band(curves):
    """``[update, min, max]`` over the seeds, at the updates every seed evaluated."""
    return [[u, min(losses), max(losses)] for u, losses in sorted(_by_update(curves).items())]


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
    margins = {arch: unigram - mean(entry["valid_loss"]) for arch, entry in report["archs"].items()
               if entry["valid_loss"] is not None}
    return {"unigram_bits": unigram, "margins": margins, "min_margin_bits": min_margin,
            "discriminative": bool(margins) and max(margins.values()) >= min_margin}


def write_report(config, jobs, outcome, out):
    """Write report.json, the figures and report.md into ``out``; returns their paths."""
    report = collect(config, jobs, outcome)
    figures_dir = os.path.join(out, "figures")
    os.makedirs(figures_dir, exist_ok=True)
    from .figures import along_figure, analysis_figures, extrapolation_figure, loss_figure

    figures = {"loss": loss_figure(report, os.path.join(figures_dir, "pretrain_valid_loss.png")),
               "extrapolation": extrapolation_figure(report, os.path.join(figures_dir, "extrapolation.png")),
               "along_pretraining": along_figure(report, os.path.join(figures_dir, "along_pretraining.png")),
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
    return "–" if value is None else f"{mean(value):.{digits}f}"


def _spread(value, digits=3):
    """``mean ± std (min–max, n seeds)`` of a spread, or the number."""
    if not isinstance(value, dict):
        return _number(value, digits)
    std = f" ± {value['std']:.{digits}f}" if value["std"] is not None else ""
    return (f"{value['mean']:.{digits}f}{std} ({value['min']:.{digits}f}–{value['max']:.{digits}f}, "
            f"{value['n']} seeds)")


def _versus(result, digits=3):
    if result is None:
        return "reference"
    if result["ci95"] is None:
        return f"{result['mean_diff']:+.{digits}f} (one seed)"
    low, high = result["ci95"]
    return (f"{result['mean_diff']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"
            + (" *" if result["significant"] else ""))


def markdown(report, out):
    """report.md: the tables, the figures (relative links) and the commands."""
    config = report["config"]
    lines = ["# Position-encoding study", ""]
    corpus = config["corpus"] or "the demo's embedded corpus (Python standard-library docstrings)"
    pretrain = config["pretrain"]
    seeds = pretrain["seeds"]
    lines += [f"Corpus: {corpus}. Pre-training: {pretrain['updates']} updates of {pretrain['batch_size']} "
              f"blocks of up to {pretrain['tokens_per_sample']} tokens, lr {pretrain['lr']}, "
              + (f"seed {seeds[0]}." if len(seeds) == 1 else
                 f"seeds {seeds}: each figure is the mean ± std over the pre-training seeds (min–max, n)."),
              ""]
    lines += _pretrain_section(report, out)
    if config["extrapolation"] is not None:
        lines += _extrapolation_section(report, out)
    if pretrain["evaluate_at"]:
        lines += _along_section(report, out)
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
    lines += _plateau_warning(report)
    reference = report["config"]["report"]["reference"]
    lines += [f"| arch | valid loss | − {reference} | below unigram | updates | wall time (s) | tokens/s | "
              "updates/s |", "|---|---|---|---|---|---|---|---|"]
    for arch, entry in report["archs"].items():
        curve = entry["valid_loss_curve"]
        margin = baseline["margins"].get(arch) if baseline else None
        lines.append(f"| {arch} | {_spread(entry['valid_loss'])} | {_versus(entry['versus_reference'])} | "
                     f"{_number(margin)} | {curve[-1][0] if curve else '–'} | "
                     f"{_number(entry['seconds'], 0)} | "
                     f"{_number(entry.get('tokens_per_second'), 0)} | "
                     f"{_number(entry.get('updates_per_second'), 2)} |")
    lines += ["", _versus_note(report), ""]
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
    lines += _convergence_table(report)
    return lines + _figure(report, "loss", "validation loss against updates", out)


def _plateau_warning(report):
    """The runs whose final loss is still on the unigram plateau, and what that does to the comparison."""
    on_plateau = {arch: [seed for seed, model in entry["seeds"].items() if model.get("on_plateau")]
                  for arch, entry in report["archs"].items()}
    on_plateau = {arch: seeds for arch, seeds in on_plateau.items() if seeds}
    if not on_plateau:
        return []
    runs = "; ".join(f"{arch} (seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)})"
                     for arch, seeds in on_plateau.items())
    bits = report["config"]["report"]["plateau_bits"]
    return [f"**On the unigram plateau**: {runs}: the final loss is less than {bits:.1f} bits below the "
            "unigram baseline (`report.plateau_bits`). A final-loss difference involving them measures "
            "when a model leaves the context-free regime, not what it learns; the updates to reach the "
            "reference's loss below, and a longer schedule (`pretrain.updates`), say more.", ""]


def _convergence_table(report):
    """Updates to reach the reference's final loss per arch and seed, as a fraction of its updates."""
    reference, updates = report["config"]["report"]["reference"], report["config"]["pretrain"]["updates"]
    rows = [(arch, entry["convergence"]) for arch, entry in report["archs"].items() if entry["convergence"]]
    if not rows:
        return []
    target = rows[0][1]["target"]
    lines = [f"Updates to reach {reference}'s final loss ({target:.3f} bits, the mean over its seeds; "
             f"fraction of its {updates} updates): the first update at which each seed's validation curve "
             "reaches it, interpolated between evaluations; the fraction is the mean over seeds with its 95% "
             "t interval when every seed reached it. Left plateau: the first update "
             f"{report['config']['report']['plateau_bits']:.1f} bits below the unigram baseline.", "",
             "| arch | updates per seed | reached | fraction of the reference's updates | left plateau |",
             "|---|---|---|---|---|"]
    for arch, result in rows:
        per_seed = ", ".join("never" if u is None else f"{u:.0f}" for u in result["updates"].values())
        if result["fraction"] is None:
            fraction = "–"
        elif result["ci95"] is None:
            fraction = f"{result['fraction']:.2f} (one seed)"
        else:
            fraction = f"{result['fraction']:.2f} [{result['ci95'][0]:.2f}, {result['ci95'][1]:.2f}]"
        left = ", ".join("–" if m.get("left_plateau_at") is None else f"{m['left_plateau_at']:.0f}"
                         for m in report["archs"][arch]["seeds"].values())
        lines.append(f"| {arch} | {per_seed} | {result['reached']} of {result['seeds']} | {fraction} | "
                     f"{left} |")
    return lines + [""]


def _figure(report, name, text, out):
    """The markdown lines of figure ``name`` (a link relative to ``out``), none when it was not drawn."""
    figure = report["figures"].get(name)
    return [f"![{text}]({os.path.relpath(figure, out)})", ""] if figure else []


def _versus_note(report):
    """What the column against the reference says, and whether an interval could be given."""
    seeds = report["config"]["pretrain"]["seeds"]
    if len(seeds) < 2:
        return (f"− {report['config']['report']['reference']}: the difference of the validation loss from "
                "the reference architecture's. One pre-training seed: no confidence interval can be given, "
                "so no difference can be called significant (list several pretrain.seeds).")
    return (f"− {report['config']['report']['reference']}: the mean over the {len(seeds)} pre-training "
            f"seeds of the per-seed difference from the reference architecture, and its 95% interval "
            f"({statistics.METHOD}); * marks an interval that excludes 0 (a significant difference).")


def _extrapolation_section(report, out):
    lengths = [str(n) for n in report["config"]["extrapolation"]["lengths"]]
    trained = report["config"]["pretrain"]["tokens_per_sample"]
    lines = ["## Length extrapolation (validation loss in bits)", "",
             f"fairseq-validate on the validation text cut into blocks of L tokens, the model rebuilt for L "
             f"(trained on blocks of whole lines of up to {trained}); mean ± std over pre-training seeds. "
             "n/a: the model has no position beyond its learned table.", "",
             "| arch | " + " | ".join(f"L = {n}" + (" (trained)" if int(n) == trained else "")
                                      for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for arch, entry in report["archs"].items():
        rows = [(arch, entry["extrapolation"])]
        rows += [(f"{arch} ({label})", by_length)
                 for label, by_length in entry["extrapolation_scaled"].items()
                 if any(r["loss"] is not None for r in by_length.values())]
        for name, by_length in rows:
            cells = []
            for n in lengths:
                result = by_length.get(n) or {"loss": None, "std": None, "reason": "not run"}
                if result["loss"] is None:
                    cells.append(f"n/a: {result['reason']}")
                else:
                    std = f" ± {result['std']:.3f}" if result["std"] is not None else ""
                    cells.append(f"{result['loss']:.3f}{std}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines + _figure(report, "extrapolation", "validation loss against input length", out)


def _along_section(report, out):
    """Each figure of the checkpoints kept along pre-training (TUPE, arXiv 2006.15595, Fig. 4b/c)."""
    config = report["config"]
    updates = [str(u) for u in config["pretrain"]["evaluate_at"] + [config["pretrain"]["updates"]]]
    tasks = (config["glue"] or {}).get("tasks", [])
    lines = ["## Along pre-training", "",
             "The checkpoints kept at `pretrain.evaluate_at` evaluated as the final one: validation loss "
             "(bits)"
             + (", each GLUE task's median (its metric)" if tasks else "")
             + (", SQuAD F1" if config["squad"] is not None else "") + "; mean over pre-training seeds.", "",
             "| arch | figure | " + " | ".join(f"{u} updates" for u in updates) + " |",
             "|---|---|" + "---|" * len(updates)]
    for arch, entry in report["archs"].items():
        along = entry["along_pretraining"]
        rows = [("valid loss", [_number(along[u]["valid_loss"]) for u in updates])]
        rows += [(task, [_number((along[u]["glue"].get(task) or {}).get("median"), 1) for u in updates])
                 for task in tasks]
        if config["squad"] is not None:
            rows.append(("SQuAD F1", [_number(first_squad(along[u]["squad"]).get("f1"), 1)
                                      for u in updates]))
        lines += [f"| {arch} | {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    lines.append("")
    reached = {arch: entry["glue_convergence"] for arch, entry in report["archs"].items()
               if entry.get("glue_convergence")}
    if reached:
        target = next(iter(reached.values()))["target"]
        lines += [f"Checkpoint at which the GLUE average first reaches {config['report']['reference']}'s "
                  f"final one ({target:.1f}; fraction of the {config['pretrain']['updates']} updates): "
                  + "; ".join(f"{arch} " + ("never" if r["checkpoint"] is None else
                                            f"{r['checkpoint']} ({r['fraction']:.2f})")
                              for arch, r in reached.items()) + ".", ""]
    return lines + _figure(report, "along_pretraining", "scores against pre-training updates", out)


def _glue_section(report):
    glue = report["config"]["glue"]
    tasks, seeds, lrs = glue["tasks"], glue["seeds"], glue["lrs"]
    metrics = "; ".join(f"{task} {'/'.join(GLUE_TASKS[task].shown)} ({glue['checkpoint']} by "
                        f"{GLUE_TASKS[task].metric})" for task in tasks)
    which = "best evaluation" if glue["checkpoint"] == "best" else "last evaluation"
    grid = (f" Each task's learning rate chosen from {lrs} by the {glue['select']} over the seeds (TUPE's "
            "choice), shown in the cell." if len(lrs) > 1 else "")
    lines = ["## GLUE (dev)", "",
             f"Median over fine-tuning seeds {seeds} of each run's {which} (min–max of the task's "
             f"metric in brackets): {metrics}.{grid} Avg.: mean over tasks of the median of each task's "
             "metric" + (", WNLI left out as in the papers" if "WNLI" in tasks else "") + ". A run whose "
             "every evaluation gave nan is a failed run, counted in its cell and left out of the median.", "",
             "| arch | " + " | ".join(tasks) + " | Avg. |", "|---|" + "---|" * (len(tasks) + 1)]
    for arch, entry in report["archs"].items():
        cells = []
        for task in tasks:
            result = entry["glue"].get(task)
            if result is None:
                cells.append("–")
                continue
            cell = "–"
            if result["median"] is not None:
                shown = "/".join(_number(result["medians"][m], 1) for m in result["shown"])
                cell = f"{shown} ({_number(result['min'], 1)}–{_number(result['max'], 1)})"
                over = result.get("over_pretrain_seeds")
                if over and over["std"] is not None:
                    cell += f", ± {over['std']:.1f} over pre-training seeds"
                if len(lrs) > 1:
                    cell += ", lr " + "/".join(sorted({f"{lr:g}" for lr in result["lr"].values()}))
            if result["failed"]:
                cell += f", {len(result['failed'])} failed"
            cells.append(cell)
        average = _number(results.glue_average(entry["glue"], tasks), 1)
        lines.append(f"| {arch} | " + " | ".join(cells) + f" | {average} |")
    return lines + [""]


def _ordinal(n):
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _squad_section(report):
    squad = report["config"]["squad"]
    versions = squad["versions"]
    sources = []
    for version in versions:
        files = squad["files"][version]
        if files["train"] is None:
            first = f" (first {squad['max_articles']} articles)" if squad["max_articles"] else ""
            sources.append(f"v{version} fine-tuned on a split of the articles of {files['dev']}{first}: "
                           f"every {_ordinal(squad['dev_every'])} article is dev, the others train, so these "
                           "scores are not comparable with published SQuAD dev scores")
        else:
            sources.append(f"v{version} fine-tuned on {files['train']}, evaluated on {files['dev']}")
    seeds = squad["seeds"]
    over = f"; mean ± std over the fine-tuning seeds {seeds}" if len(seeds) > 1 else ""
    lines = [f"## SQuAD {', '.join('v' + v for v in versions)}", "",
             f"EM / F1 ({'; '.join(sources)}){over}. Questions tupe-prepare-squad skipped (too long for the "
             "fine-tuning window) have no prediction and count as wrong: the predicted column says how many "
             "were predicted.", "",
             "| arch | " + " | ".join(f"v{v} EM | v{v} F1" for v in versions) + " | predicted / questions |",
             "|---|" + "---|---|" * len(versions) + "---|"]
    for arch, entry in report["archs"].items():
        by_version = entry["squad"] if len(versions) > 1 else {versions[0]: entry["squad"]}
        cells, coverage = [], "–"
        for version in versions:
            result = (by_version or {}).get(version) or {}
            for key in ("exact_match", "f1"):
                std = (result.get("std") or {}).get(key)
                cells.append(_number(result.get(key), 1) + (f" ± {std:.1f}" if std is not None else ""))
            if "questions" in result and coverage == "–":
                coverage = f"{result['predicted']} / {result['questions']}"
        lines.append(f"| {arch} | " + " | ".join(cells) + f" | {coverage} |")
    return lines + [""]


def _analysis_section(report, out):
    lines = ["## Position analysis (tupe-analyze)", "",
             "Translation-invariance violation (0 = invariant), monotonicity fractions forward/backward "
             "(1 = monotone), symmetry violation and offset asymmetry of each matrix, as defined in "
             "docs/analysis.md.", "",
             "| matrix | arch | " + " | ".join(title for _, title in PROPERTIES) + " |",
             "|---|---|" + "---|" * len(PROPERTIES)]
    rows, left_out = [], []
    for section in _section_names(report):
        without = []
        for arch, entry in report["archs"].items():
            result = (entry["analysis"] or {}).get(section)
            if result is None or not result["applies"]:
                without.append(arch)
                continue
            rows += [(f"{section}: {row['label']}", arch, row) for row in result["rows"]]
        if without and len(without) < len(report["archs"]):
            left_out.append(f"{section}: {', '.join(without)}")
    cells = format_columns([row for _, _, row in rows], [key for key, _ in PROPERTIES])
    lines += [f"| {label} | {arch} | " + " | ".join(row) + " |" for (label, arch, _), row in zip(rows, cells)]
    lines.append("")
    if left_out:
        lines += ["Left out, the architectures a section does not apply to (their positions.json says why): "
                  + "; ".join(left_out) + ".", ""]
    for figure, (path, caption) in report["figures"].get("analysis", {}).items():
        lines += [f"![{figure}, every architecture that has it]({os.path.relpath(path, out)})", "",
                  f"*{figure}*: {caption}", ""]
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
             "Each job ran these commands in its own folder (Python and `fairseq-*` of the study's "
             "environment); its output is in the log named.", ""]
    for name, job in report["jobs"].items():
        status = job["status"] + (f" ({job['note']})" if job["status"] != DONE else "")
        lines += [f"- `{name}`: {status}, {_number(job['seconds'], 0)} s, log `{job['log']}`", "",
                  "  ```bash"]
        lines += [f"  {command}" for command in job["commands"]]
        lines += ["  ```", ""]
    return lines
