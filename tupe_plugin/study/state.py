"""What a job's folder records, and what a rerun does with it.

``FOLDER/job.json`` holds the job's name, fingerprint, commands and status (``running``, ``done``,
``failed``), the attempts and their total seconds. A rerun of the study

- skips a job whose record is ``done`` with the same fingerprint;
- continues a resumable job (pre-training) in its folder when the fingerprint is the same:
  fairseq-train resumes from ``checkpoints/checkpoint_last.pt``;
- otherwise empties the folder and runs the job afresh (its settings changed, or it is not
  resumable and stopped half-way).
"""

import json
import os
import shutil
import time

RECORD = "job.json"
SKIP, RESUME, FRESH = "skip", "resume", "fresh"


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


def action(job):
    """SKIP, RESUME or FRESH for ``job``, from its folder's record."""
    record = read_record(job.folder)
    if record is None or record.get("fingerprint") != job.fingerprint:
        return FRESH
    if record.get("status") == "done":
        return SKIP
    return RESUME if job.resumable else FRESH


def start(job, how):
    """Prepare the folder (emptied when ``how`` is FRESH) and record a new attempt."""
    record = read_record(job.folder) if how == RESUME else None
    if how == FRESH and os.path.isdir(job.folder):
        shutil.rmtree(job.folder)
    os.makedirs(job.folder, exist_ok=True)
    record = {
        "name": job.name, "kind": job.kind, "arch": job.arch, "fingerprint": job.fingerprint,
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
