"""The study loop: run every job after its dependencies, skip what is done, keep going past failures.

A progress line at each job's start and end, and while jobs run: jobs done / total, elapsed time, an
estimate of the time left, and the job; a running job's line says its updates done / total and their
rate, read from its log (:mod:`.job_log`), at least every :data:`EVERY` seconds (rewritten in place
on a terminal). The time left weighs the jobs by their work: a job that trains takes its planned
tokens (updates x tokens per update) at the seconds per token measured on the jobs of its kind run so
far, else on the running job of its kind, else on any job that trained; a running job with a known
total takes its remaining updates at its own rate; a job whose work is not known ahead (data,
analysis, SQuAD) the mean time of its kind, else of such jobs run so far. A job's own output goes to
the log in its folder. A failed job prints its log path; the jobs that need it are skipped, the
others still run.
"""

import os
import statistics
import sys
import time
from dataclasses import dataclass, field

from . import state
from .job_log import JobLog

DONE, FAILED, SKIPPED = "done", "failed", "skipped"
EVERY = 20.0   # seconds between two lines about the running jobs (not on a terminal)
POLL = 2.0     # seconds between two looks at the running jobs


def _clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class Running:
    """A job that runs: its launcher handle, when it started, its log."""

    job: object
    handle: object
    began: float
    log: JobLog


@dataclass
class Progress:
    """The overall progress display, and the timings behind its estimate."""

    total: int
    stream: object = sys.stderr
    now: object = time.monotonic
    every: float = EVERY
    finished: int = 0
    runs: dict = field(default_factory=dict)   # kind -> [(seconds, work)] of the jobs run this time
    interactive: bool = None                   # rewrite the running jobs' line in place (a terminal)

    def __post_init__(self):
        self.started = self.last_line = self.now()
        if self.interactive is None:
            self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.transient = False  # a running jobs' line is on the terminal, to be overwritten

    def done(self, job, seconds):
        self.finished += 1
        self.runs.setdefault(job.kind, []).append((seconds, job.work))

    def seconds_per_token(self, kind, running=()):
        """Seconds per token trained for a job of ``kind``: measured on the jobs of ``kind`` run so far,
        else on a running one, else on any job that trained, run or running; None before any."""
        def measured(runs):
            work = sum(w for _, w in runs if w)
            return sum(s for s, w in runs if w) / work if work else None

        live = {id(run): run.log.seconds_per_token() for run in running}
        every_run = [run for runs in self.runs.values() for run in runs]
        candidates = [measured(self.runs.get(kind, [])),
                      *[live[id(run)] for run in running if run.job.kind == kind],
                      measured(every_run), *live.values()]
        return next((value for value in candidates if value is not None), None)

    def estimate(self, job, running=()):
        """Seconds ``job`` is expected to take, or None when nothing run says yet."""
        if job.work:
            per_token = self.seconds_per_token(job.kind, running)
            return None if per_token is None else job.work * per_token
        unsized = [s for runs in self.runs.values() for s, w in runs if not w]
        same = [s for s, _ in self.runs.get(job.kind, [])]
        return statistics.fmean(same or unsized) if same or unsized else None

    def remaining(self, run, running=()):
        """Seconds the running ``run`` has left: its remaining updates at its rate when its log tells
        them, else its estimate less its time so far; None when not known."""
        total, done, rate = run.log.total, run.log.done, run.log.rate()
        if total and rate and done is not None:
            return max(0, total - done) / rate
        expected = self.estimate(run.job, running)
        return None if expected is None else max(0.0, expected - (self.now() - run.began))

    def left(self, waiting=(), running=()):
        """Seconds left for the running and ``waiting`` jobs, or None when one cannot be estimated."""
        parts = [self.remaining(run, running) for run in running]
        parts += [self.estimate(job, running) for job in waiting]
        return None if any(part is None for part in parts) else sum(parts)

    def line(self, message, waiting=(), running=(), transient=False):
        left = self.left(waiting, running)
        eta = "?" if left is None else _clock(left)
        text = (f"[{self.finished}/{self.total} jobs | {_clock(self.now() - self.started)} elapsed | "
                f"~{eta} left] {message}")
        if self.interactive:
            text = "\r\033[K" + text if self.transient else text
            self.stream.write(text if transient else text + "\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.transient = transient and self.interactive
        self.last_line = self.now()

    def running_line(self, running, waiting=()):
        """The running jobs' progress: on a terminal at each call, else every ``every`` seconds."""
        for run in running:
            run.log.read()
        if not running or (not self.interactive and self.now() - self.last_line < self.every):
            return
        parts = []
        for run in running:
            said = run.log.describe()
            parts.append(f"{run.job.name}: {said + ', ' if said else ''}"
                         f"running {_clock(self.now() - run.began)}")
        self.line("; ".join(parts), waiting, running, transient=True)


def run_jobs(jobs, launcher, stream=sys.stderr, now=time.monotonic, sleep=time.sleep, every=EVERY):
    """Run ``jobs`` (in dependency order) through ``launcher``; returns {name: (status, note)}. An
    interruption (Ctrl-C, SIGTERM turned into SystemExit) stops the running jobs of a launcher that can
    (``launcher.stop``)."""
    outcome, progress = {}, Progress(total=len(jobs), stream=stream, now=now, every=every)
    waiting = []
    for job in jobs:
        if state.is_done(job):
            outcome[job.name] = (DONE, "done before")
            progress.finished += 1
        else:
            waiting.append(job)
    if progress.finished:
        progress.line(f"{progress.finished} job(s) already done, {len(waiting)} to run", waiting)
    running = {}  # name -> Running
    try:
        while waiting or running:
            _start_jobs(waiting, running, outcome, launcher, progress)
            finished_any = _collect_jobs(waiting, running, outcome, launcher, progress)
            if running and not finished_any:
                progress.running_line(list(running.values()), waiting)
                sleep(POLL)
    except BaseException:
        for run in running.values():
            if hasattr(launcher, "stop"):
                launcher.stop(run.handle)
        raise
    return outcome


def _start_jobs(waiting, running, outcome, launcher, progress):
    """Start the waiting jobs whose dependencies are done, as many as the launcher takes; skip those
    whose dependencies failed."""
    for job in list(waiting):
        if launcher.capacity is not None and len(running) >= launcher.capacity:
            break
        needs = [outcome.get(dep, (None,))[0] for dep in job.deps]
        if any(status in (FAILED, SKIPPED) for status in needs):
            bad = next(dep for dep in job.deps if outcome[dep][0] in (FAILED, SKIPPED))
            outcome[job.name] = (SKIPPED, f"needs {bad}, which did not finish")
            waiting.remove(job)
            progress.finished += 1
            progress.line(f"{job.name}: skipped, needs {bad}", waiting, running.values())
            continue
        if not all(status == DONE for status in needs):
            continue
        record = state.read_record(job.folder)
        stopped = state.stop_left_running(job, record)
        if stopped:
            progress.line(f"{job.name}: {stopped}", waiting, running.values())
        how = state.action(job, record)
        gone = state.missing_outputs(job) if state.finished_before(job, record) else []
        state.start(job, how, record)
        again = f" again: done before, but {', '.join(gone)} is gone" if gone else ""
        progress.line(f"{job.name}: {'resuming' if how == state.RESUME else 'running'}{again}"
                      f" (log: {os.path.join(job.folder, job.log)})", waiting, running.values())
        waiting.remove(job)
        log = JobLog(job, progress.now)  # from the log's end before the job writes to it
        running[job.name] = Running(job, launcher.submit(job), progress.now(), log)


def _last_line(log):
    """The last line a failed job's commands wrote to ``log`` (the launcher's own ``exit status N`` line
    left out): a command's one-line error, or a traceback's exception; "" when there is none."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    written = [line.strip() for line in lines if line.strip() and not line.startswith("exit status ")]
    return written[-1] if written else ""


def _collect_jobs(waiting, running, outcome, launcher, progress):
    """Record the jobs that ended; whether any did."""
    finished_any = False
    for name, run in list(running.items()):
        result = launcher.poll(run.handle)
        if result is None:
            continue
        finished_any = True
        del running[name]
        returncode, error = result
        seconds = progress.now() - run.began
        state.finish(run.job, returncode, seconds, error)
        progress.done(run.job, seconds)
        if returncode == 0:
            outcome[name] = (DONE, f"{seconds:.0f} s")
            progress.line(f"{name}: done in {_clock(seconds)}", waiting, running.values())
        else:
            log = os.path.join(run.job.folder, run.job.log)
            reason = error or _last_line(log)
            detail = f": {reason}" if reason else ""
            outcome[name] = (FAILED, f"exit status {returncode}{detail}; log: {log}")
            progress.line(f"{name}: FAILED ({outcome[name][1]})", waiting, running.values())
    return finished_any
