"""Child processes that do not outlive the process that started them.

tupe-study runs each job as a child process, and the fine-tuning tools run fairseq-train as theirs. On
Linux the child asks the kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), whatever
killed the parent, SIGKILL included, which no handler sees: a killed study leaves no job writing into the
folders its rerun will use. Elsewhere nothing is asked, and the study's rerun stops what is left
(:func:`tupe_plugin.study.state.stop_left_running`).
"""

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def ended_with_parent():
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when this process dies."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    def preexec():
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(128 + signal.SIGTERM)

    return preexec
