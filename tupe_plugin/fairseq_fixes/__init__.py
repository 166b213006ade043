"""Fixes to fairseq's own machinery that the plugin installs at import (checkpoints, data, CPU DDP)."""

from . import atomic_checkpoints  # noqa: F401  (checkpoint_last.pt survives a kill during a save)
from . import binarized_data_checks  # noqa: F401  (empty or truncated .idx/.bin named clearly)
from . import checkpoint_compat  # noqa: F401  (lets torch>=2.6 load fairseq checkpoints)
from . import checkpoint_integrity  # noqa: F401  (damaged checkpoint bytes refused, naming the file)
from . import distributed_cpu  # noqa: F401  (--ddp-backend pytorch_ddp on CPU processes)
from . import missing_restore_file  # noqa: F401  (a mistyped --restore-file stops the run)
from . import partial_checkpoint_cleanup  # noqa: F401  (a failed save removes its partial .tmp)
from . import save_dir_lock  # noqa: F401  (one run per --save-dir)
from . import skipped_data_check  # noqa: F401  (a run that would skip much of its data stops)
from . import training_flag_checks  # noqa: F401  (--fp16 on CPU, --tokens-per-sample 1, --mask-prob 0 or 1)
from . import unreadable_checkpoints  # noqa: F401  (names the file torch cannot read)
from . import quiet_output  # noqa: F401  (no hydra deprecation warnings, no 12 KB config dumps)
