"""Every checkpoint of a plugin architecture is checked against the CRC-32 that ``torch.save`` stored.

fairseq loads a checkpoint without looking at those checksums: a file damaged on disk or in a copy loads,
validates at a loss of thousands and fine-tunes without a word. After fairseq's ``load_checkpoint_to_cpu``
reads a checkpoint whose config names one of the plugin's architectures, its bytes are verified
(:func:`~tupe_plugin.fairseq_fixes.checkpoint_integrity.verify_checkpoint`, about a second per GB, once per
file version). Checkpoints of other models are left as fairseq reads them (their damaged bytes are named
only when the load itself fails).
"""

from fairseq import checkpoint_utils

from ..fairseq_fixes.checkpoint_integrity import verify_checkpoint
from .scope import is_plugin_config

_fairseq_load_checkpoint_to_cpu = checkpoint_utils.load_checkpoint_to_cpu


def load_checkpoint_to_cpu(path, *args, **kwargs):
    """fairseq's loader; a plugin checkpoint it read is then verified."""
    state = _fairseq_load_checkpoint_to_cpu(path, *args, **kwargs)
    if isinstance(state, dict) and is_plugin_config(state.get("cfg") or state.get("args")):
        verify_checkpoint(path)
    return state


checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
