"""The plugin's own policies: active only in runs (and for checkpoints) of the plugin's architectures.

Each module names what it changes; docs/fairseq_patches.md lists them beside the fixes of
:mod:`tupe_plugin.fairseq_fixes`, which apply to every model.
"""

from . import checkpoint_crc  # noqa: F401  (a plugin checkpoint's bytes checked against torch.save's CRCs)
from . import config_summary  # noqa: F401  (a one-line configuration summary instead of a 12 KB dump)
from . import model_overrides  # noqa: F401  (overrides of a checkpoint's settings that could not take effect)
from . import skipped_data_check  # noqa: F401  (a run that would skip > 1% of its tokens stops)
from . import training_run  # noqa: F401  (flag checks, --restore-file, architecture carry, save-dir lock)
