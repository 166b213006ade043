"""The plugin's C++ kernels, built on first use with ``torch.utils.cpp_extension`` (a few seconds, once).

``biased_attention_backward.cpp`` holds the fused CPU backward of attention with a learned additive mask
(see :mod:`.cpu_kernels`), ``offset_rows.cpp`` the adds of a bias of the offset's rows to a block of logits
and of a block's gradient back to the rows (see :mod:`.offset_rows`); one library holds both. The build
lands in torch's extension cache (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``),
shared by later runs and by every worker of a run; it needs a C++ compiler and the ``ninja`` package.
Without them, or with ``TUPE_PLUGIN_COMPILED_KERNELS=0``, the plugin says so once and runs the same
computation in Python (slower, the same result).

The kernel splits its work over torch's intra-op threads with ``at::parallel_for``, a header template that
runs every loop on the calling thread unless the library is compiled with OpenMP: it is built with
``-fopenmp`` and so shares the OpenMP runtime torch ships (``libgomp.so.1`` beside libtorch). A compiler
without OpenMP (Apple's clang) gets a one-thread build and a warning.

The code is compiled for the machine family's baseline instruction set, not ``-march=native``, so that a
cache on a shared home directory serves every node of a cluster; the GEMMs are torch's BLAS, which
chooses its instruction set when it runs.

torch guards a build with a ``lock`` file in the extension's folder, which every later load waits on until
it is gone; a build killed by SIGKILL leaves it, and every later run waited forever. The plugin's loads
hold a kernel lock (``flock`` on ``tupe_plugin.lock`` beside it, released when its process ends, killed or
not) around torch's: a ``lock`` file found while holding it belongs to no live build, and is removed. A
build of another process that holds the lock longer than :data:`BUILD_WAIT_SECONDS` is not waited for:
the Python twins run, and the warning names the lock file.
"""

import fcntl
import functools
import logging
import os
import pathlib
import time

logger = logging.getLogger(__name__)

SOURCES = [pathlib.Path(__file__).with_name(name)
           for name in ("biased_attention_backward.cpp", "offset_rows.cpp")]
SWITCH = "TUPE_PLUGIN_COMPILED_KERNELS"
BUILD_WAIT_SECONDS = 300


class BuildWaitTimeout(Exception):
    """Another process has held the build of a kernel for longer than :data:`BUILD_WAIT_SECONDS`."""


@functools.cache
def biased_attention_backward():
    """The compiled ``tupe_plugin::biased_attention_backward`` op, or None where the library cannot be built
    (its build, once a process, for every op of the library)."""
    if os.environ.get(SWITCH, "1") == "0":
        logger.info(f"{SWITCH}=0: the compiled CPU kernels are not built; their Python twins run")
        return None
    import torch

    # -fno-trapping-math lets the compiler vectorise the exponential's clamps (no FP exceptions used)
    flags = ["-O3", "-fno-trapping-math"]
    try:
        try:
            _load("tupe_plugin_kernels", extra_cflags=flags + ["-fopenmp"], extra_ldflags=["-fopenmp"])
        except (OSError, RuntimeError) as error:
            _load("tupe_plugin_kernels_one_thread", extra_cflags=flags)
            logger.warning(f"the compiled CPU kernels were built without OpenMP ({_last_line(error)}) "
                           f"and run on one thread; a compiler with OpenMP (GCC, or clang with libomp) "
                           f"lets them use torch's {torch.get_num_threads()} threads.")
    except BuildWaitTimeout as error:
        logger.warning(f"{error}; their slower Python twins run instead")
        return None
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja, a failed build
        logger.warning(f"the compiled CPU kernels could not be built ({_last_line(error)}); their slower "
                       f"Python twins run instead. They need a C++ compiler and `pip install ninja`; "
                       f"{SWITCH}=0 skips the attempt.")
        return None
    return torch.ops.tupe_plugin.biased_attention_backward


def offset_rows_ops():
    """The compiled ``(add_offset_rows_, add_offset_gradient_)`` ops, or None where the library cannot be
    built."""
    if biased_attention_backward() is None:
        return None
    import torch

    return torch.ops.tupe_plugin.add_offset_rows_, torch.ops.tupe_plugin.add_offset_gradient_


def _load(name, **flags):
    """torch's ``cpp_extension.load`` of the kernels as extension ``name``, under the plugin's kernel lock;
    a torch ``lock`` file no live build holds is removed first."""
    from torch.utils import cpp_extension

    folder = cpp_extension._get_build_directory(name, verbose=False)
    torch_lock = os.path.join(folder, "lock")
    with open(os.path.join(folder, "tupe_plugin.lock"), "a") as guard:
        deadline = time.monotonic() + BUILD_WAIT_SECONDS
        while not _try_lock(guard):
            if time.monotonic() > deadline:
                raise BuildWaitTimeout(f"{torch_lock}: another process has been building the compiled "
                                       f"CPU kernels for over {BUILD_WAIT_SECONDS} s (it holds "
                                       f"{guard.name})")
            time.sleep(0.1)
        if os.path.exists(torch_lock):
            logger.warning(f"{torch_lock} was left by a build of the compiled CPU kernels that was "
                           "killed (no process builds it now): removed, the kernels are built again")
            os.remove(torch_lock)
        cpp_extension.load(name=name, sources=[str(source) for source in SOURCES], build_directory=folder,
                           is_python_module=False, verbose=False, **flags)


def _try_lock(file):
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _last_line(error):
    """The last line of a build error (the compiler's or ninja's verdict), else the error's type."""
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__
