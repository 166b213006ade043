"""Convergence: the updates an arch needs to reach the reference's final loss, and runs still on the plateau.

TUPE (Ke, He, Liu, "Rethinking Positional Encoding in Language Pre-training", arXiv 2006.15595) states its
speed claim in these terms: "TUPE-A (TUPE-R) achieves smaller validation loss than the baselines during
pre-training" (Fig. 4a) and it "can even achieve a better GLUE average score than the baselines while only
using 30% pre-training steps" (§4.2, Fig. 4c). :func:`convergence` measures the first: the update at which
each seed's validation curve first reaches the reference arch's final loss (the mean over its seeds),
linearly interpolated between the two evaluations around it, as a fraction of the reference's updates.
:func:`first_checkpoint_reaching` measures the second on the checkpoints kept along pre-training.

At small scale a model may spend most of its budget on the unigram plateau, predicting tokens without their
context: its final loss then says when it left that regime, not what it learned. :func:`plateau` marks
each run: the first update at least ``plateau_bits`` below the unigram baseline, and whether the final loss
is still above that line.
"""

import math
import statistics

from .statistics import t_quantile_975

METHOD = ("first update at which each seed's validation curve reaches the target, linearly interpolated "
          "between the two evaluations around it; fraction: the mean over seeds divided by the reference's "
          "updates (the same schedule for every seed), with the 95% Student t interval of the per-seed "
          "fractions")


def first_crossing(curve, target, below=True):
    """The first update at which ``curve`` (``[[update, value], ...]`` in update order) reaches ``target``:
    at or below it (``below``), else at or above it; linearly interpolated between the last evaluation that
    has not reached it and the first that has; the first evaluation's own update when it already has; None
    when no evaluation does."""
    previous = None
    for update, value in curve:
        if value is None:
            continue
        if (value <= target) if below else (value >= target):
            if previous is None:
                return float(update)
            before_update, before_value = previous
            return before_update + (update - before_update) * (before_value - target) / (before_value - value)
        previous = (update, value)
    return None


def convergence(curves_by_seed, target, reference_updates):
    """``{"target", "updates": {seed: update or None}, "reached", "seeds", "fraction", "ci95", "method"}``:
    each seed's :func:`first_crossing` of ``target``, how many reached it, and the mean update over
    ``reference_updates`` with the t interval of the per-seed fractions (None unless every seed reached
    it; no interval for one seed)."""
    updates = {seed: first_crossing(curve, target) for seed, curve in curves_by_seed.items()}
    reached = [update for update in updates.values() if update is not None]
    result = {"target": target, "updates": updates, "reached": len(reached), "seeds": len(updates),
              "fraction": None, "ci95": None, "method": METHOD}
    if reached and len(reached) == len(updates):
        fractions = [update / reference_updates for update in reached]
        result["fraction"] = statistics.fmean(fractions)
        if len(fractions) > 1:
            n = len(fractions)
            half = t_quantile_975(n - 1) * statistics.stdev(fractions) / math.sqrt(n)
            result["ci95"] = [result["fraction"] - half, result["fraction"] + half]
    return result


def plateau(curve, unigram_bits, plateau_bits):
    """``{"left_plateau_at", "on_plateau"}`` of one run: the first update at which its validation loss is
    ``plateau_bits`` or more below the unigram baseline (interpolated as :func:`first_crossing`; None if
    never), and whether its final loss is not."""
    line = unigram_bits - plateau_bits
    losses = [loss for _, loss in curve if loss is not None]
    return {"left_plateau_at": first_crossing(curve, line),
            "on_plateau": losses[-1] > line if losses else None}


def first_checkpoint_reaching(scores_by_update, target):
    """The first update (of ``{update: score}``) whose score is at least ``target``, or None: where a kept
    checkpoint's GLUE average first reaches the reference's final one."""
    return next((update for update, score in sorted(scores_by_update.items())
                 if score is not None and score >= target), None)
