"""Lets ``fairseq-train --bf16`` train in bfloat16 on a CUDA GPU.

fairseq's command line takes ``--bf16`` to imply ``--tpu`` (``options.parse_args_and_arch``), so on a GPU
machine a ``--bf16`` run leaves CUDA for its XLA path and fails importing ``torch_xla``; its trainer,
optimizers and data handling support bfloat16 on CUDA (``fairseq-hydra-train``, which sets no ``tpu``,
runs it). Where ``torch_xla`` is not installed, CUDA is, and the run is not ``--cpu``, the implied
``tpu`` is dropped before fairseq-train's ``distributed_utils.call_main`` reads it (and before any spawned
worker receives the config). A machine with ``torch_xla`` keeps fairseq's TPU path.
"""

import functools
import importlib.util
import logging

import torch
from fairseq.distributed import utils as distributed_utils

logger = logging.getLogger(__name__)


def on_cuda_without_xla(cfg):
    """Whether a ``--bf16`` config of fairseq's command line would leave CUDA for a TPU path it cannot run."""
    common = cfg.common
    return (common.bf16 and common.tpu and not common.cpu and torch.cuda.is_available()
            and importlib.util.find_spec("torch_xla") is None)


def _bf16_on_cuda(call_main):
    @functools.wraps(call_main)
    def wrapped(cfg, main, **kwargs):
        if on_cuda_without_xla(cfg):
            logger.info("--bf16 trains in bfloat16 on CUDA: fairseq takes it to imply --tpu, and torch_xla "
                        "is not installed")
            cfg.common.tpu = False
            cfg.distributed_training.tpu = False
        return call_main(cfg, main, **kwargs)

    return wrapped


distributed_utils.call_main = _bf16_on_cuda(distributed_utils.call_main)
