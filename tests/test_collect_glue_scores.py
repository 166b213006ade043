"""tupe-collect-glue treats a nan evaluation as failed: excluded, counted and reported; it reads GLUE runs
only."""

import json

import pytest

from tupe_plugin.glue import scores as collect_glue_scores

METRIC = "pearson_and_spearman"


def run_dir(tmp_path, seed, values, arch="bert_a_tiny", task="STS-B", lr="2e-5"):
    path = tmp_path / f"{task}-{arch}-lr{lr}-seed{seed}"
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"task": task, "arch": arch, "seed": seed, "metric": METRIC,
                                               "lr": lr}))
    (path / "train.log").write_text("".join(
        f"2024-01-01 | INFO | valid | epoch 00{i} | valid on 'valid' subset | loss 0.1 | {METRIC} {v} | "
        f"num_updates {i}\n" for i, v in enumerate(values, 1)))
    return str(path)


@pytest.mark.parametrize("values, best", [
    (["nan", "0.5", "0.4"], 0.5),   # nan first: max() made the run nan
    (["0.3", "nan", "0.6"], 0.6),   # nan in the middle
    (["0.7", "0.2", "nan"], 0.7),   # nan last
])
def test_nan_evaluations_are_left_out_of_the_best_value_and_counted(tmp_path, values, best):
    run = collect_glue_scores.read_run(run_dir(tmp_path, 1, values))
    assert run.score == best and (run.evaluations.count, run.evaluations.nan_count) == (3, 1)


def test_run_with_only_nan_evaluations_is_a_failed_run(tmp_path):
    run = collect_glue_scores.read_run(run_dir(tmp_path, 1, ["nan", "nan"]))
    assert run.score is None and run.evaluations.nan_count == 2


def test_failed_runs_are_excluded_from_the_mean_counted_in_the_cell_and_reported(tmp_path, capsys):
    dirs = [run_dir(tmp_path, 1, ["0.5"]), run_dir(tmp_path, 2, ["nan", "0.7"]),
            run_dir(tmp_path, 3, ["nan"])]
    collect_glue_scores.main(dirs)
    captured = capsys.readouterr()
    table = captured.out.splitlines()
    assert table[2] == "| bert_a_tiny | 0.6 ± 0.1 (2), 1 failed |"
    assert f"{dirs[1]}: 1 of 2 evaluations of {METRIC} gave nan (left out of the best value)" in captured.err
    assert f"{dirs[2]}: 1 of 1 evaluations of {METRIC} gave nan (every evaluation gave nan: failed run" \
        in captured.err


def test_arch_whose_every_run_failed_still_has_a_row(tmp_path, capsys):
    collect_glue_scores.main([run_dir(tmp_path, 1, ["nan"])])
    assert capsys.readouterr().out.splitlines()[2] == "| bert_a_tiny | –, 1 failed |"


def test_table_is_the_same_whatever_the_order_of_the_runs(tmp_path, capsys):
    runs = {1: ["nan", "0.5"], 2: ["nan"], 3: ["0.9"]}
    dirs = [run_dir(tmp_path, seed, values) for seed, values in runs.items()]
    tables = []
    for order in (dirs, dirs[::-1], dirs[1:] + dirs[:1]):
        collect_glue_scores.main(order)
        tables.append(capsys.readouterr().out)
    assert tables[0] == tables[1] == tables[2]
    assert tables[0].splitlines()[2] == "| bert_a_tiny | 0.7 ± 0.3 (2), 1 failed |"


def test_runs_of_different_learning_rates_are_rows_not_seeds(tmp_path, capsys):
    dirs = [run_dir(tmp_path, 1, ["0.5"], lr="1e-5"), run_dir(tmp_path, 2, ["0.7"], lr="1e-5"),
            run_dir(tmp_path, 1, ["0.9"], lr="3e-5")]
    collect_glue_scores.main(dirs)
    table = capsys.readouterr().out.splitlines()
    assert table[2:] == ["| bert_a_tiny (lr 1e-5) | 0.6 ± 0.1 (2) |", "| bert_a_tiny (lr 3e-5) | 0.9 (1) |"]


def test_a_run_of_another_task_than_glue_is_refused_naming_it(tmp_path):
    """tupe-finetune-squad records its runs in run.json too (the version, no metric)."""
    path = tmp_path / "squad"
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"task": "SQuAD v1.1", "arch": "bert_a_tiny", "seed": 1}))
    (path / "train.log").write_text("")
    with pytest.raises(SystemExit, match=f"{path / 'run.json'}: a run of SQuAD v1.1, not of a GLUE task "
                                         r"\(RUN_DIR must be a --save-dir of tupe-finetune-glue\)"):
        collect_glue_scores.main([str(path)])
