"""The plugin's C++ kernels, built on first use with ``torch.utils.cpp_extension`` (a few seconds, once).

``biased_attention_backward.cpp`` holds the fused CPU backward of attention with a learned additive mask
(see :mod:`.cpu_kernels`). The build lands in torch's extension cache (``TORCH_EXTENSIONS_DIR``,
by default ``~/.cache/torch_extensions``), shared by later runs and by every worker of a run; it needs a
C++ compiler and the ``ninja`` package. Without them, or with ``TUPE_PLUGIN_COMPILED_KERNELS=0``, the
plugin says so once and runs the same computation in Python (slower, the same result).

The kernel splits its work over torch's intra-op threads with ``at::parallel_for``, a header template that
runs every loop on the calling thread unless the library is compiled with OpenMP: it is built with
``-fopenmp`` and so shares the OpenMP runtime torch ships (``libgomp.so.1`` beside libtorch). A compiler
without OpenMP (Apple's clang) gets a one-thread build and a warning.

The code is compiled for the machine family's baseline instruction set, not ``-march=native``, so that a
cache on a shared home directory serves every node of a cluster; the GEMMs are torch's BLAS, which
chooses its instruction set when it runs.
"""

import functools
import logging
import os
import pathlib

logger = logging.getLogger(__name__)

SOURCE = pathlib.Path(__file__).with_name("biased_attention_backward.cpp")
SWITCH = "TUPE_PLUGIN_COMPILED_KERNELS"


@functools.cache
def biased_attention_backward():
    """The compiled ``tupe_plugin::biased_attention_backward`` op, or None where it cannot be built."""
    if os.environ.get(SWITCH, "1") == "0":
        logger.info(f"{SWITCH}=0: the attention backward with a learned mask runs in Python")
        return None
    import torch
    from torch.utils import cpp_extension

    # -fno-trapping-math lets the compiler vectorise the exponential's clamps (no FP exceptions used)
    flags = ["-O3", "-fno-trapping-math"]
    try:
        try:
            cpp_extension.load(name="tupe_plugin_kernels", sources=[str(SOURCE)], extra_cflags=flags + ["-fopenmp"],
                               extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        except (OSError, RuntimeError) as error:
            cpp_extension.load(name="tupe_plugin_kernels_one_thread", sources=[str(SOURCE)], extra_cflags=flags,
                               is_python_module=False, verbose=False)
            logger.warning(f"the compiled attention backward was built without OpenMP ({_last_line(error)}) and "
                           f"runs on one thread; a compiler with OpenMP (GCC, or clang with libomp) lets it use "
                           f"torch's {torch.get_num_threads()} threads.")
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja, a failed build
        logger.warning(f"the compiled attention backward could not be built ({_last_line(error)}); the slower "
                       f"Python backward runs instead. It needs a C++ compiler and `pip install ninja`; "
                       f"{SWITCH}=0 skips the attempt.")
        return None
    return torch.ops.tupe_plugin.biased_attention_backward


def _last_line(error):
    """The last line of a build error (the compiler's or ninja's verdict), else the error's type."""
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__
