"""The study's figures: validation loss of every arch on one plot, analysis pictures side by side."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

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
    fig.savefig(path, dpi=100)
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
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def analysis_figures(report, folder):
    """One PNG per analysis section: each arch's picture of it, side by side (a text panel saying
    why where the section does not apply), one arch per row. {section: path}."""
    archs = {arch: entry["analysis"] for arch, entry in report["archs"].items() if entry["analysis"]}
    sections = []
    for analysis in archs.values():
        sections += [name for name, result in analysis.items()
                     if result["applies"] and result["figures"] and name not in sections]
    written = {}
    for section in sections:
        fig, axes = plt.subplots(len(archs), 1, figsize=(12, 3.5 * len(archs)), squeeze=False)
        for ax, (arch, analysis) in zip(axes[:, 0], archs.items()):
            ax.axis("off")
            result = analysis.get(section)
            if result and result["applies"] and result["figures"]:
                ax.imshow(mpimg.imread(result["figures"][0]))
                ax.set_title(arch)
            else:
                reason = result["reason"] if result else "not analysed"
                ax.text(0.5, 0.5, f"{arch}\nn/a: {reason}", ha="center", va="center", wrap=True,
                        fontsize=8, transform=ax.transAxes)
        fig.tight_layout()
        path = os.path.join(folder, f"analysis_{section}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written[section] = path
    return written
