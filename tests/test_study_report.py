"""The study report from fake job outputs: every number read back from the logs, the medians, the
baseline margin and its flag, the tables and the figures."""

import copy
import json
import os
import shlex
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from tupe_plugin.study import state
from tupe_plugin.study.config import check_config
from tupe_plugin.study.jobs import build_jobs
from tupe_plugin.study.report import write_report
from tupe_plugin.study.runner import DONE, FAILED

from conftest import test_data

ARCHS = ["bert_a_tiny", "tupe_r_tiny"]
VALID = "2026-01-01 00:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | {} | num_updates {}\n"
INNER = ("2026-01-01 00:00:00 | INFO | train_inner | epoch 001:      {u} / 62 loss=9.1, ppl=5, wps={wps}, "
         "ups={ups}, wpb=1700, bsz=16, num_updates={u}, lr=0.001\n")


def valid_line(update, **metrics):
    return VALID.format(" | ".join(f"{k} {v}" for k, v in metrics.items()), update)


def finish(job, seconds, files):
    """Record ``job`` done after writing ``files`` (text, or a function run once the folder exists)."""
    state.start(job, state.FRESH, None)
    for relative, text in files.items():
        path = os.path.join(job.folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text() if callable(text) else text)
    state.finish(job, 0, seconds)


def positions_json(job, ti):
    """A positions.json of one section and its figure's numbers (positions.npz) as the analysis writes
    them: a 4 x 4 matrix of dot products and its profiles."""
    figure = os.path.join(job.folder, "analysis", "absolute_position_dot_products.png")
    os.makedirs(os.path.dirname(figure), exist_ok=True)
    plt.imsave(figure, np.eye(4))
    np.savez(os.path.join(job.folder, "analysis", "positions.npz"), **{
        f"absolute_position_dot_products/{key}": value for key, value in {
            "matrix": np.eye(4) * ti, "positions": np.arange(4), "profile_offsets": np.arange(4),
            "profile_0": np.array([ti, 0.0, 0.0, 0.0]), "profile_1": np.array([ti, 0.0, 0.0, 0.0]),
            "label": np.array("learned APE")}.items()})
    plot = {"figure": "absolute_position_dot_products", "kind": "heatmap_with_profile",
            "title": "dot products",
            "options": {"signed": True, "curves": ["ψ(+m)", "ψ(-m)"], "heatmap_title": "<p_x, p_y>",
                        "xlabel": "position y", "ylabel": "position x", "profile_ylabel": "mean dot product"}}
    return json.dumps({"sections": {
        "absolute_position_dot_products": {
            "title": "dot products", "applies": True, "figures": [figure], "metrics": {}, "plots": [plot],
            "captions": ["one diverging colour scale"],
            "rows": [{"label": "learned APE", "translation_invariance_violation": ti,
                      "monotonicity_forward": 0.5, "monotonicity_backward": 0.4,
                      "symmetry_violation": 0.0, "offset_asymmetry": 0.0}]},
        "t5_bias": {"title": "T5 bias", "applies": False, "reason": "no T5 bias"}}})


# losses per arch at updates 2, 4 (then 4 again after a resume) and 6
LOSSES = {"bert_a_tiny": [9.0, 8.5, 8.4, 7.5], "tupe_r_tiny": [9.0, 8.0, 7.9, 6.5]}
RTE = {"bert_a_tiny": {1: [50.0, 52.5], 2: [47.0, 51.0], 3: [55.0, 53.0]},
       "tupe_r_tiny": {1: [60.0, 58.0], 2: [61.0, 62.0], 3: [57.0, 59.5]}}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("study")
    glue_dir = test_data("glue")
    squad = {"dev": test_data("squad", "dev-v1.1.head.json"), "max_articles": 3}
    config = check_config({"archs": ARCHS, "glue": {"dir": glue_dir, "tasks": ["RTE", "MRPC"]},
                           "squad": squad}, set(ARCHS))
    out = tmp_path / "out"
    jobs = {job.name: job for job in build_jobs(config, out)}
    finish(jobs["data"], 3.0, {})
    finish(jobs["unigram"], 1.0, {"unigram.json": json.dumps({"bits_per_token": 8.0})})
    finish(jobs["squad-data/v1.1"], 1.0, {})
    for arch in ARCHS:
        a, b, c, d = LOSSES[arch]
        log = (INNER.format(u=1, wps=0, ups=0) + INNER.format(u=2, wps=1000.0, ups=0.5)
               + valid_line(2, loss=a)
               + INNER.format(u=4, wps=3000.0, ups=1.5) + valid_line(4, loss=b)
               + "$ fairseq-train ... (resumed)\n" + valid_line(4, loss=c)
               + INNER.format(u=6, wps=2000.0, ups=1.0) + valid_line(6, loss=d))
        finish(jobs[f"pretrain/{arch}/seed1"], 120.0, {"train.log": log})
        for seed, accuracies in RTE[arch].items():
            lines = "".join(valid_line(u, loss=1.0, accuracy=acc) for u, acc in enumerate(accuracies, 1))
            finish(jobs[f"glue/{arch}/seed1/RTE/lr2e-05/seed{seed}"], 10.0, {"run/train.log": lines})
            mrpc = valid_line(1, accuracy=70.0, f1=80.0 + seed) + valid_line(2, accuracy=72.0 + seed, f1=79.0)
            finish(jobs[f"glue/{arch}/seed1/MRPC/lr2e-05/seed{seed}"], 10.0, {"run/train.log": mrpc})
        em = 10.0 if arch == "bert_a_tiny" else 12.5
        finish(jobs[f"squad/{arch}/seed1/v1.1/seed1"], 30.0, {"log.txt": '{"exact_match": 1.0, "f1": 2.0}\n'
                                                   "dev.json: 247 questions, 113 predicted (0 no answer) "
                                                   "-> p.json\n"
                                                   f'{{"exact_match": {em}, "f1": 20.25}}\n'})
        job = jobs[f"analysis/{arch}/seed1"]
        ti = 0.25 if arch == "bert_a_tiny" else 0.75
        finish(job, 5.0, {"analysis/positions.json": lambda job=job, ti=ti: positions_json(job, ti)})
    outcome = {name: (DONE, "") for name in jobs}
    return config, list(jobs.values()), outcome, out


@pytest.fixture(scope="module")
def written(study):
    """The report of the fake study: (report.json content, report.md text, the paths)."""
    paths = write_report(*study)
    with open(paths["json"], encoding="utf-8") as f, open(paths["md"], encoding="utf-8") as g:
        return json.load(f), g.read(), paths


def test_report_json_has_the_schema(written):
    report = written[0]
    assert set(report["archs"]) == set(ARCHS) and report["config"]["archs"] == ARCHS
    for entry in report["archs"].values():
        assert {"valid_loss", "valid_loss_curve", "glue", "squad", "analysis", "seconds"} <= set(entry)
        assert {"metric", "median", "runs"} <= set(entry["glue"]["RTE"])


def test_valid_curve_keeps_the_last_loss_of_a_repeated_update(written):
    report = written[0]
    assert report["archs"]["tupe_r_tiny"]["valid_loss_curve"] == [[2, 9.0], [4, 7.9], [6, 6.5]]
    assert report["archs"]["tupe_r_tiny"]["valid_loss"] == 6.5


def test_speed_and_wall_time_come_from_the_log_and_the_job_record(written):
    entry = written[0]["archs"]["bert_a_tiny"]
    assert entry["seconds"] == 120.0
    # medians of the train_inner lines, the first (wps=0) left out
    assert entry["tokens_per_second"] == 2000.0 and entry["updates_per_second"] == 1.0


def test_glue_score_is_the_median_over_seeds_of_each_runs_best(written):
    rte = written[0]["archs"]["bert_a_tiny"]["glue"]["RTE"]
    assert [run["score"] for run in rte["runs"]] == [52.5, 51.0, 55.0]
    assert (rte["metric"], rte["median"], rte["min"], rte["max"]) == ("accuracy", 52.5, 51.0, 55.0)


def test_mrpc_reports_accuracy_from_the_line_with_the_best_f1(written):
    mrpc = written[0]["archs"]["bert_a_tiny"]["glue"]["MRPC"]
    assert mrpc["metric"] == "f1"
    assert [(run["f1"], run["accuracy"]) for run in mrpc["runs"]] == [(81.0, 70.0), (82.0, 70.0),
                                                                     (83.0, 70.0)]


def test_markdown_glue_row_shows_median_spread_and_average(written):
    text = written[1]
    # RTE median 52.5 (51.0-55.0); MRPC median F1 82.0 / acc 70.0 (81.0-83.0); Avg (52.5 + 82.0) / 2
    assert "| bert_a_tiny | 52.5 (51.0–55.0) | 82.0/70.0 (81.0–83.0) | 67.2 |" in text


def test_margin_below_the_unigram_baseline_is_reported(written):
    report = written[0]
    assert report["baseline"]["margins"] == {"bert_a_tiny": 0.5, "tupe_r_tiny": 1.5}
    assert report["baseline"]["discriminative"] is True


def test_study_close_to_the_unigram_baseline_is_flagged(study, tmp_path):
    config, jobs, outcome, _ = study
    config = copy.deepcopy(config)
    config["report"]["min_margin_bits"] = 2.0
    paths = write_report(config, jobs, outcome, tmp_path)
    assert json.loads(Path(paths["json"]).read_text())["baseline"]["discriminative"] is False
    assert ("**Not yet discriminative**: the best model is only 1.500 bits below"
            in Path(paths["md"]).read_text())


def test_squad_scores_are_the_last_evaluation_line(written):
    report, text, _ = written
    squad = report["archs"]["tupe_r_tiny"]["squad"]
    assert {key: squad[key] for key in ("exact_match", "f1", "questions", "predicted")} == {
        "exact_match": 12.5, "f1": 20.25, "questions": 247, "predicted": 113}
    assert squad["std"] == {"exact_match": None, "f1": None} and len(squad["runs"]) == 1
    assert "| tupe_r_tiny | 12.5 | 20.2 | 113 / 247 |" in text and "every 5th article is dev" in text


@pytest.mark.parametrize("dev_every, words", [(2, "every 2nd article"), (3, "every 3rd article"),
                                               (11, "every 11th article"), (22, "every 22nd article")])
def test_squad_split_is_described_in_words(study, tmp_path, dev_every, words):
    config, jobs, outcome, _ = study
    config = copy.deepcopy(config)
    config["squad"]["dev_every"] = dev_every
    text = Path(write_report(config, jobs, outcome, tmp_path)["md"]).read_text()
    assert f"{words} is dev, the others train" in text


def test_squad_v2_scores_are_read_from_the_official_v2_keys(tmp_path):
    from tupe_plugin.study.results import squad_result

    log = tmp_path / "log.txt"
    log.write_text('{"exact": 40.5, "f1": 45.25, "total": 247, "HasAns_exact": 40.5, "HasAns_f1": 45.25, '
                   '"HasAns_total": 247}\n', encoding="utf-8")
    assert squad_result(str(log)) == {"exact_match": 40.5, "f1": 45.25}


def test_property_metrics_of_each_arch_are_side_by_side(written):
    text = written[1]
    assert "| absolute_position_dot_products: learned APE | bert_a_tiny | 0.250 | 0.500 | 0.400 |" in text
    assert "| absolute_position_dot_products: learned APE | tupe_r_tiny | 0.750 | 0.500 | 0.400 |" in text


def test_figures_are_written_and_linked(written):
    _, text, paths = written
    for name in ("pretrain_valid_loss.png", "analysis_absolute_position_dot_products.png"):
        assert os.path.isfile(os.path.join(paths["figures"], name))
        assert f"](figures/{name})" in text


def test_analysis_figure_is_drawn_from_every_archs_numbers_with_its_caption(written):
    report, text, _ = written
    path, caption = report["figures"]["analysis"]["absolute_position_dot_products"]
    assert caption.startswith("one diverging colour scale shared by the 2 heatmaps of the 2 models")
    assert f"*absolute_position_dot_products*: {caption}" in text


def test_failed_job_leaves_its_cells_empty_and_names_its_log(study, tmp_path):
    config, jobs, outcome, _ = study
    failed = (FAILED, "exit status 1; log: somewhere")
    outcome = {**outcome, "glue/tupe_r_tiny/seed1/RTE/lr2e-05/seed2": failed}
    report = json.loads(Path(write_report(config, jobs, outcome, tmp_path)["json"]).read_text())
    assert [run["seed"] for run in report["archs"]["tupe_r_tiny"]["glue"]["RTE"]["runs"]] == [1, 3]
    assert report["jobs"]["glue/tupe_r_tiny/seed1/RTE/lr2e-05/seed2"]["status"] == FAILED


def test_commands_behind_every_number_are_in_the_report(written):
    text = written[1]
    assert "-m tupe_plugin.glue.finetune RTE" in text and "--seed 2" in text
    assert "fairseq-train" in text and "--arch tupe_r_tiny" in text


def test_report_json_holds_every_jobs_commands_and_log(study, written):
    jobs, report = study[1], written[0]
    assert len(report["jobs"]) == len(jobs)
    for job in jobs:
        assert report["jobs"][job.name]["commands"] == [shlex.join(argv) for argv in job.commands]
        assert report["jobs"][job.name]["log"] == os.path.join(job.folder, job.log)


def test_interrupted_study_writes_the_report_of_the_finished_jobs(tmp_path, monkeypatch):
    from tupe_plugin.study import cli

    def run_data_then_interrupt(jobs, launcher):
        finish(jobs[0], 2.0, {})  # the data job finishes, then Ctrl-C
        for output in jobs[0].outputs:
            os.makedirs(os.path.dirname(output), exist_ok=True)
            open(output, "w").close()
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_jobs", run_data_then_interrupt)
    monkeypatch.setattr(cli.signal, "signal", lambda *args: None)
    config = tmp_path / "study.yaml"
    config.write_text("archs: [bert_a_tiny]\n", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        cli.main([str(config), "--out", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["jobs"]["data"]["status"] == DONE
    assert report["jobs"]["pretrain/bert_a_tiny/seed1"]["status"] == "not run"
    assert report["archs"]["bert_a_tiny"]["valid_loss"] is None


STS_B = {"bert_a_tiny": {1: ["nan", 50.0, 40.0], 2: ["nan", "nan"], 3: [60.0]},
         "tupe_r_tiny": {1: ["nan"], 2: ["nan"], 3: ["nan", "nan"]}}


def sts_b_line(update, value):
    return valid_line(update, loss=0.1, pearson=value, spearman=value, pearson_and_spearman=value)


@pytest.fixture(scope="module")
def sts_b_study(tmp_path_factory):
    """STS-B runs whose evaluations gave nan (the correlations of constant predictions): first, or all."""
    tmp_path = tmp_path_factory.mktemp("sts-b")
    config = check_config({"archs": ARCHS, "glue": {"dir": test_data("glue"), "tasks": ["STS-B"]}},
                          set(ARCHS))
    jobs = build_jobs(config, tmp_path / "out")
    outcome = {}
    for job in jobs:
        if job.kind == "glue":
            values = STS_B[job.model.arch][job.settings["seed"]]
            finish(job, 10.0, {"run/train.log": "".join(sts_b_line(u, v) for u, v in enumerate(values, 1))})
            outcome[job.name] = (DONE, "")
    paths = write_report(config, jobs, outcome, tmp_path / "out")
    with open(paths["json"], encoding="utf-8") as f, open(paths["md"], encoding="utf-8") as g:
        return json.load(f), g.read()


def test_nan_first_evaluation_then_scores_gives_the_best_score(sts_b_study):
    runs = sts_b_study[0]["archs"]["bert_a_tiny"]["glue"]["STS-B"]["runs"]
    assert (runs[0]["score"], runs[0]["pearson"], runs[0]["nan_evaluations"]) == (50.0, 50.0, 1)


def test_run_whose_every_evaluation_gave_nan_is_a_failed_run_left_out_of_the_median(sts_b_study):
    report, text = sts_b_study
    sts_b = report["archs"]["bert_a_tiny"]["glue"]["STS-B"]
    assert (sts_b["median"], sts_b["min"], sts_b["max"], sts_b["failed"]) == (55.0, 50.0, 60.0, [2])
    job = report["jobs"]["glue/bert_a_tiny/seed1/STS-B/lr2e-05/seed2"]
    assert job["status"] == FAILED
    assert job["note"].startswith("2 of 2 evaluations of pearson_and_spearman gave nan")
    assert report["jobs"]["glue/bert_a_tiny/seed1/STS-B/lr2e-05/seed1"]["status"] == DONE
    assert "| bert_a_tiny | 55.0/55.0 (50.0–60.0), 1 failed | 55.0 |" in text
    assert "| tupe_r_tiny | –, 3 failed | – |" in text
    assert "`glue/bert_a_tiny/seed1/STS-B/lr2e-05/seed2`: failed (2 of 2 evaluations" in text
    assert "nan/nan" not in text


def test_glue_medians_do_not_depend_on_the_order_of_the_runs(tmp_path):
    from itertools import permutations

    from tupe_plugin.study.results import glue_run, glue_task

    runs = []
    for seed, values in {1: ["nan", 50.0], 2: ["nan"], 3: [70.0, "nan"], 4: [40.0]}.items():
        log = tmp_path / f"seed{seed}.log"
        log.write_text("".join(sts_b_line(u, v) for u, v in enumerate(values, 1)), encoding="utf-8")
        runs.append(glue_run(str(log), "STS-B", seed))
    results = [glue_task(list(order), "STS-B") for order in permutations(runs)]
    assert all(result == results[0] for result in results)
    assert (results[0]["median"], results[0]["failed"]) == (50.0, [2])


def test_study_with_a_failed_glue_run_exits_with_1_and_names_it(tmp_path, monkeypatch, capsys):
    from tupe_plugin.study import cli

    def run_jobs_with_a_nan_run(jobs, launcher):
        for job in jobs:
            files = {"unigram": {"unigram.json": json.dumps({"bits_per_token": 8.0})},
                     "pretrain": {"train.log": valid_line(2, loss=7.0)},
                     "glue": {"run/train.log": sts_b_line(1, "nan")}}.get(job.kind, {})
            finish(job, 1.0, files)
        return {job.name: (DONE, "") for job in jobs}

    monkeypatch.setattr(cli, "run_jobs", run_jobs_with_a_nan_run)
    monkeypatch.setattr(cli.signal, "signal", lambda *args: None)
    config = tmp_path / "study.yaml"
    config.write_text(f"archs: [bert_a_tiny]\nanalysis: false\nglue: {{dir: {test_data('glue')}, "
                      "tasks: [STS-B], seeds: [1]}\n", encoding="utf-8")
    assert cli.main([str(config), "--out", str(tmp_path / "out")]) == 1
    assert ("tupe-study: glue/bert_a_tiny/seed1/STS-B/lr2e-05/seed1: failed: 1 of 1 evaluations of "
            "pearson_and_spearman "
            "gave nan") in capsys.readouterr().err


# validation losses of three pre-training seeds; RoPE minus BERT-A per seed: -0.5, -0.7, -0.2
SEED_LOSSES = {"bert_a_tiny": {1: 6.0, 2: 6.4, 3: 5.8}, "bert_rope_tiny": {1: 5.5, 2: 5.7, 3: 5.6}}


@pytest.fixture(scope="module")
def seeds_study(tmp_path_factory):
    """Two archs, three pre-training seeds, extrapolation to 64 and 256 tokens (trained at 64)."""
    tmp_path = tmp_path_factory.mktemp("seeds")
    ntk = {"scaling": "ntk", "factor": 4}
    config = check_config({"archs": list(SEED_LOSSES),
                           "pretrain": {"seeds": [1, 2, 3], "tokens_per_sample": 64},
                           "extrapolation": {"lengths": [64, 256], "rotary_scalings": [ntk]},
                           "analysis": False}, set(SEED_LOSSES))
    out = tmp_path / "out"
    jobs = {job.name: job for job in build_jobs(config, out)}
    finish(jobs["data"], 3.0, {})
    finish(jobs["unigram"], 1.0, {"unigram.json": json.dumps({"bits_per_token": 8.0})})
    for arch, losses in SEED_LOSSES.items():
        for seed, loss in losses.items():
            log = valid_line(2, loss=loss + 1) + valid_line(4, loss=loss)
            finish(jobs[f"pretrain/{arch}/seed{seed}"], 100.0 + seed, {"train.log": log})
            for length in (64, 256):
                learned = arch == "bert_a_tiny" and length > 64
                result = {"length": length, "max_positions": 64,
                          "loss": None if learned else loss + length / 64,
                          "reason": "table of 64 positions" if learned else None}
                finish(jobs[f"extrapolation/{arch}/seed{seed}/len{length}"], 1.0,
                       {"extrapolation.json": json.dumps(result)})
                rope = arch == "bert_rope_tiny"
                scaled = {**result, "loss": loss + 1 if rope else None,
                          "reason": None if rope else "no RoPE to scale"}
                finish(jobs[f"extrapolation/{arch}/seed{seed}/len{length}-ntk4"], 1.0,
                       {"extrapolation.json": json.dumps(scaled)})
    paths = write_report(config, list(jobs.values()), {name: (DONE, "") for name in jobs}, out)
    with open(paths["json"], encoding="utf-8") as f, open(paths["md"], encoding="utf-8") as g:
        return json.load(f), g.read(), paths


def test_valid_loss_over_pretraining_seeds_is_mean_std_min_max(seeds_study):
    loss = seeds_study[0]["archs"]["bert_a_tiny"]["valid_loss"]
    assert loss["n"] == 3 and loss["mean"] == pytest.approx(18.2 / 3)
    assert loss["std"] == pytest.approx(np.std([6.0, 6.4, 5.8], ddof=1))
    assert (loss["min"], loss["max"]) == (5.8, 6.4)
    assert seeds_study[0]["archs"]["bert_a_tiny"]["seeds"]["2"]["valid_loss"] == 6.4


def test_difference_from_the_reference_has_the_paired_t_interval_of_a_hand_computation(seeds_study):
    versus = seeds_study[0]["archs"]["bert_rope_tiny"]["versus_reference"]
    diffs = [-0.5, -0.7, -0.2]
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    half = 4.302652729749464 * sd / 3 ** 0.5  # Student t, 0.975 quantile, 2 degrees of freedom
    assert versus["mean_diff"] == pytest.approx(mean)
    assert versus["ci95"] == pytest.approx([mean - half, mean + half])
    assert versus["significant"] is False and "paired t" in versus["method"]
    assert seeds_study[0]["archs"]["bert_a_tiny"]["versus_reference"] is None


def test_a_learned_table_beyond_its_length_is_reported_not_applicable_with_the_reason(seeds_study):
    report, text, _ = seeds_study
    assert report["archs"]["bert_a_tiny"]["extrapolation"]["256"] == {
        "loss": None, "std": None, "reason": "table of 64 positions"}
    rope = report["archs"]["bert_rope_tiny"]["extrapolation"]["256"]
    assert rope["loss"] == pytest.approx(5.6 + 4) and rope["reason"] is None
    assert "| bert_a_tiny | 7.067 ± 0.306 | n/a: table of 64 positions |" in text


def test_loss_curve_of_several_seeds_is_their_mean_with_a_band(seeds_study):
    entry = seeds_study[0]["archs"]["bert_rope_tiny"]
    assert entry["valid_loss_curve"] == [[2, pytest.approx(6.6)], [4, pytest.approx(5.6)]]
    assert entry["valid_loss_band"] == [[2, 6.5, 6.7], [4, 5.5, 5.7]]
    assert os.path.isfile(seeds_study[2]["figures"] + "/extrapolation.png")


@pytest.fixture(scope="module")
def along_study(tmp_path_factory):
    """One arch, two pre-training seeds, RTE fine-tuned from the checkpoint of update 2 and the last (4)."""
    tmp_path = tmp_path_factory.mktemp("along")
    config = check_config({"archs": ["tupe_r_tiny"], "analysis": False,
                           "pretrain": {"seeds": [1, 2], "updates": 4, "validate_every": 2,
                                        "evaluate_at": [2]},
                           "glue": {"dir": test_data("glue"), "tasks": ["RTE"], "seeds": [1]}},
                          {"tupe_r_tiny"})
    out = tmp_path / "out"
    jobs = {job.name: job for job in build_jobs(config, out)}
    for name in ("data", "unigram"):
        finish(jobs[name], 1.0, {"unigram.json": json.dumps({"bits_per_token": 8.0})})
    for seed in (1, 2):
        finish(jobs[f"pretrain/tupe_r_tiny/seed{seed}"], 10.0,
               {"train.log": valid_line(2, loss=7.0 + seed) + valid_line(4, loss=5.0 + seed)})
        for at, accuracy in (("/at2", 50.0), ("", 60.0)):
            finish(jobs[f"glue/tupe_r_tiny/seed{seed}{at}/RTE/lr2e-05/seed1"], 1.0,
                   {"run/train.log": valid_line(1, loss=1.0, accuracy=accuracy + seed)})
    paths = write_report(config, list(jobs.values()), {name: (DONE, "") for name in jobs}, out)
    with open(paths["json"], encoding="utf-8") as f, open(paths["md"], encoding="utf-8") as g:
        return json.load(f), g.read(), paths


def test_scores_along_pretraining_come_from_the_kept_checkpoints(along_study):
    along = along_study[0]["archs"]["tupe_r_tiny"]["along_pretraining"]
    assert list(along) == ["2", "4"]
    assert along["2"]["valid_loss"]["mean"] == pytest.approx(8.5) and along["4"]["valid_loss"]["mean"] == 6.5
    assert along["2"]["glue"]["RTE"]["median"] == 51.5 and along["4"]["glue"]["RTE"]["median"] == 61.5
    assert "| tupe_r_tiny | RTE | 51.5 | 61.5 |" in along_study[1]
    assert os.path.isfile(along_study[2]["figures"] + "/along_pretraining.png")


def test_the_checkpoint_whose_glue_average_first_reaches_the_references_final_one(along_study):
    reached = along_study[0]["archs"]["tupe_r_tiny"]["glue_convergence"]
    assert reached["target"] == 61.5 and reached["averages"] == {"2": 51.5, "4": 61.5}
    assert (reached["checkpoint"], reached["fraction"]) == (4, 1.0)
    assert "first reaches tupe_r_tiny's final one (61.5; fraction of the 4 updates): tupe_r_tiny 4 (1.00)." \
        in along_study[1]


@pytest.fixture(scope="module")
def lr_grid_study(tmp_path_factory):
    """RTE and WNLI with two learning rates, three fine-tuning seeds, scored by the last evaluation."""
    tmp_path = tmp_path_factory.mktemp("lrs")
    glue_dir = tmp_path / "glue"
    shutil.copytree(test_data("glue", "RTE"), glue_dir / "RTE")
    shutil.copytree(test_data("glue", "RTE"), glue_dir / "WNLI")  # the same layout; only the names are read
    config = check_config({"archs": ["tupe_r_tiny"], "analysis": False,
                           "glue": {"dir": str(glue_dir), "tasks": ["RTE", "WNLI"], "seeds": [1, 2, 3],
                                    "lrs": [1e-5, 3e-5], "checkpoint": "last"}}, {"tupe_r_tiny"})
    out = tmp_path / "out"
    jobs = {job.name: job for job in build_jobs(config, out)}
    for name in ("data", "unigram", "pretrain/tupe_r_tiny/seed1"):
        finish(jobs[name], 1.0, {"unigram.json": json.dumps({"bits_per_token": 8.0}),
                                 "train.log": valid_line(2, loss=5.0)})
    # 1e-5: medians 60 (RTE), 40 (WNLI); 3e-5: 55 with a higher mean (an outlier), 45; the best of each
    # run is 10 points above its last evaluation, which is the score
    scores = {(1e-5, "RTE"): [58.0, 60.0, 61.0], (3e-5, "RTE"): [50.0, 55.0, 90.0],
              (1e-5, "WNLI"): [40.0, 40.0, 40.0], (3e-5, "WNLI"): [45.0, 45.0, 45.0]}
    for (lr, task), values in scores.items():
        for seed, value in zip((1, 2, 3), values):
            log = valid_line(1, loss=1.0, accuracy=value + 10) + valid_line(2, loss=1.0, accuracy=value)
            finish(jobs[f"glue/tupe_r_tiny/seed1/{task}/lr{lr}/seed{seed}"], 1.0, {"run/train.log": log})
    paths = write_report(config, list(jobs.values()), {name: (DONE, "") for name in jobs}, out)
    with open(paths["json"], encoding="utf-8") as f, open(paths["md"], encoding="utf-8") as g:
        return json.load(f), g.read()


def test_each_tasks_learning_rate_is_the_one_with_the_best_median_over_seeds(lr_grid_study):
    rte = lr_grid_study[0]["archs"]["tupe_r_tiny"]["seeds"]["1"]["glue"]["RTE"]
    assert rte["lr"] == 1e-5 and rte["median"] == 60.0 and rte["select"] == "median"
    assert rte["by_lr"]["3e-05"]["median"] == 55.0 and rte["by_lr"]["3e-05"]["mean"] == 65.0
    assert lr_grid_study[0]["archs"]["tupe_r_tiny"]["seeds"]["1"]["glue"]["WNLI"]["lr"] == 3e-5


def test_the_last_evaluation_is_the_score_when_glue_checkpoint_is_last(lr_grid_study):
    runs = lr_grid_study[0]["archs"]["tupe_r_tiny"]["glue"]["RTE"]["runs"]
    assert sorted(run["score"] for run in runs) == [58.0, 60.0, 61.0]


def test_wnli_is_left_out_of_the_glue_average(lr_grid_study):
    text = lr_grid_study[1]
    assert "WNLI left out as in the papers" in text
    assert "| tupe_r_tiny | 60.0 (58.0–61.0), lr 1e-05 | 45.0 (45.0–45.0), lr 3e-05 | 60.0 |" in text


def test_a_staged_pretraining_curve_counts_updates_over_all_stages(tmp_path):
    config = check_config({"archs": ["tupe_r_tiny"], "analysis": False, "pretrain": {"stages": [
        {"tokens_per_sample": 64, "updates": 4}, {"tokens_per_sample": 128, "updates": 2}]}}, {"tupe_r_tiny"})
    jobs = {job.name: job for job in build_jobs(config, tmp_path / "out")}
    first, second = (" ".join(command) for command in jobs["pretrain/tupe_r_tiny/seed1"].commands)
    log = (f"$ {first}\n" + valid_line(2, loss=9.0) + valid_line(4, loss=8.0)
           + f"$ {second}\n" + valid_line(2, loss=7.5))  # the second stage counts from 0 again
    for name in ("data", "unigram"):
        finish(jobs[name], 1.0, {"unigram.json": json.dumps({"bits_per_token": 10.0})})
    finish(jobs["pretrain/tupe_r_tiny/seed1"], 1.0, {"train.log": log})
    paths = write_report(config, list(jobs.values()), {name: (DONE, "") for name in jobs}, tmp_path / "out")
    with open(paths["json"], encoding="utf-8") as f:
        entry = json.load(f)["archs"]["tupe_r_tiny"]
    assert entry["valid_loss_curve"] == [[2, 9.0], [4, 8.0], [6, 7.5]]
    assert entry["along_pretraining"]["4"]["valid_loss"] == 8.0


def test_two_squad_versions_and_seeds_give_mean_and_std_per_version(tmp_path):
    squad_dir = tmp_path / "squad"
    squad_dir.mkdir()
    for version in ("1.1", "2.0"):
        shutil.copy(test_data("squad", "dev-v1.1.head.json"), squad_dir / f"dev-v{version}.json")
    config = check_config({"archs": ["tupe_r_tiny"], "analysis": False,
                           "squad": {"versions": ["1.1", "2.0"], "seeds": [1, 2],
                                     "dev": str(squad_dir / "dev-v{version}.json")}}, {"tupe_r_tiny"})
    jobs = {job.name: job for job in build_jobs(config, tmp_path / "out")}
    for name in ("data", "unigram", "squad-data/v1.1", "squad-data/v2.0", "pretrain/tupe_r_tiny/seed1"):
        finish(jobs[name], 1.0, {"unigram.json": json.dumps({"bits_per_token": 8.0}),
                                 "train.log": valid_line(2, loss=5.0)})
    for version, key in (("1.1", "exact_match"), ("2.0", "exact")):
        for seed, em in ((1, 40.0), (2, 50.0)):
            finish(jobs[f"squad/tupe_r_tiny/seed1/v{version}/seed{seed}"], 1.0,
                   {"log.txt": json.dumps({key: em, "f1": em + 10}) + "\n"})
    paths = write_report(config, list(jobs.values()), {name: (DONE, "") for name in jobs}, tmp_path / "out")
    with open(paths["json"], encoding="utf-8") as f, open(paths["md"], encoding="utf-8") as g:
        squad, text = json.load(f)["archs"]["tupe_r_tiny"]["squad"], g.read()
    assert set(squad) == {"1.1", "2.0"} and squad["2.0"]["exact_match"] == 45.0
    assert squad["1.1"]["std"]["f1"] == pytest.approx(7.0710678)
    assert "| tupe_r_tiny | 45.0 ± 7.1 | 55.0 ± 7.1 | 45.0 ± 7.1 | 55.0 ± 7.1 | – |" in text


def test_several_squad_versions_need_a_path_with_the_version(tmp_path):
    from tupe_plugin.study.config import StudyConfigError

    with pytest.raises(StudyConfigError, match=r"key 'squad.dev': names one file for the versions"):
        check_config({"archs": ["tupe_r_tiny"], "squad": {"versions": ["1.1", "2.0"],
                                                          "dev": test_data("squad", "dev-v1.1.head.json")}},
                     {"tupe_r_tiny"})


def test_a_rope_scaling_is_a_row_of_its_own_and_models_without_rope_say_why(seeds_study):
    report, text, _ = seeds_study
    assert report["archs"]["bert_rope_tiny"]["extrapolation_scaled"]["ntk x4"]["256"]["loss"] == \
        pytest.approx(6.6)
    unscaled = report["archs"]["bert_a_tiny"]["extrapolation_scaled"]["ntk x4"]["256"]
    assert unscaled["reason"] == "no RoPE to scale"
    assert "| bert_rope_tiny (ntk x4) | 6.600 ± 0.100 | 6.600 ± 0.100 |" in text
    assert "bert_a_tiny (ntk x4)" not in text
