"""fairseq --user-dir plugin: BERT-A/R, TUPE-A/R and the position encodings of seeds 000-002."""

from . import checkpoint_compat  # noqa: F401  (lets torch>=2.6 load fairseq checkpoints)
from . import criterions, models, tasks  # noqa: F401  (register criterions, the model and --arch presets, tasks)
