"""Destroys torch.distributed's process group before the interpreter of a worker shuts down.

fairseq's ``distributed_main`` ends a worker with a barrier and returns; nothing calls
``torch.distributed.destroy_process_group()``. The gloo process group (every CPU run with several processes)
is then torn down during interpreter finalisation, where its C++ worker threads may still hold Python
objects: now and then a worker that has trained and saved to the end dies with "terminate called without an
active exception" (SIGABRT), and ``torch.multiprocessing.spawn`` reports the whole run as failed. An
``atexit`` handler runs while the interpreter is still whole, so the group is destroyed there; a process
that never joined a group (a single-process run, the parent that spawns the workers) is left alone.
"""

import atexit

import torch.distributed


def destroy_process_group_at_exit():
    """Destroys the default process group of this process, if it has one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


atexit.register(destroy_process_group_at_exit)
