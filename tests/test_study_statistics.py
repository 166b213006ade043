"""The uncertainty over pre-training seeds: the spread of a figure and the paired interval."""

import pytest

from tupe_plugin.study.statistics import paired_difference, spread


def test_an_interval_that_excludes_zero_is_significant():
    result = paired_difference({1: 5.0, 2: 5.1, 3: 4.95}, {1: 5.5, 2: 5.7, 3: 5.5})
    low, high = result["ci95"]
    assert result["significant"] is True and high < 0 and result["mean_diff"] == pytest.approx(-0.55)


def test_only_seeds_both_archs_have_are_paired():
    result = paired_difference({1: 5.0, 2: 5.1, 3: None}, {1: 5.5, 2: 5.7, 4: 9.0})
    assert result["seeds"] == [1, 2] and result["n"] == 2


def test_one_paired_seed_gives_no_interval_and_says_why():
    result = paired_difference({1: 5.0}, {1: 5.5})
    assert result["ci95"] is None and result["significant"] is None
    assert "no interval can be given" in result["reason"]


def test_spread_of_one_value_has_no_standard_deviation():
    assert spread([3.0]) == {"mean": 3.0, "std": None, "min": 3.0, "max": 3.0, "n": 1}
    assert spread([None, None]) is None
