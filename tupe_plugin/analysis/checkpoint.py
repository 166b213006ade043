"""Load any plugin checkpoint (pre-trained or fine-tuned) for analysis, with fairseq's own loader."""

import os

from fairseq import checkpoint_utils, tasks

from ..fairseq_fixes.checkpoint_paths import check_checkpoint_file
from ..models import TupeRobertaModel
from ..user_input.path_checks import path_problem
from ..user_input.user_errors import UserError


class CheckpointError(UserError, ValueError):
    """A checkpoint or data directory the analysis cannot use; the message says how to fix it."""


def load_checkpoint(path, data=None):
    """(model in eval mode, source dictionary, arch name) of a plugin checkpoint.

    ``data`` replaces the data directory stored in the checkpoint (it must hold the task's
    dictionary, e.g. dict.txt of fairseq-preprocess).
    """
    check_checkpoint_file(path, "--path", CheckpointError)
    overrides = {"data": os.path.abspath(data)} if data else {}
    if data and (problem := path_problem(data, "folder")):
        raise CheckpointError(f"--data {data}: {problem}")
    state = checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides=overrides)
    cfg = state["cfg"]
    if cfg is None or cfg.model is None:
        raise CheckpointError(f"--path {path}: not a fairseq checkpoint with a model config")
    try:
        task = tasks.setup_task(cfg.task)
    except FileNotFoundError as error:
        raise CheckpointError(
            f"the checkpoint's task cannot load its dictionary from {cfg.task.data!r} ({error}); "
            "pass --data DIR, the data-bin directory the model was trained on"
        ) from error
    model = task.build_model(cfg.model)
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", "?")
    if not isinstance(model, TupeRobertaModel):
        raise CheckpointError(f"--path {path}: arch {arch} is not a tupe_plugin architecture")
    model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    return model.eval(), task.source_dictionary, str(arch)
