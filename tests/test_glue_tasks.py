"""The table of GLUE tasks: the files each task reads, and the settings it gives tupe-finetune-glue."""

import os

import pytest

from conftest import test_data

from tupe_plugin.glue.tasks import GLUE_TASKS, main


@pytest.mark.parametrize("task", ["CoLA", "SST-2", "MRPC", "STS-B", "RTE"])
def test_task_files_are_those_of_the_glue_data(task):
    assert all(os.path.isfile(path) for path in GLUE_TASKS[task].files(test_data("glue")).values())


def test_mismatched_mnli_reads_the_mnli_folder():
    files = GLUE_TASKS["MNLI-mm"].files("glue_data")
    assert files == {"train": os.path.join("glue_data", "MNLI", "train.tsv"),
                     "valid": os.path.join("glue_data", "MNLI", "dev_mismatched.tsv")}


@pytest.mark.parametrize("task, flags", [
    ("STS-B", ["--num-classes", "1", "--best-checkpoint-metric", "pearson_and_spearman",
               "--report-pearson-and-spearman", "--regression-target"]),
    ("MNLI-mm", ["--num-classes", "3", "--best-checkpoint-metric", "accuracy"]),
])
def test_fairseq_flags_give_the_head_and_the_metric(task, flags):
    assert GLUE_TASKS[task].fairseq_train_args() == flags


def test_a_task_is_described_with_its_files_metric_and_epochs(capsys):
    assert main(["MNLI-mm"]) == 0
    assert capsys.readouterr().out == ("MNLI-mm  MNLI/train.tsv, MNLI/dev_mismatched.tsv; 3 classes; "
                                       "metric accuracy; 5 epochs\n")


def test_unknown_task_is_refused_with_the_known_ones(capsys):
    assert main(["STSB"]) == 2
    assert "unknown GLUE task 'STSB' (known: CoLA, SST-2, MRPC, STS-B" in capsys.readouterr().err


def test_without_a_task_every_task_is_listed(capsys):
    assert main([]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list(GLUE_TASKS)
