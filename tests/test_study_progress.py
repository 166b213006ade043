"""The study's progress: the running job's updates and rate read from its log while it runs, a line at
least every 30 seconds, and the time left weighed by each job's planned work (a fake clock: no real
training)."""

import io
import os
import re
import shlex
import sys
import time

import pytest

from tupe_plugin.study.job_log import JobLog
from tupe_plugin.study.jobs import Job, Training
from tupe_plugin.study.launchers import LocalLauncher
from tupe_plugin.study.runner import POLL, Progress, Running, run_jobs

TOKENS = 16 * 64  # batch 16 x 64 tokens
INNER = "2026 | INFO | train_inner | epoch 001:     {u} / 62 loss=9.1, ups=1.0, num_updates={u}, lr=0.001\n"


def job(tmp_path, name, updates=(4000,), command_updates=None, work=None, log="train.log"):
    """A job of kind NAME's first part; ``updates``: the planned updates of each training command."""
    commands = [["train", name, str(index)] for index in range(len(updates))]
    training = {index: Training(count, TOKENS) for index, count in enumerate(updates)}
    planned = sum(count or 0 for count in updates) * TOKENS
    return Job(name=name, kind=name.split("/")[0], folder=str(tmp_path / name), commands=commands,
               log=log, training=training, work=planned if work is None else work, fingerprint=f"fp-{name}")


class FakeRuns:
    """A launcher and clock: a submitted job writes the ``(seconds after its start, line)`` of its
    script to its log as the fake clock reaches them, and ends at ``end`` seconds."""

    capacity = 1

    def __init__(self, scripts):
        self.time, self.scripts = 0.0, scripts  # name -> (end, [(seconds, line)])

    def now(self):
        return self.time

    def sleep(self, seconds):
        self.time += seconds

    def submit(self, job):
        os.makedirs(job.folder, exist_ok=True)
        return {"job": job, "start": self.time, "written": 0}

    def poll(self, handle):
        job = handle["job"]
        end, lines = self.scripts[job.name]
        due = [line for at, line in lines if at <= self.time - handle["start"]]
        with open(os.path.join(job.folder, job.log), "a", encoding="utf-8") as log:
            log.writelines(due[handle["written"]:])
        handle["written"] = len(due)
        return (0, "") if self.time - handle["start"] >= end else None


def training_script(job, updates_per_second, seconds, every=1):
    """The log of ``job``'s single command, training at ``updates_per_second`` for ``seconds``."""
    lines = [(0, f"$ {shlex.join(job.commands[0])}\n")]
    lines += [(t, INNER.format(u=int(t * updates_per_second))) for t in range(every, seconds + 1, every)]
    return seconds, lines


def run_with_fake_clock(jobs, scripts):
    fake, stream = FakeRuns(scripts), io.StringIO()
    run_jobs(jobs, fake, stream=stream, now=fake.now, sleep=fake.sleep)
    return stream.getvalue().splitlines()


def test_running_pretraining_line_shows_its_updates_total_and_rate(tmp_path):
    pretrain = job(tmp_path, "pretrain/x")
    lines = run_with_fake_clock([pretrain], {"pretrain/x": training_script(pretrain, 10, 400)})
    assert "[0/1 jobs | 0:01:00 elapsed | ~0:05:40 left] pretrain/x: update 600/4000 (15%), " \
           "10.00 updates/s, running 0:01:00" in lines


def test_running_jobs_get_a_line_at_least_every_30_seconds(tmp_path):
    pretrain = job(tmp_path, "pretrain/x")
    lines = run_with_fake_clock([pretrain], {"pretrain/x": training_script(pretrain, 10, 400)})
    elapsed = [sum(int(part) * 60 ** i for i, part in enumerate(reversed(found.split(":"))))
               for found in re.findall(r"\| (\d+:\d\d:\d\d) elapsed", "\n".join(lines))]
    assert elapsed[0] == 0 and elapsed[-1] >= 400
    assert max(later - earlier for earlier, later in zip(elapsed, elapsed[1:])) <= 30


def test_time_left_of_a_running_job_is_its_remaining_updates_at_its_rate(tmp_path):
    pretrain = job(tmp_path, "pretrain/x")
    lines = run_with_fake_clock([pretrain], {"pretrain/x": training_script(pretrain, 20, 200)})
    line = next(line for line in lines if "update 1200/4000" in line)
    assert "~0:02:20 left]" in line  # 2800 updates at 20 a second


def test_stages_count_their_updates_one_after_the_other(tmp_path):
    staged = job(tmp_path, "pretrain/x", updates=(300, 100))
    log = JobLog(staged, now=lambda: 0.0)
    os.makedirs(staged.folder)
    with open(log.path, "w", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(staged.commands[0])}\n{INNER.format(u=300)}"
                f"$ {shlex.join(staged.commands[1])}\n{INNER.format(u=40)}")
    log.read()
    assert (log.done, log.total) == (340, 400)


def test_resumed_job_reads_only_the_lines_of_this_attempt(tmp_path):
    resumed = job(tmp_path, "pretrain/x")
    os.makedirs(resumed.folder)
    path = os.path.join(resumed.folder, "train.log")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(resumed.commands[0])}\n{INNER.format(u=2000)}")
    clock = iter([10.0, 20.0])
    log = JobLog(resumed, now=lambda: next(clock))
    log.read()
    assert log.done is None  # the earlier attempt's 2000 updates are not this one's
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(resumed.commands[0])}\n{INNER.format(u=1990)}")
    log.read()
    with open(path, "a", encoding="utf-8") as f:
        f.write(INNER.format(u=2090))
    log.read()
    assert (log.done, log.rate()) == (2090, 10.0)  # the rate from the first update read, not from 0


def test_fine_tuning_total_comes_from_its_configuration_line(tmp_path):
    glue = job(tmp_path, "glue/x", updates=(None,), work=20 * TOKENS, log="log.txt")
    log = JobLog(glue, now=lambda: 0.0)
    os.makedirs(glue.folder)
    with open(log.path, "w", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(glue.commands[0])}\nfairseq_cli.train | configuration: arch tupe_r_tiny, "
                f"task sentence_prediction, criterion sentence_prediction, data bin, --total-num-update 20 "
                f"(the full configuration is stored in every checkpoint as cfg)\n{INNER.format(u=10)}")
    log.read()
    assert log.describe() == "update 10/20 (50%)"


def finished(progress, name, seconds, work):
    progress.done(Job(name=name, kind=name.split("/")[0], folder="", commands=[], work=work), seconds)


def test_time_left_weighs_the_jobs_by_their_planned_tokens(tmp_path):
    progress = Progress(total=4, stream=io.StringIO(), now=lambda: 0.0)
    finished(progress, "pretrain/a", 400.0, 4000 * TOKENS)
    longer = job(tmp_path, "pretrain/b", updates=(8000,))
    glue = job(tmp_path, "glue/b", updates=(None,), work=500 * TOKENS)
    # no GLUE run yet: its tokens at the seconds per token of pre-training
    assert progress.left([longer, glue]) == pytest.approx(800 + 50)


def test_a_kinds_measured_rate_replaces_another_kinds_for_its_jobs(tmp_path):
    progress = Progress(total=4, stream=io.StringIO(), now=lambda: 0.0)
    finished(progress, "pretrain/a", 400.0, 4000 * TOKENS)
    finished(progress, "glue/a", 60.0, 100 * TOKENS)  # fine-tuning's overheads: 6 times the time per token
    glue = job(tmp_path, "glue/b", updates=(None,), work=500 * TOKENS)
    assert progress.left([glue]) == pytest.approx(300)


def test_before_any_job_trained_the_running_jobs_rate_prices_the_waiting_ones(tmp_path):
    now = [0.0]
    progress = Progress(total=2, stream=io.StringIO(), now=lambda: now[0])
    running, waiting = job(tmp_path, "pretrain/a"), job(tmp_path, "pretrain/b")
    os.makedirs(running.folder)
    log = JobLog(running, now=lambda: now[0])
    with open(log.path, "w", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(running.commands[0])}\n{INNER.format(u=100)}")
    now[0] = 10.0
    log.read()
    with open(log.path, "a", encoding="utf-8") as f:
        f.write(INNER.format(u=200))
    now[0] = 20.0
    log.read()
    assert progress.left([waiting], [Running(running, None, 0.0, log)]) == pytest.approx(380 + 400)


def test_jobs_that_do_not_train_take_the_mean_time_of_their_kind_else_of_such_jobs(tmp_path):
    progress = Progress(total=4, stream=io.StringIO(), now=lambda: 0.0)
    finished(progress, "analysis/a", 10.0, 0)
    finished(progress, "analysis/b", 30.0, 0)
    finished(progress, "data", 50.0, 0)
    finished(progress, "pretrain/a", 400.0, 4000 * TOKENS)
    analysis, extrapolation = (job(tmp_path, name, updates=(), work=0) for name in ("analysis/c", "extra/c"))
    assert progress.estimate(analysis) == 20.0 and progress.estimate(extrapolation) == 30.0


def test_local_job_shows_its_progress_while_it_runs(tmp_path):
    code = "import time; [(print(f'num_updates={u}', flush=True), time.sleep(0.5)) for u in (5, 6)]"
    local = Job(name="pretrain/x", kind="pretrain", folder=str(tmp_path / "pretrain" / "x"),
                commands=[[sys.executable, "-c", code]], training={0: Training(10, TOKENS)},
                work=10 * TOKENS, fingerprint="fp")
    stream, looks = io.StringIO(), []
    run_jobs([local], LocalLauncher(), stream=stream, sleep=lambda seconds: (looks.append(seconds),
                                                                               time.sleep(0.05)), every=0)
    assert len(looks) >= 2 and set(looks) == {POLL}  # it looked at the running job, between its lines
    assert re.search(r"pretrain/x: update [56]/10 \([56]0%\)", stream.getvalue())


def test_interrupted_study_stops_its_running_local_job(tmp_path):
    pid_file = tmp_path / "job.pid"
    local = Job(name="glue/x", kind="glue", folder=str(tmp_path / "glue" / "x"), fingerprint="fp",
                commands=[["bash", "-c", f"echo $$ > {pid_file}; exec sleep 60"]])

    def interrupt_once_started(_):
        time.sleep(0.05)
        if pid_file.is_file() and pid_file.read_text().strip():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_jobs([local], LocalLauncher(), stream=io.StringIO(), sleep=interrupt_once_started)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped by the study, not left running
