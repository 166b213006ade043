"""Let ``torch.load(weights_only=True)`` (the default since torch 2.6) read fairseq checkpoints.

fairseq stores its argparse ``Namespace`` in every checkpoint, and the best validation score of tasks judged
by a scipy/sklearn metric (Matthews corr., F1, Pearson/Spearman) as a numpy scalar.
"""

import argparse

import numpy
import torch

torch.serialization.add_safe_globals([
    argparse.Namespace,
    numpy.core.multiarray.scalar if not hasattr(numpy, "_core") else numpy._core.multiarray.scalar,
    numpy.dtype,
    *(getattr(numpy.dtypes, name) for name in dir(numpy.dtypes) if name.endswith("DType")),
])
