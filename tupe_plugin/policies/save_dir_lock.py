"""One fairseq-train run per ``--save-dir``: a second run writing into the same folder stops, naming the
first.

Two runs sharing a ``--save-dir`` overwrite each other's ``checkpoint_last.pt`` / ``checkpoint_best.pt``
(and the resumed one continues from the other's weights) without a word. The first process of a run
(rank 0) creates ``SAVE_DIR/tupe_plugin.lock`` exclusively, with its pid, host and command line, and
removes it when the process ends (also a worker started by fairseq's ``torch.multiprocessing.spawn``) or
starts another run. A lock left by a run that was killed (its pid no longer exists on this host) is
taken over, so re-running a killed command resumes as before.

A lock written on another host cannot be checked from this one. It is taken over when it was written by
an earlier start of this very SLURM job (same ``SLURM_JOB_ID``, a lower ``SLURM_RESTART_COUNT``: SLURM
ended that run before requeueing the job, possibly onto another node). Otherwise the run stops, and the
message says how to take the lock over once that run is known to be gone: ``TUPE_PLUGIN_FORCE_UNLOCK=1``
in the environment takes over a lock whose holder this host cannot check; a run alive on this host
keeps its lock whatever the variable says.
"""

import json
import logging
import multiprocessing.util
import os
import socket
import sys
import time
from ..user_input.user_errors import UserError

logger = logging.getLogger(__name__)

LOCK_NAME = "tupe_plugin.lock"
FORCE_UNLOCK_VARIABLE = "TUPE_PLUGIN_FORCE_UNLOCK"

_held = []


class SaveDirLockedError(UserError, RuntimeError):
    """Another run is writing into the same ``--save-dir``."""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(path):
    try:
        with open(path, encoding="utf-8") as f:
            holder = json.load(f)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _slurm_start():
    """(SLURM_JOB_ID, SLURM_RESTART_COUNT) of this process, or (None, 0) outside SLURM."""
    try:
        restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        restart = 0
    return os.environ.get("SLURM_JOB_ID") or None, restart


def _takeover(other, me):
    """Why the lock of ``other`` may be taken over by ``me`` (a phrase for the log), or None."""
    same_host = other.get("host") == me["host"]
    if same_host and other.get("pid") == me["pid"]:
        return "it is this process's own"
    restart = other.get("slurm_restart")
    if me["slurm_job"] is not None and other.get("slurm_job") == me["slurm_job"] \
            and isinstance(restart, int) and restart < me["slurm_restart"]:
        return (f"it was written by start {restart} of this SLURM job {me['slurm_job']}, which SLURM "
                f"ended before this start {me['slurm_restart']}")
    if same_host:
        return None if _alive(other.get("pid", -1)) else "its process no longer exists"
    if os.environ.get(FORCE_UNLOCK_VARIABLE):
        return f"{FORCE_UNLOCK_VARIABLE} is set and a run on another host cannot be checked from this one"
    return None


def _who(other):
    return f"pid {other.get('pid', '?')} on {other.get('host', '?')}"


def _locked_message(save_dir, path, other, me):
    holder = (f"--save-dir {save_dir} is in use by another run ({_who(other)}, started "
              f"{other.get('started', '?')}: {other.get('command', '?')}); ")
    if other.get("host") in (None, me["host"]):
        return (holder + f"give this run its own --save-dir, or wait for that run to end (remove {path} "
                "if it is gone)")
    return (holder + "give this run its own --save-dir, or wait for that run to end. This host "
            f"({me['host']}) cannot check a run on {other['host']}: if it is gone (killed, or its job "
            f"requeued onto another node), take the lock over with {FORCE_UNLOCK_VARIABLE}=1 "
            "fairseq-train ... (the same command)")


def acquire(save_dir, command=None):
    """Take the lock of ``save_dir``; return its path. Raises :class:`SaveDirLockedError`."""
    os.makedirs(save_dir, exist_ok=True)
    path = os.path.join(save_dir, LOCK_NAME)
    slurm_job, slurm_restart = _slurm_start()
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command or " ".join(sys.argv),
          "slurm_job": slurm_job, "slurm_restart": slurm_restart}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = _holder(path)
            if other is None:  # being written this instant, or damaged: look once more
                time.sleep(0.2)
                other = _holder(path)
            if other is None and os.environ.get(FORCE_UNLOCK_VARIABLE):
                logger.warning(f"taking over {path}, which names no run: {FORCE_UNLOCK_VARIABLE} is set")
                os.remove(path)
                continue
            reason = None if other is None else _takeover(other, me)
            if reason is not None:
                if other.get("host") != me["host"] or other.get("slurm_job") is not None:
                    logger.warning(f"taking over {path} of {_who(other)} (started "
                                   f"{other.get('started', '?')}): {reason}")
                os.remove(path)
                continue
            raise SaveDirLockedError(_locked_message(save_dir, path, other or {}, me)) from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(me, f)
        return path
    raise SaveDirLockedError(f"--save-dir {save_dir}: could not take {path}; remove it if no run uses the "
                             "folder")


def release(path):
    """Remove the lock at ``path`` if this process holds it."""
    holder = _holder(path)
    if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        os.remove(path)



def lock_for_run(save_dir):
    """Take the lock of ``save_dir`` for the run starting in this process, released when the process ends
    (normal exit, an exception, a spawned worker's end) or when it starts another run."""
    while _held:
        release(_held.pop())
    path = acquire(save_dir)
    _held.append(path)
    multiprocessing.util.Finalize(None, release, args=(path,), exitpriority=0)
    return path
