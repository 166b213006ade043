"""Where jobs run: here, one after the other (``local``), or as SLURM jobs through submitit.

Both run a job the same way, :func:`run_commands`: its commands one after the other in the job's
folder, their output appended to the job's log. A launcher offers ``submit(job)`` and
``poll(handle)`` (None while running, else ``(exit status, error)``) and says how many jobs may
run at once (``capacity``; None: no limit, the scheduler decides).

Jobs that run at the same time on this machine (submitit's ``cluster: local``) share its cores:
each gets ``OMP_NUM_THREADS`` = cores // jobs at once, unless the study's environment sets it.
Two 2-thread trainings on 2 cores ran 50 times slower than one (26 -> 0.5 updates/s).
"""

import os
import shlex
import signal
import subprocess

from ..cli.child_processes import ended_with_parent
from ..cli.extras import require
from . import state
from .config import StudyConfigError


def run_commands(commands, env, log_path):
    """Run ``commands`` (argv lists) in order in the folder of ``log_path``, output appended to it; the
    exit status.

    Interrupting it (Ctrl-C, SIGTERM turned into SystemExit) sends SIGTERM to the running command's
    process group; killing it (SIGKILL) ends the running command, and the job's record names the
    process group so that a rerun stops what may be left of it.

    Under SLURM every task of a multi-task job runs this; tasks other than the first log to
    ``LOG.rankN`` so that they do not interleave with it.
    """
    cwd = os.path.dirname(os.path.abspath(log_path))
    rank = os.environ.get("SLURM_PROCID", "0")
    if rank != "0":
        log_path = f"{log_path}.rank{rank}"
    with open(log_path, "a", encoding="utf-8") as log:
        for argv in commands:
            log.write(f"$ {shlex.join(argv)}\n")
            log.flush()
            # Its own process group: an interrupted study stops the command and what it started
            # (the fine-tuning tools' fairseq-train), not only the command.
            proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=log,
                                    stderr=subprocess.STDOUT, process_group=0,
                                    preexec_fn=ended_with_parent())
            if rank == "0":
                state.record_process(cwd, proc.pid)
            try:
                returncode = proc.wait()
            except BaseException:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
                raise
            if returncode != 0:
                log.write(f"exit status {returncode}\n")
                return returncode
    return 0


def available_cores():
    """The CPU cores this process may run on (what ``nproc`` prints)."""
    return len(os.sched_getaffinity(0))


def job_threads(cores, concurrent_jobs, environ):
    """``OMP_NUM_THREADS`` of each of ``concurrent_jobs`` jobs sharing ``cores``: cores // jobs, at
    least 1; None when ``environ`` sets it already (the user's choice stands)."""
    if "OMP_NUM_THREADS" in environ:
        return None
    return str(max(1, cores // concurrent_jobs))


class LocalLauncher:
    """Runs each job here, to its end, before the next (with all the cores: nothing to share)."""

    capacity = 1

    def submit(self, job):
        return run_commands(job.commands, {}, os.path.join(job.folder, job.log)), ""

    def poll(self, handle):
        return handle


class SubmititLauncher:
    """Submits each job through ``submitit.AutoExecutor`` (SLURM; ``cluster: local`` for tests).

    ``params`` are the ``launcher`` section of the config: ``cluster``, executor parameters for
    every job (``timeout_min``, ``slurm_partition``, ``gpus_per_node``, ...) and ``pretrain``,
    parameters that override them for the pre-training jobs (e.g. ``tasks_per_node: 8,
    gpus_per_node: 8`` for one 8-GPU fairseq DDP job per architecture).
    """

    def __init__(self, params, folder):
        require("submitit", "study", "the submitit launcher")
        import submitit

        params = dict(params)
        params.pop("name")
        cluster = params.pop("cluster")
        pretrain_only = params.pop("pretrain")
        pretrain = {**params, **pretrain_only}
        # cluster "local" runs the jobs as processes of this machine: one per core at most, so that
        # each has a core of its own. SLURM places its jobs itself; "debug" runs one at a time.
        self.capacity = available_cores() if cluster == "local" else None
        self.threads = job_threads(self.capacity, self.capacity, os.environ) if self.capacity else None
        self.executors = {}
        for kind, kind_params in (("default", params), ("pretrain", pretrain)):
            executor = submitit.AutoExecutor(folder=os.path.join(folder, "%j"), cluster=cluster)
            try:
                executor.update_parameters(**kind_params)
            except (TypeError, ValueError, NameError) as error:
                key = "launcher.pretrain" if kind == "pretrain" else "launcher"
                raise StudyConfigError(f"key '{key}': submitit refuses the executor parameters: {error}")
            self.executors[kind] = executor

    def submit(self, job):
        executor = self.executors["pretrain" if job.kind == "pretrain" else "default"]
        executor.update_parameters(name=job.name.replace("/", "-"))
        env = {} if self.threads is None else {"OMP_NUM_THREADS": self.threads}
        return executor.submit(run_commands, job.commands, env, os.path.join(job.folder, job.log))

    def poll(self, handle):
        if not handle.done():
            return None
        try:
            return handle.result(), ""
        except Exception as error:  # submitit re-raises the job's failure or the scheduler's
            return 1, f"submitit job {handle.job_id}: {error}"


def pretrain_processes(launcher_config):
    """Processes of one pre-training job: nodes x tasks_per_node of its executor parameters."""
    if launcher_config["name"] != "submitit":
        return 1
    params = {**launcher_config, **launcher_config.get("pretrain", {})}
    return int(params.get("nodes", 1)) * int(params.get("tasks_per_node", 1))


def uses_gpu(launcher_config):
    """Whether the submitit parameters ask for GPUs."""
    params = {**launcher_config, **launcher_config.get("pretrain", {})}
    return launcher_config["name"] == "submitit" and int(params.get("gpus_per_node", 0)) > 0


def make_launcher(launcher_config, out):
    if launcher_config["name"] == "local":
        return LocalLauncher()
    return SubmititLauncher(launcher_config, os.path.join(out, "submitit"))
