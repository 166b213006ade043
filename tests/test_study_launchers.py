"""The study's launchers: submitit executor parameters, what a pre-training job asks for, and how an
interrupted job is stopped."""

import signal
import subprocess
import sys
import time

import pytest

from tupe_plugin.study import state
from tupe_plugin.study.config import StudyConfigError
from tupe_plugin.study.jobs import Job
from tupe_plugin.study.launchers import (SubmititLauncher, available_cores, job_threads, pretrain_processes,
                                         run_commands, uses_gpu)

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


@pytest.mark.parametrize("cores, jobs, threads", [(2, 2, "1"), (16, 4, "4"), (8, 3, "2"), (2, 5, "1"),
                                                  (8, 1, "8")])
def test_concurrent_jobs_share_the_cores(cores, jobs, threads):
    assert job_threads(cores, jobs, {}) == threads


def test_omp_num_threads_of_the_user_is_kept():
    assert job_threads(2, 2, {"OMP_NUM_THREADS": "2"}) is None


def submitted_env(launcher, monkeypatch):
    """The environment ``launcher`` hands a job's commands."""
    calls = []
    monkeypatch.setattr(launcher.executors["default"], "submit", lambda *args: calls.append(args))
    job = Job(name="glue/x", kind="glue", folder="unused", commands=[["true"]])
    launcher.submit(job)
    return calls[0][2]


def test_local_cluster_runs_a_job_per_core_with_a_thread_each(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    launcher = SubmititLauncher({"name": "submitit", "cluster": "local", "pretrain": {}}, str(tmp_path))
    assert launcher.capacity == available_cores()
    assert submitted_env(launcher, monkeypatch) == {"OMP_NUM_THREADS": "1"}


def test_local_cluster_keeps_the_users_omp_num_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    launcher = SubmititLauncher({"name": "submitit", "cluster": "local", "pretrain": {}}, str(tmp_path))
    assert submitted_env(launcher, monkeypatch) == {}


def test_other_clusters_leave_the_threads_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    launcher = SubmititLauncher({"name": "submitit", "cluster": "debug", "pretrain": {}}, str(tmp_path))
    assert launcher.capacity is None and submitted_env(launcher, monkeypatch) == {}


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
    wait_until(lambda: not alive(pid), 10, f"the command's child {pid} outlived the interruption")


def wait_until(condition, seconds, failure):
    """Poll ``condition`` until it holds; fail with ``failure`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.1)


def alive(pid):
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_study_takes_its_running_command_with_it(tmp_path):
    pid_file = tmp_path / "command.pid"
    study = subprocess.Popen([sys.executable, "-c", (
        "import sys; from tupe_plugin.study.launchers import run_commands; "
        f"run_commands([['bash', '-c', 'echo $$ > {pid_file}; exec sleep 60']], {{}}, sys.argv[1])"),
        str(tmp_path / "log.txt")])
    wait_until(lambda: pid_file.is_file() and pid_file.read_text().strip(), 120, "the command never started")
    study.kill()  # SIGKILL: no handler of the study runs
    study.wait()
    pid = int(pid_file.read_text())
    wait_until(lambda: not alive(pid), 10, f"the command {pid} outlived its killed study")


def test_a_rerun_stops_what_a_killed_study_left_in_the_jobs_folder(tmp_path):
    job = Job(name="glue/x", kind="glue", folder=str(tmp_path / "glue" / "x"), commands=[["true"]])
    state.start(job, state.FRESH, None)
    left = subprocess.Popen(["sleep", "60"], cwd=job.folder, process_group=0)
    unrelated = subprocess.Popen(["sleep", "60"], cwd=job.folder)  # not of the job's process group
    try:
        state.record_process(job.folder, left.pid)
        record = state.read_record(job.folder)
        assert state.stop_left_running(job, record) == (f"stopped pid {left.pid}, left running in "
                                                        f"{job.folder} by a killed study")
        assert left.wait(timeout=10) == -signal.SIGTERM
        assert unrelated.poll() is None and state.stop_left_running(job, record) is None
    finally:
        unrelated.kill()
        left.kill()


def test_a_second_study_on_the_same_out_folder_is_refused(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from tupe_plugin.study import state; state.lock_study(sys.argv[1]); "
        "print('locked', flush=True); time.sleep(60)"), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        in_use = (rf"--out {tmp_path} is in use by another tupe-study \(pid {holder.pid} on .*\): wait "
                  "for it to end, or give this study another --out")
        with pytest.raises(state.StudyInUseError, match=in_use):
            state.lock_study(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    state.lock_study(str(tmp_path))  # the kernel released the killed holder's lock
