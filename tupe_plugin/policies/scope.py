"""Which fairseq runs the plugin's policies apply to: those whose model is one of the plugin's architectures.

A ``--user-dir`` is imported by every fairseq run that names it, also one that trains ``roberta_base`` or
a translation ``transformer``. The plugin's policies (save-dir lock, skipped-data check, flag checks, ...)
ask :func:`is_plugin_config` before they act; :func:`enter_run` records the kind of the fairseq run in
progress, for the one-line errors (:mod:`tupe_plugin.user_input.user_errors`).
"""

import argparse

MODEL_NAME = "tupe_roberta"

_run = {"plugin": None}


def is_plugin_arch(name):
    """True for ``tupe_roberta`` and every ``--arch`` preset registered over it."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    return name == MODEL_NAME or ARCH_MODEL_NAME_REGISTRY.get(name) == MODEL_NAME


def model_arch(model_cfg):
    """The architecture name of a model config: an argparse Namespace (``arch``), a DictConfig or dict
    (``_name``, as fairseq-hydra-train and checkpoints store it, or ``arch``); None when it has none."""
    if model_cfg is None:
        return None
    if isinstance(model_cfg, argparse.Namespace):
        return getattr(model_cfg, "arch", None)
    try:
        return model_cfg.get("_name") or model_cfg.get("arch")
    except AttributeError:
        return None


def is_plugin_config(cfg):
    """True when the fairseq config ``cfg`` (a run's or a checkpoint's: ``cfg.model`` or legacy ``args``)
    names one of the plugin's architectures."""
    if isinstance(cfg, argparse.Namespace):
        return is_plugin_arch(getattr(cfg, "arch", None))
    try:
        model = cfg.get("model") if cfg.get("model") is not None else cfg.get("args")
    except AttributeError:
        return False
    return is_plugin_arch(model_arch(model))


def enter_run(cfg):
    """Record that a fairseq run of config ``cfg`` starts in this process; True when it is the plugin's."""
    _run["plugin"] = is_plugin_config(cfg)
    return _run["plugin"]


def in_other_models_run():
    """True while this process runs fairseq for a model that is not one of the plugin's."""
    return _run["plugin"] is False
