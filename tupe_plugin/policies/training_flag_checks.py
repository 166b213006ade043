"""fairseq-train flags that fail deep inside fairseq, refused in one line before anything is built.

- ``--fp16`` / ``--bf16`` without a CUDA device (``--cpu``, or a machine without one): fairseq fails in its
  fp16 optimizer, in a kernel without a CPU half-precision implementation, or, for ``--bf16`` (which
  fairseq takes to imply ``--tpu``), in XLA code. A machine with ``torch_xla`` installed is left to
  fairseq's TPU path;
- ``--tokens-per-sample`` below 2 (masked_lm blocks are one token shorter, for ``<s>``);
- ``--mask-prob`` of 0 (no token to predict: the loss is 0/0) or 1 and above (nothing left to read).
"""

import importlib.util

import torch
from ..user_input.user_errors import UserError


class TrainingFlagError(UserError, ValueError):
    """A fairseq-train flag that cannot train."""


def _has_xla():
    """True where torch_xla, which fairseq's ``--tpu``/``--bf16`` path runs on, is installed."""
    return importlib.util.find_spec("torch_xla") is not None


def check_training_flags(cfg):
    """Raise :class:`TrainingFlagError` listing every bad flag of fairseq-train config ``cfg``."""
    errors = []
    for flag in ("fp16", "bf16"):
        on_cpu = cfg.common.cpu or not torch.cuda.is_available()
        if getattr(cfg.common, flag, False) and on_cpu and not _has_xla():
            where = "--cpu" if cfg.common.cpu else "this machine, which has no CUDA device"
            errors.append(f"--{flag} needs a CUDA GPU but the run is on the CPU ({where}): drop --{flag}")
    task = cfg.task
    tokens_per_sample = getattr(task, "tokens_per_sample", None)
    if tokens_per_sample is not None and tokens_per_sample < 2:
        errors.append(f"--tokens-per-sample must be at least 2 (<s> and one token), got {tokens_per_sample}")
    mask_prob = getattr(task, "mask_prob", None)
    if mask_prob is not None and not 0 < mask_prob < 1:
        errors.append(f"--mask-prob is the fraction of tokens to predict, in (0, 1), got {mask_prob} "
                      "(BERT and RoBERTa use 0.15)")
    if errors:
        raise TrainingFlagError("; ".join(errors))

