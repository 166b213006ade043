"""The plugin's C++ kernels, built on first use with ``torch.utils.cpp_extension`` (a few seconds, once).

``biased_attention_backward.cpp`` holds the fused CPU backward of attention with a learned additive mask
(see :mod:`.attention_kernels`). The build lands in torch's extension cache (``TORCH_EXTENSIONS_DIR``,
by default ``~/.cache/torch_extensions``), shared by later runs and by every worker of a run; it needs a
C++ compiler and the ``ninja`` package. Without them, or with ``TUPE_PLUGIN_COMPILED_KERNELS=0``, the
plugin says so once and runs the same computation in Python (slower, the same result).

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

    try:
        # -fno-trapping-math lets the compiler vectorise the exponential's clamps (no FP exceptions used)
        cpp_extension.load(name="tupe_plugin_kernels", sources=[str(SOURCE)],
                           extra_cflags=["-O3", "-fno-trapping-math"], is_python_module=False, verbose=False)
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja, a failed build
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        logger.warning(f"the compiled attention backward could not be built ({reason}); the slower Python "
                       f"backward runs instead. It needs a C++ compiler and `pip install ninja`; "
                       f"{SWITCH}=0 skips the attempt.")
        return None
    return torch.ops.tupe_plugin.biased_attention_backward
