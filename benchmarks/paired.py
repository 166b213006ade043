"""Ratios paired within a repetition, the statistic both step benchmarks report.

Every repetition (a round of ``benchmark.py``, a repetition of ``benchmark_train.py``) runs all
contenders back to back, so they share the machine's state of that moment. Dividing each contender's
median over repetitions by the reference's median, taken separately, mixes the machine's drift between
repetitions into the ratio: the two medians can come from different repetitions, and on a shared machine
the drift is as large as the differences measured. Here a ratio is computed within each repetition
(contender's cost / reference's cost, costs being seconds: larger is worse) and summarised by the
median of those ratios with their min-max.

The verdict against a bound on the ratio needs ``MIN_REPETITIONS`` repetitions: ``met`` when every
repetition's ratio is within the bound, ``missed`` when the median is over it, ``inside the noise``
when the median is within the bound but the range reaches over it. A median over the bound is a miss
even where a repetition fell under it: the best estimate is over. The drift is the reference's cost in
its last repetition over its first.
"""

import statistics

MIN_REPETITIONS = 5
MET, MISSED, NOISE = "met", "missed", "inside the noise"


def ratios(costs, reference_costs):
    """Contender's cost over the reference's, one per repetition."""
    if len(costs) != len(reference_costs):
        raise ValueError(f"{len(costs)} repetitions against the reference's {len(reference_costs)}")
    return [cost / reference for cost, reference in zip(costs, reference_costs)]


def summary(values):
    """Median and min-max of per-repetition ratios."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "ratios": list(values)}


def verdict(values, bound):
    """``met``, ``missed``, ``inside the noise``, or None from fewer than MIN_REPETITIONS ratios."""
    if len(values) < MIN_REPETITIONS:
        return None
    if max(values) <= bound:
        return MET
    return MISSED if statistics.median(values) > bound else NOISE


def drift(reference_costs):
    """The reference's cost in its last repetition over its first (1.07: the machine got 7 % slower)."""
    return reference_costs[-1] / reference_costs[0]


def cell(stats):
    """``median [min–max]`` of a :func:`summary`, three decimals."""
    return f"{stats['median']:.3f} [{stats['min']:.3f}–{stats['max']:.3f}]"


def verdict_cell(value):
    return {None: "–", MET: "met", MISSED: "MISSED", NOISE: "inside the noise"}[value]
