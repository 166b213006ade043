"""The table of GLUE tasks: the files each task reads, and the settings it gives examples/finetune_glue.sh."""

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


@pytest.mark.parametrize("task, lines", [
    ("STS-B", ["STS-B 10 pearson_and_spearman",
               "--num-classes 1 --best-checkpoint-metric pearson_and_spearman --report-pearson-and-spearman "
               "--regression-target"]),
    ("MNLI-mm", ["MNLI 5 accuracy", "--num-classes 3 --best-checkpoint-metric accuracy"]),
])
def test_shell_lines_give_folder_epochs_metric_and_fairseq_flags(task, lines, capsys):
    assert main([task]) == 0
    assert capsys.readouterr().out.splitlines() == lines


def test_unknown_task_is_refused_with_the_known_ones(capsys):
    assert main(["STSB"]) == 2
    assert "unknown GLUE task 'STSB' (known: CoLA, SST-2, MRPC, STS-B" in capsys.readouterr().err


def test_without_a_task_every_task_is_listed(capsys):
    assert main([]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list(GLUE_TASKS)
