"""Convergence in the study report: the update at which each run first reaches the reference's final loss
(interpolated between evaluations), its fraction of the reference's updates, and the runs still on the unigram
plateau; crossings computed by hand from synthetic curves."""

import json

import matplotlib.pyplot as plt
import pytest
from test_study_report import finish, valid_line

from tupe_plugin.study import convergence, figures
from tupe_plugin.study.config import StudyConfigError, check_config
from tupe_plugin.study.jobs import build_jobs
from tupe_plugin.study.report import write_report
from tupe_plugin.study.runner import DONE

CURVE = [[2, 8.0], [4, 7.0], [6, 6.0]]


def test_a_crossing_between_two_evaluations_is_interpolated():
    assert convergence.first_crossing(CURVE, 6.5) == pytest.approx(5.0)
    assert convergence.first_crossing(CURVE, 7.75) == pytest.approx(2.5)


def test_a_crossing_exactly_at_an_evaluation_is_that_update():
    assert convergence.first_crossing(CURVE, 7.0) == pytest.approx(4.0)


def test_a_curve_that_starts_below_the_target_crosses_at_its_first_evaluation():
    assert convergence.first_crossing(CURVE, 9.0) == 2.0


def test_a_curve_that_never_reaches_the_target_has_no_crossing():
    assert convergence.first_crossing(CURVE, 5.9) is None


def test_a_score_crosses_upward():
    assert convergence.first_crossing([[1, 50.0], [3, 60.0]], 55.0, below=False) == pytest.approx(2.0)


def test_the_fraction_is_the_mean_crossing_over_the_reference_updates_with_its_t_interval():
    result = convergence.convergence({"1": [[0, 9.0], [4, 7.0]], "2": [[0, 9.0], [4, 8.0], [8, 6.0]]}, 7.0, 8)
    assert result["updates"] == {"1": 4.0, "2": 6.0} and (result["reached"], result["seeds"]) == (2, 2)
    sd = 0.125 * 2 ** 0.5  # sample standard deviation of the fractions 0.5 and 0.75
    half = 12.706204736174698 * sd / 2 ** 0.5  # Student t, 0.975 quantile, 1 degree of freedom
    assert result["fraction"] == pytest.approx(0.625)
    assert result["ci95"] == pytest.approx([0.625 - half, 0.625 + half])


def test_no_fraction_unless_every_seed_reaches_the_target():
    result = convergence.convergence({"1": [[4, 6.0]], "2": [[4, 8.0]]}, 7.0, 8)
    assert result["updates"] == {"1": 4.0, "2": None} and result["reached"] == 1
    assert result["fraction"] is None and result["ci95"] is None


def test_one_seed_has_a_fraction_and_no_interval():
    result = convergence.convergence({"1": [[2, 9.0], [4, 5.0]]}, 7.0, 8)
    assert result["fraction"] == pytest.approx(3.0 / 8) and result["ci95"] is None


def test_a_run_leaves_the_plateau_when_its_loss_is_plateau_bits_below_the_unigram_baseline():
    assert convergence.plateau(CURVE, 8.5, 1.0) == {"left_plateau_at": pytest.approx(3.0),
                                                    "on_plateau": False}
    assert convergence.plateau(CURVE, 8.5, 3.0) == {"left_plateau_at": None, "on_plateau": True}


def test_the_first_checkpoint_whose_score_reaches_the_target():
    assert convergence.first_checkpoint_reaching({4: 61.0, 2: 55.0, 8: 70.0}, 60.0) == 4
    assert convergence.first_checkpoint_reaching({2: 55.0, 4: None}, 60.0) is None


def test_plateau_bits_must_be_a_positive_number():
    with pytest.raises(StudyConfigError, match="'report.plateau_bits': must be a positive number"):
        check_config({"archs": ["bert_a_tiny"], "report": {"plateau_bits": 0}}, {"bert_a_tiny"})


# validation losses at updates 2, 4, 6 and 8; the reference's final loss is (6.0 + 7.6) / 2 = 6.8, which its
# own second seed never reaches; the plateau line is 8.0 - 1.0 = 7.0
LOSSES = {"bert_a_tiny": {1: [8.5, 8.2, 7.5, 6.0], 2: [8.4, 8.1, 7.8, 7.6]},
          "tupe_r_tiny": {1: [8.0, 6.8, 6.0, 5.5], 2: [7.0, 6.5, 6.0, 5.8]}}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("convergence")
    config = check_config({"archs": list(LOSSES), "analysis": False,
                           "pretrain": {"seeds": [1, 2], "updates": 8, "validate_every": 2}}, set(LOSSES))
    out = tmp_path / "out"
    jobs = {job.name: job for job in build_jobs(config, out)}
    finish(jobs["data"], 1.0, {})
    finish(jobs["unigram"], 1.0, {"unigram.json": json.dumps({"bits_per_token": 8.0})})
    for arch, by_seed in LOSSES.items():
        for seed, losses in by_seed.items():
            log = "".join(valid_line(update, loss=loss) for update, loss in zip((2, 4, 6, 8), losses))
            finish(jobs[f"pretrain/{arch}/seed{seed}"], 10.0, {"train.log": log})
    paths = write_report(config, list(jobs.values()), {name: (DONE, "") for name in jobs}, out)
    with open(paths["json"], encoding="utf-8") as f, open(paths["md"], encoding="utf-8") as g:
        return json.load(f), g.read()


def test_report_json_has_each_archs_updates_to_reach_the_references_final_loss(study):
    tupe = study[0]["archs"]["tupe_r_tiny"]["convergence"]
    assert tupe["target"] == pytest.approx(6.8)
    assert tupe["updates"] == {"1": pytest.approx(4.0), "2": pytest.approx(2.8)}
    assert tupe["fraction"] == pytest.approx((4.0 + 2.8) / 2 / 8) and len(tupe["ci95"]) == 2


def test_a_reference_seed_that_never_reaches_its_own_mean_leaves_the_fraction_empty(study):
    reference = study[0]["archs"]["bert_a_tiny"]["convergence"]
    assert reference["updates"] == {"1": pytest.approx(6 + 2 * 0.7 / 1.5), "2": None}
    assert (reference["reached"], reference["fraction"], reference["ci95"]) == (1, None, None)


def test_each_run_says_when_it_left_the_plateau_and_whether_it_ends_on_it(study):
    seeds = study[0]["archs"]["bert_a_tiny"]["seeds"]
    assert seeds["1"]["left_plateau_at"] == pytest.approx(6 + 2 * 0.5 / 1.5) and not seeds["1"]["on_plateau"]
    assert seeds["2"]["left_plateau_at"] is None and seeds["2"]["on_plateau"]
    tupe = study[0]["archs"]["tupe_r_tiny"]["seeds"]
    assert tupe["1"]["left_plateau_at"] == pytest.approx(2 + 2 * 1.0 / 1.2)
    assert tupe["2"]["left_plateau_at"] == 2.0


def test_report_md_warns_above_the_final_loss_table_of_the_runs_on_the_plateau(study):
    text = study[1]
    warning = text.index("**On the unigram plateau**: bert_a_tiny (seed 2)")
    assert warning < text.index("| arch | valid loss |")
    assert "when a model leaves the context-free regime, not what it learns" in text


def test_report_md_has_the_convergence_table(study):
    text = study[1]
    assert "Updates to reach bert_a_tiny's final loss (6.800 bits" in text
    assert "| bert_a_tiny | 7, never | 1 of 2 | – | 7, – |" in text
    assert "| tupe_r_tiny | 4, 3 | 2 of 2 | 0.43 [-0.53, 1.38] | 4, 2 |" in text


def test_the_loss_figure_marks_the_target_and_each_runs_crossing(study, monkeypatch):
    report = study[0]
    axes = []
    subplots = plt.subplots

    def keeping(*args, **kwargs):
        fig, ax = subplots(*args, **kwargs)
        axes.append(ax)
        return fig, ax

    monkeypatch.setattr(figures.plt, "subplots", keeping)
    figures.loss_figure(report, "/dev/null")
    lines = axes[0].get_lines()
    assert any(list(line.get_ydata()) == [pytest.approx(6.8)] * 2 and line.get_linestyle() == ":"
               for line in lines)
    crossings = sorted(x for line in lines if line.get_marker() == "x" for x in line.get_xdata())
    assert crossings == pytest.approx(sorted([6 + 2 * 0.7 / 1.5, 4.0, 2.8]))
