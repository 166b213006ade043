"""The plugin's checks before fairseq-train builds a model of one of its architectures.

fairseq's ``train.main`` imports the ``--user-dir`` and then calls ``add_defaults(cfg)`` with the run's
whole configuration, before anything is built. The plugin hooks that step (a module-level function,
not a wrapper of ``train.main``: ``torch.multiprocessing.spawn`` pickles ``train.main`` by name, and each
spawned worker imports the plugin inside it) so that the same checks run for ``fairseq-train``,
``fairseq-hydra-train`` and every worker of a multi-process run. For a plugin architecture, in order:

1. training flags that cannot train (:mod:`.training_flag_checks`);
2. ``--init-from-checkpoint`` beside another flag that loads weights, and a rerun of such a run that
   resumes from its own checkpoint (:mod:`.swap_resume`);
3. a missing ``--restore-file``, and the checkpoint's architecture carried into a fine-tuning
   command line (:mod:`.restore_architecture`);
4. the save-dir lock, on the first process of the run (:mod:`.save_dir_lock`).

Runs of other models are left exactly as fairseq runs them.
"""

import sys

import fairseq_cli.train
from fairseq.dataclass.initialize import add_defaults as fairseq_add_defaults
from fairseq.distributed import utils as distributed_utils

from .restore_architecture import prepare_training
from .save_dir_lock import lock_for_run
from .scope import enter_run
from .swap_resume import prepare_swap
from .training_flag_checks import check_training_flags


def before_training(cfg):
    """The plugin's checks of a fairseq-train config ``cfg`` of one of its architectures."""
    check_training_flags(cfg)
    prepare_swap(cfg)
    prepare_training(cfg, sys.argv[1:])
    if not cfg.checkpoint.no_save and distributed_utils.is_master(cfg.distributed_training):
        lock_for_run(cfg.checkpoint.save_dir)


def add_defaults(cfg):
    """fairseq's ``add_defaults``, then :func:`before_training` when the run is the plugin's."""
    fairseq_add_defaults(cfg)
    if enter_run(cfg):
        before_training(cfg)


fairseq_cli.train.add_defaults = add_defaults
