"""docs/study-tiny.md, the report of one run of examples/study-tiny-seeds.yaml: its tables and figures, and
one job of each kind with the commands the study builds for that config today (the commands of every job
are in the run's report.json)."""

import os
import re
import shlex

import pytest
from conftest import REPO

from tupe_plugin.study.cli import known_archs
from tupe_plugin.study.config import load_config
from tupe_plugin.study.jobs import Tools, build_jobs

PAGE = os.path.join(REPO, "docs", "study-tiny.md")
CONFIG = os.path.join(REPO, "examples", "study-tiny-seeds.yaml")
STUDY_DIR = "study-tiny-seeds"  # the page's paths are those of STUDY_DIR=study-tiny-seeds
JOB = re.compile(r"^- `([^`]+)`: [^\n]*\n\n  ```bash\n(.*?)\n  ```$", re.M | re.S)


def shown_jobs():
    """{job name: [argv, ...]} of the jobs the page shows."""
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    return {name: [shlex.split(line) for line in block.splitlines()] for name, block in JOB.findall(text)}


def same_tool(argv):
    """``argv`` with its program named without its folder (the page's .venv/bin, this environment's)."""
    return [os.path.basename(argv[0])] + argv[1:]


@pytest.fixture(scope="module")
def built_jobs():
    """{job name: [argv, ...]} of every job the config makes today, its paths relative to the repository."""
    config = load_config(CONFIG, known_archs())
    jobs = build_jobs(config, os.path.join(REPO, STUDY_DIR), Tools(python="python"))
    return {job.name: [[word.replace(REPO + os.sep, "") for word in argv] for argv in job.commands]
            for job in jobs}


def test_commands_shown_are_those_the_study_builds_today(built_jobs):
    for name, commands in shown_jobs().items():
        assert name in built_jobs, f"docs/study-tiny.md shows {name}, a job the config no longer makes"
        assert [same_tool(argv) for argv in commands] == [same_tool(argv) for argv in built_jobs[name]], (
            f"docs/study-tiny.md: the commands of {name} are not those the study builds today")


def test_one_job_of_each_kind_is_shown(built_jobs):
    def kind(name):
        return name.split("/")[0]

    assert sorted(kind(name) for name in shown_jobs()) == sorted({kind(name) for name in built_jobs})


def test_page_leaves_the_list_of_every_job_to_the_runs_report_json():
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    assert f"`{STUDY_DIR}/report.json` under `jobs`" in text
    assert len(text.splitlines()) <= 250, "docs/study-tiny.md lists more than one job of each kind"
