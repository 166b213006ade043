"""fairseq --user-dir plugin: BERT-A/R, TUPE-A/R and the position encodings compared in the literature."""

from . import fairseq_fixes  # noqa: F401  (checkpoints, binarized data, CPU DDP)
from . import criterions, models, tasks  # noqa: F401  (register criterions, the model and --arch presets, tasks)
