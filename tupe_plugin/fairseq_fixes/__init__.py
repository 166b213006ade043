"""Fixes of fairseq bugs, safe for every model: installed when the plugin is imported, whatever the --arch.

docs/fairseq_patches.md lists each with what it changes, beside the plugin's own policies
(:mod:`tupe_plugin.policies`), which apply to the plugin's architectures only.
"""

from . import atomic_checkpoints  # noqa: F401  (checkpoint_last.pt survives a kill during a save)
from . import bf16_on_cuda  # noqa: F401  (--bf16 trains on a CUDA GPU, not on fairseq's TPU path)
from . import binarized_data_checks  # noqa: F401  (empty or truncated .idx/.bin named clearly)
from . import checkpoint_compat  # noqa: F401  (weights_only loading of every checkpoint; code refused)
from . import checkpoint_paths  # noqa: F401  (a --path / --finetune-from-model that is no file named)
from . import distributed_cpu  # noqa: F401  (--ddp-backend pytorch_ddp on CPU processes)
from . import known_warnings  # noqa: F401  (fairseq's and torch's known-harmless warnings, one list)
from . import model_overrides_syntax  # noqa: F401  (--model-overrides that is no dict refused as it is read)
from . import partial_checkpoint_cleanup  # noqa: F401  (a failed save removes its partial .tmp)
from . import process_group_teardown  # noqa: F401  (a worker's gloo group ends before the interpreter)
from . import remainder_batch  # noqa: F401  (the examples after the last multiple of 8 get a batch)
from . import token_block_sizes  # noqa: F401  (block sizes of whole lines beyond 65,535 tokens kept exact)
from . import unreadable_checkpoints  # noqa: F401  (names the checkpoint torch cannot read, and why)
