"""Uncertainty over pre-training seeds: a figure's spread, and an architecture against the reference.

A study pre-trains every architecture once per seed of ``pretrain.seeds``. Each figure (validation
loss, a GLUE median, an extrapolated loss) is then given as mean ± sample standard deviation with its
min and max over the seeds (:func:`spread`). The comparison with the reference architecture pairs the
seeds (the same seed orders the data and initialises both models): the per-seed difference
``arch - reference``, its mean and a two-sided 95% Student t interval over the n paired seeds,
mean ± t(0.975, n - 1) · sd / √n (:func:`paired_difference`). The difference is significant when the
interval excludes 0; with fewer than two paired seeds no interval can be given.
"""

import math
import statistics

METHOD = "paired t, 95%, over pre-training seeds"


def spread(values):
    """``{"mean", "std", "min", "max", "n"}`` of ``values`` (std: sample, None for one value)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "n": len(values)}


def mean(value):
    """A figure's value: the number itself (one seed), or the mean of its spread over seeds."""
    return value["mean"] if isinstance(value, dict) else value


def t_quantile_975(df):
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def paired_difference(by_seed, reference_by_seed):
    """``arch - reference`` over the seeds both have: ``{"mean_diff", "ci95", "method", "significant",
    "n"}``; ``ci95`` and ``significant`` are None, with ``reason``, below two paired seeds."""
    seeds = sorted(s for s in by_seed if by_seed[s] is not None and reference_by_seed.get(s) is not None)
    diffs = [by_seed[s] - reference_by_seed[s] for s in seeds]
    if not diffs:
        return None
    result = {"mean_diff": statistics.fmean(diffs), "n": len(diffs), "seeds": seeds, "method": METHOD}
    if len(diffs) < 2:
        return {**result, "ci95": None, "significant": None,
                "reason": "one paired seed: no interval can be given (list several pretrain.seeds)"}
    half = t_quantile_975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    low, high = result["mean_diff"] - half, result["mean_diff"] + half
    return {**result, "ci95": [low, high], "significant": not low <= 0 <= high}
