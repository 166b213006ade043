"""What a study's folders record, and what a rerun does with it.

``FOLDER/job.json`` holds the job's name, fingerprint, commands and status (``running``, ``done``,
``failed``), the attempts and their total seconds, and the host and process group of the command
running. A rerun of the study

- skips a job whose record is ``done`` with the same fingerprint and whose outputs are all there;
- continues a resumable job (pre-training) in its folder when the fingerprint is the same:
  fairseq-train resumes from ``checkpoints/checkpoint_last.pt``;
- otherwise empties the folder and runs the job afresh (its settings changed, an output the later
  jobs read is gone, or it is not resumable and stopped half-way);
- first stops what a killed study left running in a job's folder on this machine.

``DIR/study.lock`` holds the study that runs in ``--out DIR``: a second one started there stops.
"""

import fcntl
import json
import os
import shutil
import signal
import socket
import time

RECORD = "job.json"
LOCK = "study.lock"
SKIP, RESUME, FRESH = "skip", "resume", "fresh"
_held_locks = {}  # out folder -> the open lock file, held while this process runs


class StudyInUseError(RuntimeError):
    """Another tupe-study runs in the same --out folder."""


def lock_study(out):
    """Hold ``out`` for this study until the process ends (the kernel releases the lock on any exit)."""
    path = os.path.join(out, LOCK)
    handle = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise StudyInUseError(f"--out {out} is in use by another tupe-study ({holder}): wait for it to "
                              "end, or give this study another --out") from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M')}")
    handle.flush()
    _held_locks[os.path.abspath(out)] = handle


def read_record(folder):
    """The job record of ``folder``, or None when there is none (or it cannot be read)."""
    try:
        with open(os.path.join(folder, RECORD), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_record(folder, record):
    """Write the record atomically: a kill never leaves half a job.json."""
    path = os.path.join(folder, RECORD)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)


def missing_outputs(job):
    """The outputs of ``job`` that are not there (a finished job with one missing runs again)."""
    return [path for path in job.outputs if not os.path.exists(path)]


def finished_before(job, record):
    """Whether ``record``, ``job``'s as :func:`read_record` gives it, says it was done with the same
    settings."""
    record = record or {}
    return record.get("fingerprint") == job.fingerprint and record.get("status") == "done"


def action(job, record):
    """SKIP, RESUME or FRESH for ``job``, from its ``record`` (:func:`read_record`) and outputs."""
    if record is None or record.get("fingerprint") != job.fingerprint:
        return FRESH
    if finished_before(job, record) and not missing_outputs(job):
        return SKIP
    return RESUME if job.resumable else FRESH


def is_done(job):
    """Whether a rerun skips ``job``: done with the same settings, every output there."""
    return action(job, read_record(job.folder)) == SKIP


def record_process(folder, pgid):
    """Note in the job's record the host and process group of the command now running."""
    record = read_record(folder)
    if record is not None:
        record["process"] = {"host": socket.gethostname(), "pgid": pgid}
        write_record(folder, record)


def _processes_in(pgid, folder):
    """The pids of process group ``pgid`` working in ``folder`` (Linux /proc; empty elsewhere)."""
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cwd = os.readlink(f"/proc/{name}/cwd")
        except (OSError, IndexError, ValueError):
            continue  # not a process, gone, or not ours to read
        if fields[0] != "Z" and int(fields[2]) == pgid and (cwd + os.sep).startswith(folder + os.sep):
            found.append(int(name))
    return found


def stop_left_running(job, record, patience=10.0):
    """Stop the processes that a killed study left running in ``job``'s folder on this machine; a note
    saying what was stopped, or None. They are those of the process group its ``record``
    (:func:`read_record`) names, still working in the folder: nothing else is touched."""
    process = (record or {}).get("process")
    if not process or process.get("host") != socket.gethostname():
        return None
    pgid, folder = process["pgid"], os.path.abspath(job.folder)
    left = _processes_in(pgid, folder)
    if not left:
        return None
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + patience
    while _processes_in(pgid, folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _processes_in(pgid, folder):
        os.killpg(pgid, signal.SIGKILL)
    return f"stopped pid {', '.join(map(str, left))}, left running in {folder} by a killed study"


def start(job, how, record):
    """Prepare the folder (emptied when ``how`` is FRESH) and record a new attempt; a resumed job keeps
    the attempts and seconds of its ``record`` (:func:`read_record`)."""
    record = record if how == RESUME else None
    if how == FRESH and os.path.isdir(job.folder):
        shutil.rmtree(job.folder)
    os.makedirs(job.folder, exist_ok=True)
    record = {
        "name": job.name, "kind": job.kind, "arch": job.model and job.model.arch,
        "fingerprint": job.fingerprint,
        "commands": job.commands, "log": job.log, "status": "running",
        "attempts": (record or {}).get("attempts", 0) + 1, "seconds": (record or {}).get("seconds", 0.0),
        "started": time.time(),
    }
    write_record(job.folder, record)
    return record


def finish(job, returncode, seconds, error=""):
    """Record the attempt's end: ``done`` for exit status 0, ``failed`` otherwise."""
    record = read_record(job.folder) or {}
    record.update(status="done" if returncode == 0 else "failed", returncode=returncode,
                  seconds=record.get("seconds", 0.0) + seconds, finished=time.time())
    if error:
        record["error"] = error
    write_record(job.folder, record)
    return record
