"""fairseq --user-dir plugin: BERT-A/R, TUPE-A/R and the position encodings of seeds 000-002."""

from . import atomic_checkpoints  # noqa: F401  (checkpoint_last.pt survives a kill during a save)
from . import binarized_data_checks  # noqa: F401  (empty or truncated .idx/.bin named clearly)
from . import checkpoint_compat  # noqa: F401  (lets torch>=2.6 load fairseq checkpoints)
from . import criterions, models, tasks  # noqa: F401  (register criterions, the model and --arch presets, tasks)
from . import distributed_cpu  # noqa: F401  (--ddp-backend pytorch_ddp on CPU processes)
from . import unreadable_checkpoints  # noqa: F401  (names the file torch cannot read)
