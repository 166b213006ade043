"""Lets fairseq's ``--ddp-backend pytorch_ddp`` (its default) train on CPU processes (gloo).

fairseq wraps the model in ``DistributedDataParallel(module, device_ids=[device_id],
output_device=device_id, ...)``. torch refuses ``device_ids`` for a module on the CPU, so every
CPU run with several processes failed before the first update. This subclass drops
``device_ids``/``output_device`` when the module's parameters live on the CPU and changes nothing
on GPUs.

torch 2.13 deprecates ``broadcast_buffers``, which fairseq always passes (``--broadcast-buffers``, off by
default), in favour of ``forward_sync_buffers``; the two differ at init (``forward_sync_buffers=False``
still syncs buffers once), so the argument is kept as fairseq means it and torch's FutureWarning about it,
which would name this file, is not shown.
"""

import warnings

from fairseq.models import distributed_fairseq_model
from torch.nn.parallel import DistributedDataParallel


class CpuAwareDistributedDataParallel(DistributedDataParallel):
    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if all(p.device.type == "cpu" for p in module.parameters()):
            device_ids = output_device = None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated", FutureWarning)
            super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


distributed_fairseq_model.DistributedDataParallel = CpuAwareDistributedDataParallel
