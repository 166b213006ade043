"""tupe_plugin.cli.fairseq_logs: the fields of fairseq-train's log lines and the nan policy of evaluations."""

import pytest

from tupe_plugin.cli.fairseq_logs import evaluations, train_inner_lines, valid_lines

VALID = "2026-01-01 00:00:00 | INFO | valid | epoch 00{0} | valid on 'valid' subset | loss 0.7 | mcc {1} | " \
        "num_updates {0}\n"
INNER = "2026-01-01 00:00:00 | INFO | train_inner | epoch 001:      2 / 62 loss=9.1, wps=1500.5, ups=0.5\n"


def log(tmp_path, values, extra=""):
    path = tmp_path / "train.log"
    path.write_text(extra + "".join(VALID.format(i, v) for i, v in enumerate(values, 1)), encoding="utf-8")
    return str(path)


def test_fields_of_validation_and_train_inner_lines_are_numbers(tmp_path):
    path = log(tmp_path, [0.25], extra=INNER)
    assert valid_lines(path) == [{"loss": 0.7, "mcc": 0.25, "num_updates": 1.0}]
    assert train_inner_lines(path) == [{"loss": 9.1, "wps": 1500.5, "ups": 0.5}]


@pytest.mark.parametrize("values", [["nan", 0.5, 0.3], [0.3, "nan", 0.5], [0.5, 0.3, "nan"]])
def test_nan_evaluations_are_skipped_wherever_they_are(tmp_path, values):
    found = evaluations(log(tmp_path, values), "mcc")
    assert (found.score, found.best["num_updates"], found.count, found.nan_count, found.failed) == (
        0.5, values.index(0.5) + 1, 3, 1, False)


def test_run_whose_every_evaluation_is_nan_is_failed(tmp_path):
    found = evaluations(log(tmp_path, ["nan", "nan"]), "mcc")
    assert found.failed and found.score is None
    assert found.nan_summary() == "2 of 2 evaluations of mcc gave nan"


def test_first_of_equal_best_evaluations_counts(tmp_path):
    assert evaluations(log(tmp_path, [0.1, 0.5, 0.5]), "mcc").best["num_updates"] == 2


def test_log_without_the_metric_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no validation line reports accuracy"):
        evaluations(log(tmp_path, [0.5]), "accuracy")
