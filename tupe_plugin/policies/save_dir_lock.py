"""One fairseq-train run per ``--save-dir``: a second run writing into the same folder stops, naming the first.

Two runs sharing a ``--save-dir`` overwrite each other's ``checkpoint_last.pt`` / ``checkpoint_best.pt``
(and the resumed one continues from the other's weights) without a word. The first process of a run
(rank 0) creates ``SAVE_DIR/tupe_plugin.lock`` exclusively, with its pid, host and command line, and
removes it when the process ends (also a worker started by fairseq's ``torch.multiprocessing.spawn``) or
starts another run. A lock left by a run that was killed (its pid no longer exists on this host) is
taken over, so re-running a killed command resumes as before.
"""

import json
import multiprocessing.util
import os
import socket
import sys
import time
from ..user_errors import UserError

LOCK_NAME = "tupe_plugin.lock"

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
            return json.load(f)
    except (OSError, ValueError):
        return None


def acquire(save_dir, command=None):
    """Take the lock of ``save_dir``; return its path. Raises :class:`SaveDirLockedError`."""
    os.makedirs(save_dir, exist_ok=True)
    path = os.path.join(save_dir, LOCK_NAME)
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command or " ".join(sys.argv)}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = _holder(path)
            stale = other is not None and other.get("host") == me["host"] and not _alive(other.get("pid", -1))
            if stale or (other is not None and other.get("pid") == me["pid"] and other.get("host") == me["host"]):
                os.remove(path)
                continue
            if other is None:  # being written this instant, or damaged: look once more
                time.sleep(0.2)
                other = _holder(path) or {}
            raise SaveDirLockedError(
                f"--save-dir {save_dir} is in use by another run (pid {other.get('pid', '?')} on "
                f"{other.get('host', '?')}, started {other.get('started', '?')}: {other.get('command', '?')}); "
                f"give this run its own --save-dir, or wait for that run to end (remove {path} if it is gone)"
            ) from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(me, f)
        return path
    raise SaveDirLockedError(f"--save-dir {save_dir}: could not take {path}; remove it if no run uses the folder")


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
