"""The study's figures: validation loss of every arch on one plot, and each analysis figure drawn once
from every arch's numbers (one scale for all of them), each PNG with a PDF beside it."""

import os

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..analysis import figures as drawing  # noqa: E402
from .results import first_squad, glue_average  # noqa: E402
from .statistics import mean  # noqa: E402


def loss_figure(report, path):
    """Validation masked-LM loss against updates, one line per arch (the mean over pre-training seeds,
    their min–max shaded), the unigram baseline dashed (TUPE, arXiv 2006.15595, Fig. 4a), the reference's
    final loss dotted with each run's first crossing of it marked (x). None when no arch has a curve."""
    curves = {arch: entry["valid_loss_curve"] for arch, entry in report["archs"].items()
              if entry["valid_loss_curve"]}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for arch, curve in curves.items():
        line, = ax.plot([u for u, _ in curve], [loss for _, loss in curve], marker=".", label=arch)
        band = report["archs"][arch].get("valid_loss_band")
        if band:
            updates, lows, highs = zip(*band)
            ax.fill_between(updates, lows, highs, color=line.get_color(), alpha=0.2)
        reached = report["archs"][arch].get("convergence") or {"updates": {}}
        crossings = [update for update in reached["updates"].values() if update is not None]
        if crossings:
            ax.plot(crossings, [reached["target"]] * len(crossings), "x", color=line.get_color(),
                    markersize=8)
    target = next((entry["convergence"]["target"] for entry in report["archs"].values()
                   if entry.get("convergence")), None)
    if target is not None:
        ax.axhline(target, color="black", linestyle=":",
                   label=f"{report['config']['report']['reference']}'s final loss")
    if report["unigram"]:
        ax.axhline(report["unigram"]["bits_per_token"], color="gray", linestyle="--",
                   label="unigram baseline")
    ax.set_xlabel("updates")
    ax.set_ylabel("validation MLM loss (bits)")
    return _saved(fig, ax, path)


def _saved(fig, ax, path):
    """Legend and grid on ``ax``, ``fig`` written to ``path`` and closed; the path."""
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    drawing.save(fig, path)
    plt.close(fig)
    return path


def extrapolation_figure(report, path):
    """Validation loss against the input length, one line per arch (mean over pre-training seeds, ± std
    as error bars), the training length marked. None without extrapolation numbers."""
    config = report["config"]
    if config["extrapolation"] is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for arch, entry in report["archs"].items():
        points = [(int(n), r["loss"], r["std"] or 0.0) for n, r in entry["extrapolation"].items()
                  if r["loss"] is not None]
        if points:
            drawn = True
            ax.errorbar([n for n, _, _ in points], [loss for _, loss, _ in points],
                        yerr=[std for _, _, std in points], marker=".", capsize=3, label=arch)
    if not drawn:
        plt.close(fig)
        return None
    ax.axvline(config["pretrain"]["tokens_per_sample"], color="gray", linestyle="--", label="trained length")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("longest input (tokens)")
    ax.set_ylabel("validation MLM loss (bits)")
    return _saved(fig, ax, path)


def along_figure(report, path):
    """Each GLUE task's median score (and SQuAD F1) against pre-training updates, one panel per task,
    one line per arch (TUPE, arXiv 2006.15595, Fig. 4b/c). None without ``pretrain.evaluate_at``."""
    config = report["config"]
    if not config["pretrain"]["evaluate_at"]:
        return None
    tasks = (config["glue"] or {}).get("tasks", [])
    panels = [(task, lambda figures, task=task: (figures["glue"].get(task) or {}).get("median"))
              for task in tasks]
    if config["squad"] is not None:
        panels.append(("SQuAD F1", lambda figures: first_squad(figures["squad"]).get("f1")))
    if tasks:
        panels.append(("GLUE avg.", lambda figures: glue_average(figures["glue"], tasks)))
    glue_target = next((entry["glue_convergence"]["target"] for entry in report["archs"].values()
                        if entry.get("glue_convergence")), None)
    panels.append(("valid loss (bits)", lambda figures: mean(figures["valid_loss"])))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5), squeeze=False)
    for ax, (title, value) in zip(axes[0], panels):
        for arch, entry in report["archs"].items():
            points = [(int(u), value(figures)) for u, figures in entry["along_pretraining"].items()]
            points = [(u, v) for u, v in points if v is not None]
            if points:
                line, = ax.plot(*zip(*points), marker=".", label=arch)
                reached = entry.get("glue_convergence")
                if title == "GLUE avg." and reached and reached["checkpoint"] is not None:
                    ax.plot([reached["checkpoint"]], [reached["averages"][str(reached["checkpoint"])]], "x",
                            color=line.get_color(), markersize=8)
        if title == "GLUE avg." and glue_target is not None:
            ax.axhline(glue_target, color="black", linestyle=":")
        ax.set_title(title)
        ax.set_xlabel("pre-training updates")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    drawing.save(fig, path)
    plt.close(fig)
    return path


def analysis_figures(report, folder):
    """Each figure of the analysis drawn once from the numbers of every arch that has it (one row, or one
    curve, per arch on one scale; the archs without it named in the caption): {figure: (path, caption)}
    of ``folder/analysis_FIGURE.png``. An analysis written without its numbers (positions.npz) draws
    nothing."""
    archs = {arch: entry["analysis"] for arch, entry in report["archs"].items() if entry["analysis"]}
    found = {}  # figure -> (section, plot, {arch: arrays})
    for arch, analysis in archs.items():
        for section, result in analysis.items():
            if not result["applies"] or not result.get("plots") or not result.get("arrays"):
                continue
            with np.load(result["arrays"]) as stored:
                numbers = {key: stored[key] for key in stored.files}
            for plot in result["plots"]:
                prefix = f"{plot['figure']}/"
                arrays = {key[len(prefix):]: value for key, value in numbers.items()
                          if key.startswith(prefix)}
                found.setdefault(plot["figure"], (section, plot, {}))[2][arch] = arrays
    written = {}
    for figure, (section, plot, by_arch) in found.items():
        without = [arch for arch, analysis in archs.items() if arch not in by_arch
                   and not (analysis.get(section) or {}).get("applies", False)]
        note = f"not drawn for {', '.join(without)}: the section does not apply to them" if without else ""
        path = os.path.join(folder, f"analysis_{figure}.png")
        written[figure] = drawing.draw(plot["kind"], by_arch, plot["title"], path, note=note,
                                       **plot["options"])
    return written
