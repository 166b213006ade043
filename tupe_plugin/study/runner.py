"""The study loop: run every job after its dependencies, skip what is done, keep going past failures.

One progress line per job start and end: jobs done / total, elapsed time, an estimate of the time
left (the mean duration of the jobs of each kind run so far), and the job. A job's own output goes
to the log in its folder. A failed job prints its log path; the jobs that need it are skipped,
the others still run.
"""

import os
import sys
import time
from dataclasses import dataclass, field

from . import state

DONE, FAILED, SKIPPED = "done", "failed", "skipped"


def _clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class Progress:
    """The overall progress display, and the timings behind its estimate."""

    total: int
    stream: object = sys.stderr
    finished: int = 0
    started: float = field(default_factory=time.monotonic)
    durations: dict = field(default_factory=dict)   # kind -> seconds of the jobs run this time

    def estimate(self, remaining):
        """Seconds left for ``remaining`` jobs, or None before any job has run."""
        every = [s for seconds in self.durations.values() for s in seconds]
        if not every:
            return None
        overall = sum(every) / len(every)
        return sum(sum(self.durations[j.kind]) / len(self.durations[j.kind])
                   if j.kind in self.durations else overall for j in remaining)

    def line(self, message, remaining=()):
        left = self.estimate(remaining)
        eta = "?" if left is None else _clock(left)
        print(f"[{self.finished}/{self.total} jobs | {_clock(time.monotonic() - self.started)} elapsed | "
              f"~{eta} left] {message}", file=self.stream, flush=True)


def run_jobs(jobs, launcher, stream=sys.stderr):
    """Run ``jobs`` (in dependency order) through ``launcher``; returns {name: (status, note)}."""
    outcome, progress = {}, Progress(total=len(jobs), stream=stream)
    waiting = []
    for job in jobs:
        if state.is_done(job):
            outcome[job.name] = (DONE, "done before")
            progress.finished += 1
        else:
            waiting.append(job)
    if progress.finished:
        progress.line(f"{progress.finished} job(s) already done, {len(waiting)} to run", waiting)
    running = {}  # name -> (job, handle, start time)
    while waiting or running:
        for job in list(waiting):
            if launcher.capacity is not None and len(running) >= launcher.capacity:
                break
            needs = [outcome.get(dep, (None,))[0] for dep in job.deps]
            if any(status in (FAILED, SKIPPED) for status in needs):
                bad = next(dep for dep in job.deps if outcome[dep][0] in (FAILED, SKIPPED))
                outcome[job.name] = (SKIPPED, f"needs {bad}, which did not finish")
                waiting.remove(job)
                progress.finished += 1
                progress.line(f"{job.name}: skipped, needs {bad}", waiting)
                continue
            if not all(status == DONE for status in needs):
                continue
            record = state.read_record(job.folder)
            stopped = state.stop_left_running(job, record)
            if stopped:
                progress.line(f"{job.name}: {stopped}", waiting)
            how = state.action(job, record)
            gone = state.missing_outputs(job) if state.finished_before(job, record) else []
            state.start(job, how, record)
            again = f" again: done before, but {', '.join(gone)} is gone" if gone else ""
            progress.line(f"{job.name}: {'resuming' if how == state.RESUME else 'running'}{again}"
                          f" (log: {os.path.join(job.folder, job.log)})", waiting)
            waiting.remove(job)
            began = time.monotonic()  # before submit: the local launcher runs the job inside it
            running[job.name] = (job, launcher.submit(job), began)
        finished_any = False
        for name, (job, handle, began) in list(running.items()):
            result = launcher.poll(handle)
            if result is None:
                continue
            finished_any = True
            del running[name]
            returncode, error = result
            seconds = time.monotonic() - began
            state.finish(job, returncode, seconds, error)
            progress.finished += 1
            progress.durations.setdefault(job.kind, []).append(seconds)
            if returncode == 0:
                outcome[name] = (DONE, f"{seconds:.0f} s")
                progress.line(f"{name}: done in {_clock(seconds)}", waiting)
            else:
                log = os.path.join(job.folder, job.log)
                detail = f": {error}" if error else ""
                outcome[name] = (FAILED, f"exit status {returncode}{detail}; log: {log}")
                progress.line(f"{name}: FAILED ({outcome[name][1]})", waiting)
        if running and not finished_any:
            time.sleep(2)
    return outcome
