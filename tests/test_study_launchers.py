"""The study's launchers: submitit executor parameters, what a pre-training job asks for, and how an
interrupted job is stopped."""

import signal
import time

import pytest

from tupe_plugin.study.config import StudyConfigError
from tupe_plugin.study.launchers import SubmititLauncher, pretrain_processes, run_commands, uses_gpu

SUBMITIT = {"name": "submitit", "cluster": "local", "timeout_min": 5,
            "pretrain": {"timeout_min": 7, "tasks_per_node": 4, "nodes": 2, "gpus_per_node": 4}}


def test_pretraining_jobs_get_their_own_executor_parameters(tmp_path):
    config = {"name": "submitit", "cluster": "local", "timeout_min": 5, "pretrain": {"timeout_min": 7}}
    launcher = SubmititLauncher(config, str(tmp_path))
    assert launcher.executors["pretrain"]._executor.parameters["timeout_min"] == 7
    assert launcher.executors["default"]._executor.parameters == {"timeout_min": 5}


def test_local_executor_refusing_a_parameter_names_the_launcher_key(tmp_path):
    with pytest.raises(StudyConfigError, match="key 'launcher.pretrain': submitit refuses .* one node"):
        SubmititLauncher(SUBMITIT, str(tmp_path))


def test_pretraining_processes_are_nodes_times_tasks():
    assert pretrain_processes(SUBMITIT) == 8
    assert pretrain_processes({"name": "local"}) == 1


def test_gpus_in_the_submitit_parameters_mean_a_gpu_study():
    assert uses_gpu(SUBMITIT)
    assert not uses_gpu({"name": "submitit", "cluster": "slurm", "pretrain": {}})
    assert not uses_gpu({"name": "local"})


def test_interrupted_command_is_stopped_with_what_it_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_commands([["bash", "-c", script]], {}, str(tmp_path / "log.txt"))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, f"the command's child {pid} outlived the interruption"
        time.sleep(0.1)


def alive(pid):
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
